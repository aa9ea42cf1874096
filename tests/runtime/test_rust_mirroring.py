"""Mirroring on the Rust data plane, between real `kubeinfer serve` processes on loopback:
a serving with a mirror target file, and as its candidate a second
`kubeinfer serve` of the same model. Covers:

- every request answered 200 is compared with the candidate's answer (the same model:
  no difference), each one reached the candidate, and `/v2/shadow` and the serving's
  `/metrics` (the Rust server's registry) say the same;
- the Rust server samples exactly the target's share of the requests answered 200;
- the quality watch's reference is mirrored to as well (`/v2/quality`, role `quality`);
- mirroring on, the server still takes the GIL once per batch: the `gil_crossings` its
  stop logs are its slot's one at start plus one per batch `/metrics` counted.

The mirroring end to end (test_shadow_e2e.py, test_quality_e2e.py) is tested there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import processes
import pytest
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families
from serve_process import LoopbackHttp
from waiting import wait_for

pytestmark = pytest.mark.slow

HOST = "127.0.0.1"
BODY = json.dumps(
    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 16], "data": [0.25] * 32}]}
).encode()


@dataclass
class Served(LoopbackHttp):
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def infer(self, headers: dict[str, str] | None = None) -> None:
        assert self.request("POST", "/v2/models/tiny/infer", BODY, headers)[0] == 200

    def get(self, path: str) -> dict:
        status, _, body = self.request("GET", path)
        assert status == 200
        return json.loads(body)

    def samples(self) -> dict[tuple, float]:
        _, _, body = self.request("GET", "/metrics")
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode())
            for s in f.samples
        }


def serve(root: Path, name: str, model: Path, *flags: str) -> Served:
    port = free_port()
    command = [sys.executable, "-m", "kubeinfer.cli", "serve", "--onnx", str(model),
               "--model-name", "tiny", "--host", HOST, "--port", str(port),
               "--intra-op-threads", "1", *flags]  # fmt: skip
    log = root / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    served = Served(process, port, log)
    processes.wait_ready(
        lambda: served.request("GET", "/v2/health/ready")[0] == 200,
        process, log.name, output=log.read_text,
    )  # fmt: skip
    return served


@dataclass
class World:
    root: Path
    model: Path
    candidate: Served
    mirror_file: Path

    def serving(self, name: str) -> Served:
        return serve(self.root, name, self.model,
                     "--mirror-target-file", str(self.mirror_file),
                     "--mirror-poll-interval-milliseconds", "100",
                     "--execution-slots", "1", "--max-queue-delay-microseconds", "0")  # fmt: skip

    def target(self, percent: int, digest: str, *, watch: bool = False) -> None:
        target = {"url": self.candidate.url, "modelName": "tiny", "candidateVersion": "2",
                  "candidateDigest": digest, "trafficPercent": percent}  # fmt: skip
        content = {"qualityWatch": {"reference": target}} if watch else {"target": target}
        staging = self.mirror_file.with_suffix(".tmp")
        staging.write_text(json.dumps(content))
        os.replace(staging, self.mirror_file)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("rust-mirror")
    model = build_tiny_mlp(root / "tiny.onnx")
    mirror_file = root / "mirror" / "target.yaml"
    mirror_file.parent.mkdir()
    candidate = serve(root, "candidate", model)
    try:
        yield World(root, model, candidate, mirror_file)
    finally:
        assert processes.stop(candidate.process) == 0


def candidate_answered(world: World) -> float:
    return sum(v for (name, labels), v in world.candidate.samples().items()
               if name == "kubeinfer_requests_total" and ("code", "200") in labels)  # fmt: skip


def shown(serving: Served, path: str, digest: str, percent: int) -> bool:
    status = serving.get(path)
    if not status["active"]:
        return False
    if path == "/v2/quality":
        return status["reference"]["digest"] == digest and status["samplePercent"] == percent
    return status["candidate"]["digest"] == digest and status["trafficPercent"] == percent


def gil_crossings(log: Path) -> int:
    found = re.findall(r"gil_crossings=(\d+)", log.read_text())
    assert found, log.read_text()
    return int(found[-1])


def test_the_rust_plane_mirrors_to_a_real_candidate_and_exports_what_it_compared(world):
    digest = "sha256:" + "1" * 64
    world.target(100, digest)
    serving = world.serving("serving-shadow")
    try:
        wait_for(lambda: shown(serving, "/v2/shadow", digest, 100), what="the shadow shown")
        before = candidate_answered(world)
        for _ in range(12):
            serving.infer()
        status = wait_for(
            lambda: (s := serving.get("/v2/shadow"))["requests"]["compared"] >= 12 and s,
            what="12 compared requests",
        )
        assert status["requests"] == {"compared": 12, "dropped": 0, "candidateError": 0,
                                      "timeout": 0}  # fmt: skip
        assert candidate_answered(world) - before == 12  # each one reached the candidate
        assert status["mismatches"] == 0 and status["maxAbsDifference"] == 0.0
        assert status["top1"] == {"rows": 24, "agreements": 24, "agreement": 1.0}
        assert status["latency"]["servingP99Seconds"] > 0

        samples = serving.samples()
        labels = {"model": "tiny", "serving_version": "1", "candidate_version": "2",
                  "candidate_digest": digest, "role": "shadow"}  # fmt: skip

        def value(name: str, **extra: str) -> float:
            return samples[(name, tuple(sorted({**labels, **extra}.items())))]

        assert value("kubeinfer_shadow_requests_total", outcome="compared") == 12
        assert value("kubeinfer_shadow_requests_total", outcome="dropped") == 0
        assert value("kubeinfer_shadow_top1_rows_total") == 24
        assert value("kubeinfer_shadow_max_abs_difference") == 0.0
        assert value("kubeinfer_shadow_serving_duration_seconds_count") == 12

        # Another share: the Rust server samples exactly it, the figures from zero.
        other = "sha256:" + "2" * 64
        world.target(25, other)
        wait_for(lambda: shown(serving, "/v2/shadow", other, 25), what="the 25 % shadow")
        for _ in range(40):
            serving.infer()
        wait_for(lambda: serving.get("/v2/shadow")["requests"]["compared"] >= 10,
                 what="10 compared requests")  # fmt: skip
        assert serving.get("/v2/shadow")["requests"]["compared"] == 10  # 25 % of 40
        samples = serving.samples()
        old = ("kubeinfer_shadow_requests_total",
               tuple(sorted({**labels, "outcome": "compared"}.items())))  # fmt: skip
        assert old not in samples, "the old candidate's series are gone"
    finally:
        assert processes.stop(serving.process) == 0


def test_a_quality_watch_is_mirrored_with_its_role(world):
    digest = "sha256:" + "3" * 64
    world.target(100, digest, watch=True)
    serving = world.serving("serving-quality")
    try:
        wait_for(lambda: shown(serving, "/v2/quality", digest, 100), what="the watch shown")
        assert serving.get("/v2/shadow")["active"] is False
        for _ in range(6):
            serving.infer()
        wait_for(lambda: serving.get("/v2/quality")["requests"]["compared"] >= 6,
                 what="6 compared requests")  # fmt: skip
        samples = serving.samples()
        compared = [
            v
            for (name, labels), v in samples.items()
            if name == "kubeinfer_shadow_requests_total"
            and ("role", "quality") in labels
            and ("outcome", "compared") in labels
        ]
        assert compared == [6]
        assert serving.get("/v2/quality")["answered"] == 6  # counted by the Rust server
        status, _, body = serving.request("GET", "/v2/quality/exemplars")
        assert status == 200 and body[:2] == b"PK"  # an .npz
    finally:
        assert processes.stop(serving.process) == 0


def test_mirroring_takes_no_gil_crossing_of_its_own(world):
    world.target(100, "sha256:" + "4" * 64)
    serving = world.serving("serving-crossings")
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: processes.stop(serving.process))
        wait_for(lambda: serving.get("/v2/shadow")["active"], what="the shadow shown")
        for _ in range(20):
            serving.infer()
        wait_for(lambda: serving.get("/v2/shadow")["requests"]["compared"] >= 20,
                 what="20 compared requests")  # fmt: skip
        batches = sum(v for (name, _), v in serving.samples().items()
                      if name == "kubeinfer_batch_size_count")  # fmt: skip
        assert batches >= 20
    assert gil_crossings(serving.log) == 1 + batches  # the slot made at start, then a batch each
