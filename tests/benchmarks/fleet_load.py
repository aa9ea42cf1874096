"""The simulated pods' metrics for `bench_fleet.py`'s autoscaler phase: a real Prometheus
(Debian's `/usr/bin/prometheus`) scraping one exporter that this process serves on
loopback, which exports, for every ready serving pod the API lists, the series a
runtime pod exports, labelled with the pod's `namespace` and `pod` (kept by Prometheus:
`honor_labels`), as Kubernetes discovery would label a real pod's.

The load is the benchmark's to choose: one object in `HOT_EVERY` carries `HOT_LOAD`
requests in progress per pod (above the autoscaler's target, so it scales up), the others
`COLD_LOAD` (below it). Every pod uses half its GPU's memory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubeinfer.cluster import control_plane
from kubeinfer.contract import metric_series as series

HOT_EVERY = 10
HOT_LOAD = 20.0
COLD_LOAD = 2.0
SCRAPE_SECONDS = 5
SERVING = "app.kubernetes.io/component=runtime,kubeinfer.io/role=serving"
INSTANCE = "app.kubernetes.io/instance"


def hot(owner: str) -> bool:
    """Whether `owner` (model-NNNNN) carries the high load."""
    return int(owner.rsplit("-", 1)[1]) % HOT_EVERY == 0


def exposition(pods: list[tuple[str, str, str]]) -> str:
    """The series of every (namespace, pod, owner)."""
    lines = [f"# TYPE {series.REQUESTS_IN_PROGRESS.name} gauge"]
    lines += [
        f'{series.REQUESTS_IN_PROGRESS.name}{{namespace="{ns}",pod="{pod}",model="{owner}"}} '
        f"{HOT_LOAD if hot(owner) else COLD_LOAD}"
        for ns, pod, owner in pods
    ]
    for metric, value in ((series.GPU_MEMORY_USED.name, 40), (series.GPU_MEMORY_TOTAL.name, 80)):
        lines.append(f"# TYPE {metric} gauge")
        lines += [f'{metric}{{namespace="{ns}",pod="{pod}",gpu="0"}} {value * 2**30}'
                  for ns, pod, _ in pods]  # fmt: skip
    return "\n".join(lines) + "\n"


class FleetLoad:
    """The exporter (pods refreshed from the API every scrape) and Prometheus."""

    def __init__(self, cluster: control_plane.Cluster, directory: Path) -> None:
        self.cluster = cluster
        self._text = exposition([])
        self._stop = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._refresh, daemon=True).start()
        self.port = control_plane.free_port()
        config = directory / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s"},
            "scrape_configs": [{
                "job_name": "fleet", "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{self.server.server_address[1]}"]}],
            }],
        }))  # fmt: skip
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        self.log = (directory / "prometheus.log").open("ab")
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not start: see {directory}/prometheus.log")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def queries_answered(self) -> float:
        """Requests Prometheus' query API answered, by its own counter."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("prometheus_http_requests_total{")
            and 'handler="/api/v1/query"' in line
        )  # fmt: skip

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        load = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = load._text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        return Handler

    def _refresh(self) -> None:
        while not self._stop.wait(SCRAPE_SECONDS):
            status, body = self.cluster.get(f"/api/v1/pods?labelSelector={SERVING}", timeout=60)
            if status != 200:
                continue
            pods = [
                (p["metadata"]["namespace"], p["metadata"]["name"],
                 p["metadata"]["labels"].get(INSTANCE, ""))
                for p in json.loads(body)["items"]
                if any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (p.get("status") or {}).get("conditions") or [])
            ]  # fmt: skip
            self._text = exposition(pods)

    def stop(self) -> None:
        self._stop.set()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        self.server.shutdown()
        self.server.server_close()
