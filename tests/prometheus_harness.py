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
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

SCRAPE_INTERVAL = "500ms"
JOB = "kubeinfer"


def require_prometheus() -> str:
    """The prometheus binary; skips the test without one, or fails it when CI=true."""
    binary = shutil.which("prometheus")
    if binary is None:
        message = "prometheus is not installed (apt-get install prometheus; `make test` tries)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: CI must run the real-Prometheus tests", pytrace=False)
        pytest.skip(message)
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(port: int, path: str, timeout: float = 10) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _stop(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _output(process: subprocess.Popen[bytes], log: Path | None) -> str:
    if log is not None:
        return log.read_text(errors="replace")
    return process.stdout.read().decode(errors="replace") if process.stdout else ""


def _wait_until(
    ready: Any, process: subprocess.Popen[bytes], what: str, timeout: float, log: Path | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = _output(process, log)
            raise AssertionError(f"{what} exited with {process.returncode}: {output[-2000:]}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.05)
    _stop(process)
    raise AssertionError(f"{what} was not ready within {timeout:g} s")


@dataclass(eq=False)
class RuntimeProcess:
    """A `kubeinfer serve` subprocess on a loopback port (hashable: one per process)."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> int:
        return _stop(self.process)


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
        [sys.executable, "-m", "kubeinfer.operator.cli", "serve", "--onnx", str(model),
         "--model-name", model_name, "--host", "127.0.0.1", "--port", str(port), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    _wait_until(
        lambda: http_get(port, "/v2/health/ready", timeout=2)[0] == 200,
        process, f"kubeinfer serve on port {port}", 60,
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            oldest = self.query(f'min(timestamp(up{{job="{JOB}"}}))')
            healthy = self.query(f'count(up{{job="{JOB}"}} == 1)')
            if (
                oldest
                and healthy
                and float(oldest[0]["value"][1]) > wall_time
                and int(float(healthy[0]["value"][1])) == len(self.targets)
            ):
                return
            time.sleep(0.1)
        raise AssertionError(f"no scrape of every target after {wall_time} within {timeout} s")

    def stop(self) -> int:
        return _stop(self.process)

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


def _launch(config: Path, port: int) -> subprocess.Popen[bytes]:
    """Prometheus with `config`, its TSDB and log beside it, on `port`, once ready."""
    binary = require_prometheus()
    directory = config.parent
    log = directory / "prometheus.log"
    with log.open("ab") as output:  # a file, not a pipe nobody reads while tests run
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    ready = lambda: http_get(port, "/-/ready", 2)[0] == 200  # noqa: E731
    _wait_until(ready, process, "prometheus", 30, log)
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
