"""The quality watch between real `kubeinfer serve` processes on loopback.

The serving runtime serves the tiny demo model's int8 engine (calibrated on 64 standard
normal samples, built with `build_engine`) with `--mirror-target-file`; its reference is
the same model's fp32 engine in a runtime of its own; a scripted server answering too
late and a port nobody listens on stand in for a slow and a dead reference. Covers:

- at 5 % sampling over in-distribution traffic: the effective sample rate is 5 %, top-1
  agreement is high, the series carry role="quality" and agree with /v2/quality; a shadow
  mirrored to the same engine at once keeps its own figures under role="shadow";
- one class's inputs shifted away from the calibration data (scaled by 6, which the int8
  engine's calibrated ranges clip): that class's agreement falls clearly below the other
  classes' while the overall stays high, and the exemplars are mostly those inputs;
- slices by a request header: one slice's traffic shifted, only that slice's agreement
  falls; a flood of distinct (and hostile) header values stays within maxSlices + other,
  and /metrics still parses;
- a slow and a dead reference cost the serving nothing it waits on: with every mirrored
  request held by a reference that never answers during the test, all the serving's
  requests are answered 200 while none of the mirror's has an outcome (the serving never
  awaits the reference), the excess dropped at the mirror's bounded queue; with a short
  timeout the held ones are then counted as timeouts, and a dead reference's as errors.
  (What it costs in latency is a benchmark's figure:
  `bench_quality_watch.py --broken-references`.)

Agreement figures depend on the CPU (with or without VNNI the int8 kernels round
differently), so the assertions are relations between groups, never exact figures.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from ports import free_port
from test_shadow_e2e import SLOW_CANDIDATE, Process, launch, serve, wait_ready
from waiting import wait_for

pytestmark = pytest.mark.slow

POLL_MS = 100
SHIFT = 6.0  # far outside the calibration's range (standard normal)
SHIFTED_NORM = 12.0  # shifted rows have a norm near 24, in-distribution ones near 4


@dataclass
class Watched:
    serving: Process
    reference: Process
    slow: Process
    mirror_file: Path
    digests: dict[str, str]
    session: ort.InferenceSession

    def quality(self) -> dict:
        status, _, body = self.serving.request("GET", "/v2/quality")
        assert status == 200
        return json.loads(body)

    def fp32_classes(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"input": x})[0].argmax(axis=1)


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    root = tmp_path_factory.mktemp("quality")
    model = build_tiny_mlp(root / "tiny.onnx")
    calibration = write_demo_samples(model, root / "calibration.npz", count=64)
    cache = root / "cache"
    digests = {
        precision: build_engine(str(model), "onnxruntime", precision, cache,
                                calibration=str(calibration) if precision == "int8" else None,
                                max_batch_size=32).digest
        for precision in ("fp32", "int8")
    }  # fmt: skip
    mirror_file = root / "mirror" / "mirror.json"
    mirror_file.parent.mkdir()
    slow_port = free_port()
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    codes: list[int] = []
    with contextlib.ExitStack() as stack:  # each process stopped, whatever fails
        processes = []
        for start in (
            lambda: serve(root, "serving", "--engine", digests["int8"], "--cache", str(cache),
                          "--mirror-target-file", str(mirror_file),
                          "--mirror-poll-interval-milliseconds", str(POLL_MS)),
            lambda: serve(root, "reference", "--engine", digests["fp32"], "--cache", str(cache)),
            # A reference that holds every request for far longer than the tests run.
            lambda: launch([sys.executable, "-c", SLOW_CANDIDATE, str(slow_port), "3600"],
                           slow_port, root / "slow.log"),
        ):  # fmt: skip
            process = start()
            stack.callback(lambda process=process: codes.append(process.stop()))
            processes.append(process)
        wait_ready(*processes)
        yield Watched(*processes, mirror_file, digests, session)
    assert codes[1:] == [0, 0]  # the reference and the serving (stopped last first)
    assert "Traceback" not in processes[0].log.read_text()


def reference_target(to: Process, digest: str, percent: int, **policy: int) -> dict:
    return {"url": to.url, "modelName": "tiny", "candidateVersion": "1",
            "candidateDigest": digest, "trafficPercent": percent, "policy": policy}  # fmt: skip


def write_mirror_file(watched: Watched, content: dict | None) -> None:
    staging = watched.mirror_file.with_suffix(".tmp")
    staging.write_text("" if content is None else json.dumps(content))
    os.replace(staging, watched.mirror_file)


def start_watch(
    watched: Watched, watch: dict, target: dict | None = None, digest: str | None = None
) -> None:
    """Turns mirroring off, then on with `watch` (and a shadow `target`), from zero."""
    write_mirror_file(watched, None)
    wait_for(lambda: not watched.quality()["active"])
    write_mirror_file(watched, {"qualityWatch": watch, "target": target})
    digest = digest or watch["reference"]["candidateDigest"]
    wait_for(lambda: (watched.quality()["reference"] or {}).get("digest") == digest)


def post(watched: Watched, x: np.ndarray, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.ravel().tolist()}]}).encode()  # fmt: skip
    status, _, answer = watched.serving.request(
        "POST", "/v2/models/tiny/infer", body, headers or {}
    )
    assert status == 200, answer


def send_all(watched: Watched, requests: list[tuple[np.ndarray, dict[str, str]]]) -> None:
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda item: post(watched, *item), requests))


def quality_samples(watched: Watched) -> list:
    return [s for s in watched.serving.metrics() if s.name.startswith("kubeinfer_shadow")]


def in_distribution(watched: Watched, rows: int, seed: int, avoid: int | None = None):
    x = np.random.default_rng(seed).standard_normal((rows * 3, 16)).astype(np.float32)
    if avoid is not None:
        x = x[watched.fp32_classes(x) != avoid]
    return x[:rows]


def shifted_of_class(watched: Watched, rows: int, seed: int) -> tuple[int, np.ndarray]:
    """`rows` shifted inputs whose fp32 top-1 class is the commonest class of shifted
    inputs (so the test needs few draws), and that class."""
    x = np.random.default_rng(seed).standard_normal((rows * 20, 16)).astype(np.float32) * SHIFT
    classes = watched.fp32_classes(x)
    chosen = int(np.bincount(classes).argmax())
    picked = x[classes == chosen][:rows]
    assert len(picked) == rows
    return chosen, picked


def batches(x: np.ndarray, size: int, headers: dict[str, str] | None = None):
    return [(x[i : i + size], headers or {}) for i in range(0, len(x), size)]


def test_five_percent_of_in_distribution_traffic_agrees_and_is_labelled_quality(watched):
    reference = watched.reference
    watch = {"reference": reference_target(reference, watched.digests["fp32"], 5)}
    shadow = reference_target(reference, watched.digests["fp32"], 10)
    start_watch(watched, watch, shadow)
    x = in_distribution(watched, 1600, seed=1)
    send_all(watched, batches(x, 4))  # 400 requests
    wait_for(lambda: watched.quality()["requests"]["compared"] == 20)
    status = watched.quality()
    assert status["answered"] == 400
    assert status["effectiveSampleRate"] == pytest.approx(0.05)
    assert status["samplePercent"] == 5 and status["mismatches"] == 0
    assert status["top1"]["rows"] == 80
    assert status["top1"]["agreement"] >= 0.8  # int8 against fp32, in distribution
    assert 0 < status["meanKlDivergence"] < 0.1
    assert sum(c["rows"] for c in status["classes"]) == 80
    assert status["slices"] == [] and status["sliceHeader"] is None

    shadow_status = json.loads(watched.serving.request("GET", "/v2/shadow")[2])
    wait_for(lambda: json.loads(watched.serving.request("GET", "/v2/shadow")[2])["requests"][
        "compared"] == 40)  # fmt: skip
    assert shadow_status["candidate"]["digest"] == watched.digests["fp32"]

    samples = quality_samples(watched)
    roles = {s.labels["role"] for s in samples}
    assert roles == {"quality", "shadow"}
    assert {s.labels["candidate_digest"] for s in samples} == {watched.digests["fp32"]}

    def value(name: str, role: str, **labels: str) -> float:
        return sum(s.value for s in samples if s.name == name and s.labels["role"] == role
                   and all(s.labels.get(k) == v for k, v in labels.items()))  # fmt: skip

    assert value("kubeinfer_shadow_requests_total", "quality", outcome="compared") == 20
    assert value("kubeinfer_shadow_requests_total", "shadow", outcome="compared") == 40
    assert value("kubeinfer_shadow_top1_rows_total", "quality") == 80
    assert value("kubeinfer_shadow_class_top1_rows_total", "quality") == 80
    for row in status["classes"]:
        assert value("kubeinfer_shadow_class_top1_agreements_total", "quality",
                     reference_class=row["referenceClass"]) == row["agreements"]  # fmt: skip
    assert value("kubeinfer_shadow_kl_divergence_count", "quality") == 20


def test_a_shifted_class_falls_behind_and_fills_the_exemplars(watched):
    reference = reference_target(watched.reference, watched.digests["fp32"], 100,
                                 maxQueueSize=10_000)  # fmt: skip
    watch = {"reference": reference, "maxExemplars": 16, "windowSeconds": 600}
    start_watch(watched, watch)
    chosen, shifted = shifted_of_class(watched, 120, seed=2)
    normal = in_distribution(watched, 480, seed=3, avoid=chosen)
    requests = batches(normal, 2) + batches(shifted, 2)
    order = np.random.default_rng(4).permutation(len(requests))
    send_all(watched, [requests[i] for i in order])
    wait_for(lambda: watched.quality()["requests"]["compared"] == len(requests))
    status = watched.quality()
    by_class = {int(c["referenceClass"]): c for c in status["classes"]}
    others = [c for k, c in by_class.items() if k != chosen]
    other_agreement = sum(c["agreements"] for c in others) / sum(c["rows"] for c in others)
    # The reference's own class of a shifted row is nearly always `chosen` (the engine
    # and the local session are the same fp32 model); in distribution, int8 agrees.
    assert by_class[chosen]["rows"] >= 110
    assert by_class[chosen]["agreement"] < other_agreement - 0.1, status["classes"]
    assert status["top1"]["agreement"] >= 0.75  # overall, still high

    status_code, headers, body = watched.serving.request("GET", "/v2/quality/exemplars")
    assert status_code == 200 and headers["Content-Type"] == "application/octet-stream"
    archive = np.load(io.BytesIO(body), allow_pickle=False)
    inputs, metadata = archive["input"], json.loads(str(archive["__metadata__"]))
    assert inputs.shape == (16, 16) and len(metadata) == 16
    shifted_share = float(np.mean(np.linalg.norm(inputs, axis=1) > SHIFTED_NORM))
    assert shifted_share >= 0.75, metadata
    assert sum(m["referenceClass"] == chosen for m in metadata) >= 12
    assert all(m["recordedUnixSeconds"] > time.time() - 600 for m in metadata)
    ranks = [(m["disagreements"], m["klDivergence"]) for m in metadata]
    assert ranks == sorted(ranks, reverse=True)  # worst first


def test_a_shifted_slice_falls_behind_and_a_flood_of_values_stays_bounded(watched):
    reference = reference_target(watched.reference, watched.digests["fp32"], 100,
                                 maxQueueSize=10_000)  # fmt: skip
    watch = {"reference": reference, "sliceHeader": "X-Tenant", "maxSlices": 3}
    start_watch(watched, watch)
    rng = np.random.default_rng(5)
    requests = []
    for tenant in ("a", "b", "c"):  # claim the three named slots first, in this order
        requests.append((rng.standard_normal((2, 16)).astype(np.float32), {"X-Tenant": tenant}))
    for tenant, x in (
        ("a", rng.standard_normal((240, 16))),
        ("b", rng.standard_normal((240, 16)) * SHIFT),
        ("c", rng.standard_normal((240, 16))),
        (None, rng.standard_normal((80, 16))),
    ):
        requests += batches(x.astype(np.float32), 2, {"X-Tenant": tenant} if tenant else {})
    send_all(watched, requests[:3])
    send_all(watched, requests[3:])
    hostile = ["x" * 500, "tab\there", "caf\xe9", '} evil="1', " ", "other"]
    flood = [
        (rng.standard_normal((1, 16)).astype(np.float32), {"X-Tenant": value})
        for value in [f"flood-{i}" for i in range(60)] + hostile
    ]
    send_all(watched, flood)
    total = len(requests) + len(flood)
    wait_for(lambda: watched.quality()["requests"]["compared"] == total)
    status = watched.quality()
    slices = {s["slice"]: s for s in status["slices"]}
    assert set(slices) == {"a", "b", "c", "other"}
    assert slices["b"]["agreement"] < min(slices["a"]["agreement"],
                                          slices["c"]["agreement"]) - 0.15  # fmt: skip
    assert slices["other"]["rows"] == 80 + len(flood)
    assert sum(s["rows"] for s in slices.values()) == status["top1"]["rows"]

    samples = quality_samples(watched)  # parses: no header value broke the exposition
    labels = {s.labels["slice"] for s in samples if "slice" in s.labels}
    assert labels == {"a", "b", "c", "other"}


def test_a_slow_or_dead_reference_costs_the_serving_nothing(watched):
    x = np.full((1, 16), 0.25, np.float32)

    def watch_to(url: str, name: str, timeout_ms: int) -> None:
        start_watch(watched, {"reference": {
            "url": url, "modelName": "tiny", "candidateVersion": "1",
            "candidateDigest": "sha256:" + name, "trafficPercent": 100,
            "policy": {"timeoutMilliseconds": timeout_ms, "maxQueueSize": 8}}})  # fmt: skip

    # The slow reference holds every request it is sent, and the mirror waits up to 10 min
    # for each: had the serving waited on the mirror, not one answer would come.
    # It can hold 4 gathered sends of up to 32 rows and 8 queued: 200 requests overflow it.
    watch_to(watched.slow.url, "held", 600_000)
    send_all(watched, batches(x.repeat(200, axis=0), 1))  # each asserts its 200
    requests = watched.quality()["requests"]
    assert requests["compared"] == requests["timeout"] == requests["candidateError"] == 0
    assert requests["dropped"] > 0  # past the mirror's bounded queue: dropped, not waited for

    watch_to(watched.slow.url, "slow", 200)  # now each held request times out
    send_all(watched, batches(x.repeat(20, axis=0), 1))
    wait_for(lambda: watched.quality()["requests"]["timeout"] > 0)
    assert watched.quality()["requests"]["compared"] == 0

    watch_to(f"http://127.0.0.1:{free_port()}", "dead", 200)  # nobody listens there
    send_all(watched, batches(x.repeat(20, axis=0), 1))
    wait_for(lambda: watched.quality()["requests"]["candidateError"] > 0)
    assert watched.quality()["requests"]["compared"] == 0
    write_mirror_file(watched, None)
