"""A real Prometheus and real `kubeinfer serve` processes for tests, on loopback.

Prometheus is Debian's `prometheus` package (`/usr/bin/prometheus`; `make test` installs
it when it can). Without it the tests that need it skip, except under `CI=true`, where
they fail: CI must run them.

Use it from a test module (tests/ is on the import path), typically once per module:

    from prometheus_harness import ScrapeTarget, running_prometheus, start_runtime

    @pytest.fixture(scope="module")
    def prometheus(tmp_path_factory, runtime):
        pod = "demo-runtime-7d9f8c6b5-x2x4z"
        targets = [ScrapeTarget(runtime.address, namespace="default", pod=pod)]
        with running_prometheus(targets, tmp_path_factory.mktemp("prometheus")) as server:
            yield server

Each target is a real process's host:port, labelled with the `namespace` and `pod` it
stands for, as Kubernetes service discovery labels a pod's series; the same process may
stand for several pods. Prometheus scrapes every `SCRAPE_INTERVAL` (the shortest it is
comfortable with), keeps its TSDB in the given directory, and is stopped (SIGTERM, then
SIGKILL) when the block exits. `PrometheusServer.wait_for_scrape_after(t)` waits until
every target has been scraped after wall time t (e.g. when the load stopped), so a query
then sees everything the processes counted; `reload(targets)` replaces the targets while
it runs (a pod replaced by another); `stop()` then `start()` is an outage of Prometheus,
which comes back at the same URL with what it had stored.

Against a real API server (the session's `local_cluster`),
`running_prometheus_with_kubernetes_sd` starts one that finds the pods itself, as a
cluster's Prometheus does: Kubernetes service discovery of one namespace's pods, as a
ServiceAccount, keeping those with the `prometheus.io/*` annotations the operator renders.
Debian's Prometheus has no Kubernetes discovery: that one is upstream's, built once per
machine from its Go module (`require_prometheus_with_kubernetes_sd`).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from kubeinfer.cluster import binaries
from ports import free_port
from processes import stop, wait_ready
from required_tools import require_tool
from waiting import wait_for

SCRAPE_INTERVAL = "500ms"
JOB = "kubeinfer"


def require_prometheus() -> str:
    """The prometheus binary; skips the test without one, or fails it when CI=true."""
    return require_tool(
        "prometheus",
        "prometheus is not installed (apt-get install prometheus; `make test` tries)",
        "the real-Prometheus tests",
    )


def http_get(port: int, path: str, timeout: float = 10) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _output(process: subprocess.Popen[bytes], log: Path | None) -> str:
    if log is not None:
        return log.read_text(errors="replace")
    return process.stdout.read().decode(errors="replace") if process.stdout else ""


@dataclass(eq=False)
class RuntimeProcess:
    """A `kubeinfer serve` subprocess on a loopback port (hashable: one per process)."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> int:
        return stop(self.process)


def infer(port: int, model_name: str, rows: int, seed: int, size: int = 16) -> int:
    """One JSON v2 inference request of `rows` random rows; returns the HTTP status."""
    data = np.random.default_rng(seed).standard_normal((rows, size)).astype(np.float32)
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [rows, size], "datatype": "FP32",
                     "data": data.ravel().tolist()}]}
    ).encode()  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST", f"/v2/models/{model_name}/infer", body, {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def pod_object(name: str, port: int, *, ready: bool = True, ip: str | None = "127.0.0.1") -> dict:
    """A Pod as the API lists it, standing for a process on loopback `port`: the shape the
    direct read resolves (Ready condition, podIP, the container port named http)."""
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip is not None:
        status["podIP"] = ip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "runtime", "ports": [{"name": "http", "containerPort": port}]}]
        },
        "status": status,
    }


