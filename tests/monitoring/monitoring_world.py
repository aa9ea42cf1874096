"""What the dashboard and the alerts are checked against (and docs/monitoring.md's picture
drawn from): a real Prometheus scraping real `kubeinfer serve` processes under load, and the
operator's own exporter.

- `ns-a`, pod `tiny-serving`: the tiny model's int8 engine (`kubeinfer build` from
  `build_engine`, calibrated on standard normal samples), with an SLO, mirroring every
  request to a shadow candidate and to a quality watch's reference (both the fp32 engine,
  pod `tiny-reference`), slices by the `X-Tenant` header. Traffic of tenant `acme` is
  scaled far outside the calibration range, where int8 clips: its slice and its classes
  agree less with the reference, as in production when the inputs drift.
- `ns-b`, pod `tiny-orphan`: the same engine whose quality reference is a port nobody
  listens on, so the watch loses its samples.
- The operator's exporter (`kubeinfer.operator.telemetry.exporter`'s collector, over
  prometheus_client's HTTP server) serving a board of statuses the caller writes, scraped
  with honor_labels as the chart's PodMonitor does: no control plane runs here (the
  operator filling the board on one is
  `tests/operator/telemetry/test_operator_metrics_endpoint.py`).

Prometheus scrapes every `SCRAPE_INTERVAL`; `query` and `query_range` ask it.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.operator.telemetry.exporter import StatusBoard, board_registry
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from processes import wait_ready
from prometheus_client import start_http_server
from prometheus_harness import _launch, free_port, http_get
from waiting import wait_for

SCRAPE_INTERVAL = "500ms"
MODEL = "tiny"
SHIFT = 8.0
"""How far `acme`'s inputs are scaled: far outside the int8 engine's calibrated ranges."""
TENANTS = ("alpha", "beta", "acme")
OPERATOR_NAMESPACE = "kubeinfer-system"


@dataclass
class Process:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _serve(directory: Path, name: str, *flags: str) -> Process:
    port = free_port()
    log = directory / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "kubeinfer.cli", "serve", "--model-name", MODEL,
             "--host", "127.0.0.1", "--port", str(port), "--intra-op-threads", "1", *flags],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return Process(process, port, log)


def _wait_ready(*processes: Process, timeout: float = 60) -> None:
    for p in processes:
        wait_ready(functools.partial(_answers_ready, p.port), p.process, p.log.name, timeout,
                   output=p.log.read_text)  # fmt: skip


def _answers_ready(port: int) -> bool:
    return http_get(port, "/v2/health/ready", timeout=2)[0] == 200


def _target(url: str, version: str, digest: str) -> dict[str, Any]:
    return {"url": url, "modelName": MODEL, "candidateVersion": version,
            "candidateDigest": digest, "trafficPercent": 100,
            "policy": {"maxQueueSize": 256, "timeoutMilliseconds": 2000}}  # fmt: skip


def _mirror_file(directory: Path, name: str, content: dict[str, Any]) -> Path:
    path = directory / f"{name}-mirror.json"
    path.write_text(json.dumps(content))
    return path


def _post(port: int, x: np.ndarray, tenant: str) -> int:
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.ravel().tolist()}]}).encode()  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", f"/v2/models/{MODEL}/infer", body,
                           {"Content-Type": "application/json", "X-Tenant": tenant})  # fmt: skip
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


@dataclass
class World:
    directory: Path
    serving: Process
    orphan: Process
    reference: Process
    board: StatusBoard
    prometheus: subprocess.Popen[bytes]
    prometheus_port: int
    exporter_port: int
    statuses: list[int] = field(default_factory=list)

    @property
    def scrape_targets(self) -> int:
        return 4

    def load(self, requests: int, rows: int = 4, seed: int = 0, concurrency: int = 4,
             shifted_share: float = 1 / 3, orphan_every: int = 10) -> None:  # fmt: skip
        """`requests` requests of `rows` rows to the serving pod from `concurrency` clients,
        tenants in turn (`acme`'s shifted, unless `shifted_share` is 0), and one in
        `orphan_every` to the orphan too."""
        rng = np.random.default_rng(seed)
        work: list[tuple[int, np.ndarray, str]] = []
        for index in range(requests):
            x = rng.standard_normal((rows, 16)).astype(np.float32)
            tenant = TENANTS[index % len(TENANTS)]
            if tenant == "acme" and rng.random() < shifted_share * len(TENANTS):
                x = x * SHIFT
            work.append((self.serving.port, x, tenant))
            if orphan_every and index % orphan_every == 0:
                work.append((self.orphan.port, x, tenant))
        with ThreadPoolExecutor(concurrency) as pool:
            self.statuses.extend(pool.map(lambda item: _post(*item), work))

    def settle(self, timeout: float = 30) -> None:
        """Until the serving pod's mirrors have an outcome for every request they took
        (compared, dropped, failed or timed out): the counters stop moving."""
        last: list[dict[str, Any]] = []

        def settled() -> bool:
            quality = json.loads(http_get(self.serving.port, "/v2/quality")[1])
            shadow = json.loads(http_get(self.serving.port, "/v2/shadow")[1])
            last[:] = [quality["requests"], shadow]
            answered = quality["answered"]
            return sum(quality["requests"].values()) == sum(shadow["requests"].values()) == answered

        wait_for(settled, timeout, lambda: f"the mirrors to settle; still busy: {last}", every=0.1)

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": promql, **({"time": repr(at)} if at is not None else {})}
        return self._api("/api/v1/query", params)

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict]:
        params = {"query": promql, "start": repr(start), "end": repr(end), "step": repr(step)}
        return self._api("/api/v1/query_range", params)

    def _api(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        status, body = http_get(self.prometheus_port, f"{path}?{urllib.parse.urlencode(params)}")
        answer = json.loads(body)
        if status != 200 or answer.get("status") != "success":
            raise AssertionError(f"Prometheus refused {params['query']!r}: {body[:500]!r}")
        return list(answer["data"]["result"])

    def wait_for_scrape_after(self, wall_time: float, timeout: float = 20) -> None:
        """Until every target has a successful scrape that started after `wall_time`."""

        def scraped() -> bool:
            oldest = self.query("min(timestamp(up))")
            healthy = self.query("count(up == 1)")
            return bool(
                oldest
                and healthy
                and float(oldest[0]["value"][1]) > wall_time
                and int(float(healthy[0]["value"][1])) == self.scrape_targets
            )

        wait_for(scraped, timeout, f"a scrape of every target after {wall_time}", every=0.1)


def prometheus_config(world_ports: dict[str, tuple[str, int]], exporter_port: int) -> str:
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL},
            "scrape_configs": [
                {
                    "job_name": "kubeinfer",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{port}"],
                            "labels": {"namespace": namespace, "pod": pod},
                        }
                        for pod, (namespace, port) in world_ports.items()
                    ],
                },
                {
                    # As the chart's operator PodMonitor: the series' own namespace wins.
                    "job_name": "kubeinfer-operator",
                    "honor_labels": True,
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{exporter_port}"],
                            "labels": {
                                "namespace": OPERATOR_NAMESPACE,
                                "pod": "kubeinfer-operator-0",
                            },
                        }
                    ],
                },
            ],
        },
        sort_keys=False,
    )


@contextlib.contextmanager
def running_world(directory: Path, slo_milliseconds: float) -> Iterator[World]:
    """The processes, the exporter and Prometheus, ready; all stopped after the block."""
    model = build_tiny_mlp(directory / "tiny.onnx")
    calibration = write_demo_samples(model, directory / "calibration.npz", count=64)
    cache = directory / "cache"
    digests = {
        precision: build_engine(str(model), "onnxruntime", precision, cache,
                                calibration=str(calibration) if precision == "int8" else None,
                                max_batch_size=32).digest
        for precision in ("fp32", "int8")
    }  # fmt: skip
    reference = _serve(directory, "reference", "--engine", digests["fp32"], "--cache", str(cache))
    reference_url = f"http://127.0.0.1:{reference.port}"
    watched = _mirror_file(directory, "serving", {
        "target": _target(reference_url, "2", digests["fp32"]),
        "qualityWatch": {"reference": _target(reference_url, "1", digests["fp32"]),
                         "sliceHeader": "X-Tenant", "maxSlices": 4},
    })  # fmt: skip
    dead = f"http://127.0.0.1:{free_port()}"
    orphaned = _mirror_file(directory, "orphan", {
        "qualityWatch": {"reference": _target(dead, "1", digests["fp32"])},
    })  # fmt: skip
    config = directory / "serving-config.yaml"
    config.write_text(yaml.safe_dump({"sloP99LatencyMilliseconds": slo_milliseconds}))
    engine = ("--engine", digests["int8"], "--cache", str(cache))
    serving = _serve(directory, "serving", "--config", str(config), *engine,
                     "--mirror-target-file", str(watched),
                     "--mirror-poll-interval-milliseconds", "100")  # fmt: skip
    orphan = _serve(directory, "orphan", *engine, "--mirror-target-file", str(orphaned),
                    "--mirror-poll-interval-milliseconds", "100")  # fmt: skip
    board = StatusBoard()
    exporter_port = free_port()
    server, _ = start_http_server(exporter_port, addr="127.0.0.1", registry=board_registry(board))
    processes = (serving, orphan, reference)
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        _wait_ready(*processes)
        ports = {"tiny-serving": ("ns-a", serving.port), "tiny-orphan": ("ns-b", orphan.port),
                 "tiny-reference": ("ns-a", reference.port)}  # fmt: skip
        (directory / "prometheus").mkdir()
        prometheus_yml = directory / "prometheus" / "prometheus.yml"
        prometheus_yml.write_text(prometheus_config(ports, exporter_port))
        port = free_port()
        prometheus = _launch(prometheus_yml, port)
        yield World(directory, serving, orphan, reference, board, prometheus, port,
                    exporter_port)  # fmt: skip
    finally:
        if prometheus is not None:
            prometheus.send_signal(signal.SIGTERM)
            prometheus.wait(timeout=30)
        server.shutdown()
        server.server_close()
        for p in processes:
            p.stop()