def start_runtime(model: Path, model_name: str, *flags: str) -> RuntimeProcess:
    """`kubeinfer serve --onnx model` on a free loopback port, once it is ready."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "kubeinfer.cli", "serve", "--onnx", str(model),
         "--model-name", model_name, "--host", "127.0.0.1", "--port", str(port), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    wait_ready(
        lambda: http_get(port, "/v2/health/ready", timeout=2)[0] == 200,
        process, f"kubeinfer serve on port {port}", 60, lambda: _output(process, None),
    )  # fmt: skip
    return RuntimeProcess(process, port)


@dataclass(frozen=True)
class ScrapeTarget:
    """A host:port Prometheus scrapes, and the pod it stands for."""

    address: str
    namespace: str
    pod: str


@dataclass
class PrometheusServer:
    """A running Prometheus; `url` is its base URL."""

    process: subprocess.Popen[bytes]
    port: int
    targets: tuple[ScrapeTarget, ...]
    config: Path
    interval: str = SCRAPE_INTERVAL

    def reload(self, targets: Sequence[ScrapeTarget]) -> None:
        """Scrapes `targets` from now on (pods come and go): the config is rewritten and
        Prometheus told by SIGHUP. A dropped target's series go stale; follow with
        `wait_for_scrape_after` to know the new set is scraped."""
        self.config.write_text(prometheus_config(targets, self.interval))
        self.targets = tuple(targets)
        self.process.send_signal(signal.SIGHUP)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (raises on an error answer)."""
        params = {"query": promql, **({"time": repr(at)} if at is not None else {})}
        status, body = http_get(self.port, "/api/v1/query?" + urllib.parse.urlencode(params))
        answer = json.loads(body)
        if status != 200 or answer.get("status") != "success":
            raise AssertionError(f"Prometheus refused {promql!r}: {body[:500]!r}")
        return list(answer["data"]["result"])

    def wait_for_scrape_after(self, wall_time: float, timeout: float = 20) -> None:
        """Until every target has a successful scrape that started after `wall_time`
        (Unix seconds, as Prometheus stamps its samples)."""

        def scraped() -> bool:
            oldest = self.query(f'min(timestamp(up{{job="{JOB}"}}))')
            healthy = self.query(f'count(up{{job="{JOB}"}} == 1)')
            return bool(
                oldest
                and healthy
                and float(oldest[0]["value"][1]) > wall_time
                and int(float(healthy[0]["value"][1])) == len(self.targets)
            )

        wait_for(scraped, timeout, f"a scrape of every target after {wall_time}", every=0.1)

    def stop(self) -> int:
        return stop(self.process)

    def start(self) -> None:
        """Starts it again after `stop()`, on the same port with the same TSDB (an outage
        ends): what it stored is there at once; its first new scrapes take a few seconds
        (Prometheus applies targets on a 5 s tick)."""
        if self.process.poll() is None:
            raise AssertionError("Prometheus is still running")
        self.process = _launch(self.config, self.port)


def prometheus_config(targets: Sequence[ScrapeTarget], interval: str = SCRAPE_INTERVAL) -> str:
    """The scrape configuration: one static group per target, labelled as its pod."""
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": interval, "scrape_timeout": interval},
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "static_configs": [
                        {
                            "targets": [target.address],
                            "labels": {"namespace": target.namespace, "pod": target.pod},
                        }
                        for target in targets
                    ],
                }
            ],
        },
        sort_keys=False,
    )


def _launch(config: Path, port: int, binary: str | None = None) -> subprocess.Popen[bytes]:
    """Prometheus (`binary`, Debian's by default) with `config`, its TSDB and log beside it,
    on `port`, once ready."""
    binary = binary or require_prometheus()
    directory = config.parent
    log = directory / "prometheus.log"
    with log.open("ab") as output:  # a file, not a pipe nobody reads while tests run
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    ready = lambda: http_get(port, "/-/ready", 2)[0] == 200  # noqa: E731
    wait_ready(ready, process, "prometheus", 30, lambda: _output(process, log))
    return process


@contextmanager
def running_prometheus(
    targets: Sequence[ScrapeTarget], directory: Path, interval: str = SCRAPE_INTERVAL
) -> Iterator[PrometheusServer]:
    """A Prometheus scraping `targets`, ready (`/-/ready`) when the block starts, stopped
    when it ends; its config and TSDB live in `directory`."""
    require_prometheus()
    config = directory / "prometheus.yml"
    config.write_text(prometheus_config(targets, interval))
    port = free_port()
    server = PrometheusServer(_launch(config, port), port, tuple(targets), config, interval)
    try:
        yield server
    finally:
        server.stop()


# -- Kubernetes service discovery ------------------------------------------------------------
# Prometheus as it runs in a cluster: it finds the pods itself, from the API server, instead
# of being handed addresses. The static API above stays for tests without a cluster.
#
# Debian builds its package without Kubernetes service discovery (its NEWS: "Kubernetes
# support has been completely removed, due to the insane amount of dependencies in their
# client library"; the config field is refused as unknown), so this one is upstream's
# Prometheus built from its Go module, as the control plane is, with only that discovery
# compiled in, and cached per machine (`kubeinfer.cluster.binaries.ensure_prometheus`, the
# build `kubeinfer up` uses too).


def require_prometheus_with_kubernetes_sd() -> str:
    """Upstream's prometheus with Kubernetes service discovery (built once per machine by
    `kubeinfer.cluster.binaries.ensure_prometheus`, which `make test` runs first); skips
    the test where it cannot be built, or fails it when CI=true, as `require_prometheus`
    does."""
    try:
        return str(binaries.ensure_prometheus())
    except binaries.BuildError as error:
        message = f"no Prometheus with Kubernetes service discovery: {error}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}\nCI must run the real-Prometheus tests", pytrace=False)
        pytest.skip(message)


DISCOVERY_JOB = "kubernetes-pods"
"""The job's name, as the prometheus-community chart names its annotation-driven job."""


def kubernetes_sd_config(
    server: str,
    ca_file: Path,
    token_file: Path,
    namespace: str,
    interval: str = SCRAPE_INTERVAL,
) -> str:
    """The scrape configuration of a cluster's Prometheus without the prometheus-operator:
    Kubernetes service discovery (role pod) of one namespace's pods, as a ServiceAccount
    (its token in `token_file`, the API server's CA in `ca_file`), keeping the pods whose
    `prometheus.io/scrape` annotation is "true", at the port and path their
    `prometheus.io/port` and `prometheus.io/path` annotations name, labelled `namespace`
    and `pod` as the operator's queries select (the chart's `kubernetes-pods` job).

    One namespace only: the account's Role grants pods there, and Prometheus lists and
    watches cluster-wide otherwise, which the API server would refuse."""
    annotation = "__meta_kubernetes_pod_annotation_prometheus_io_"
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": interval, "scrape_timeout": interval},
            "scrape_configs": [
                {
                    "job_name": DISCOVERY_JOB,
                    "kubernetes_sd_configs": [
                        {
                            "role": "pod",
                            "api_server": server,
                            "namespaces": {"names": [namespace]},
                            "tls_config": {"ca_file": str(ca_file)},
                            "authorization": {"credentials_file": str(token_file)},
                        }
                    ],
                    "relabel_configs": [
                        {
                            "source_labels": [f"{annotation}scrape"],
                            "action": "keep",
                            "regex": "true",
                        },
                        # A pod that has finished (or not started) has nothing to scrape.
                        {
                            "source_labels": ["__meta_kubernetes_pod_phase"],
                            "action": "keep",
                            "regex": "Running",
                        },
                        {
                            "source_labels": [f"{annotation}path"],
                            "regex": "(.+)",
                            "target_label": "__metrics_path__",
                        },
                        # Discovery makes one target per declared container port: the
                        # annotation's port replaces it, so every target of a pod is the
                        # same address and Prometheus keeps one of them.
                        {
                            "source_labels": ["__meta_kubernetes_pod_ip", f"{annotation}port"],
                            "regex": r"(.+);(\d+)",
                            "replacement": "$1:$2",
                            "target_label": "__address__",
                        },
                        {
                            "source_labels": ["__meta_kubernetes_namespace"],
                            "target_label": "namespace",
                        },
                        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                    ],
                }
            ],
        },
        sort_keys=False,
    )


@dataclass
class DiscoveringPrometheus(PrometheusServer):
    """A running Prometheus that finds its targets by Kubernetes service discovery: they
    follow the pods by themselves, so there is nothing to `reload`. `stop()` and `start()`
    are an outage, as for `PrometheusServer`; after `start()` discovery lists the pods
    again."""

    binary: str = ""
    """Upstream's Prometheus (`require_prometheus_with_kubernetes_sd`)."""

    def reload(self, targets: Sequence[ScrapeTarget]) -> None:
        raise TypeError("service discovery chooses the targets: there is nothing to reload")

    def start(self) -> None:
        if self.process.poll() is None:
            raise AssertionError("Prometheus is still running")
        self.process = _launch(self.config, self.port, self.binary)

    def wait_for_scrape_after(self, wall_time: float, timeout: float = 20) -> None:
        """Until every pod discovery has found has a successful scrape that started after
        `wall_time` (Unix seconds)."""

        def scraped() -> bool:
            found = len(self.scraped_pods())
            oldest = self.query(f'min(timestamp(up{{job="{DISCOVERY_JOB}"}}))')
            healthy = self.query(f'count(up{{job="{DISCOVERY_JOB}"}} == 1)')
            return bool(
                found
                and oldest
                and healthy
                and float(oldest[0]["value"][1]) > wall_time
                and int(float(healthy[0]["value"][1])) == found
            )

        wait_for(scraped, timeout, f"a scrape of every pod after {wall_time}", every=0.1)

    def scraped_pods(self) -> dict[str, str]:
        """The pods discovery found, by name (its `pod` label), each with its last scrape's
        health ("up", "down" or "unknown" before the first scrape)."""
        status, body = http_get(self.port, "/api/v1/targets?state=active")
        answer = json.loads(body)
        if status != 200 or answer.get("status") != "success":
            raise AssertionError(f"Prometheus refused the targets query: {body[:500]!r}")
        return {
            target["labels"]["pod"]: target["health"]
            for target in answer["data"]["activeTargets"]
            if target["labels"].get("job") == DISCOVERY_JOB
        }


@contextmanager
def running_prometheus_with_kubernetes_sd(
    directory: Path,
    *,
    server: str,
    ca_file: Path,
    token: str,
    namespace: str,
    interval: str = SCRAPE_INTERVAL,
) -> Iterator[DiscoveringPrometheus]:
    """A Prometheus discovering the annotated pods of `namespace` from the API server at
    `server` (see `kubernetes_sd_config`), authenticated by a bearer `token` (a
    ServiceAccount's with get, list and watch on pods there); ready (`/-/ready`) when the
    block starts, stopped when it ends. Its config, token file and TSDB live in
    `directory`. Discovery applies what it finds on Prometheus' 5 s tick: a new pod's
    first scrape comes up to about 5 s after the pod is Running."""
    binary = require_prometheus_with_kubernetes_sd()
    token_file = directory / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    config = directory / "prometheus.yml"
    config.write_text(kubernetes_sd_config(server, ca_file, token_file, namespace, interval))
    port = free_port()
    prometheus = DiscoveringPrometheus(
        _launch(config, port, binary), port, (), config, interval, binary
    )
    try:
        yield prometheus
    finally:
        prometheus.stop()
