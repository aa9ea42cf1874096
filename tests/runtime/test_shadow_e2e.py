"""Shadow mirroring between real `kubeinfer serve` processes on loopback.

A serving serves the tiny demo model's fp32 engine (built into a cache with
`build_engine`) with `--mirror-target-file`; its candidates are the int8 engine of the
same model, the same architecture built with another seed (same tensor names, other
weights), a candidate stopped mid-run, and a scripted server that answers too late.
Load comes from `tritonclient.http` and from the demo's async load generator. Covers:

- exactly trafficPercent of the requests answered 200 are mirrored, none of the others;
- an int8 candidate agrees closely (no mismatch, top-1 agreement high, small difference)
  and every compared request reached it (its own request counter says so); another model
  disagrees (agreement low, difference large);
- /v2/shadow and /metrics agree; every infer response carries Server-Timing;
- the target file switched A -> B -> empty changes what is mirrored while the process
  runs (it polls the file), restarting the aggregates and removing the old candidate's
  series; an invalid file keeps the target
  and is logged once, the process serving on;
- a candidate stopped mid-run and one that holds every request: every serving answer is
  200 while none of the mirror's requests to the holding candidate has an outcome (the
  serving never awaits the candidate), the excess dropped at the mirror's bounded queue;
  errors and, with a short timeout, timeouts are counted (what a broken candidate costs
  in latency is a benchmark's figure: `bench_quality_watch.py --broken-references`, the
  same mirror);
- SIGTERM is not held up by mirrored work in flight (the mirror would wait 10 minutes);
- a bad mirrorTargetFile in the configuration exits 2 with a message naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import processes
import pytest
import tritonclient.http as triton
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.contract.metric_series import histogram_quantile
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from kubeinfer.runtime.protocol.v2_types import parse_server_timing
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families
from serve_process import LoopbackHttp
from waiting import wait_for

pytestmark = pytest.mark.slow

HOST = "127.0.0.1"
POLL_MS = 100
SLOW_CANDIDATE = """
import asyncio, sys
from aiohttp import web

async def infer(request):
    await request.read()
    await asyncio.sleep(float(sys.argv[2]))
    return web.json_response({"error": "answered too late"}, status=503)

app = web.Application()
app.router.add_post("/v2/models/{name}/infer", infer)
app.router.add_get("/v2/health/ready", lambda request: web.json_response({"ready": True}))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, shutdown_timeout=0.1)
"""


@dataclass
class Process(LoopbackHttp):
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def shadow(self) -> dict:
        status, _, body = self.request("GET", "/v2/shadow")
        assert status == 200
        return json.loads(body)

    def metrics(self) -> list:
        _, _, body = self.request("GET", "/metrics")
        return [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]

    def stop(self) -> int:
        return processes.stop(self.process)


def launch(command: list[str], port: int, log: Path) -> Process:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)
    return Process(process, port, log)


def serve(log_dir: Path, name: str, *source: str) -> Process:
    port = free_port()
    command = [sys.executable, "-m", "kubeinfer.cli", "serve", *source,
               "--model-name", "tiny", "--host", HOST, "--port", str(port),
               "--intra-op-threads", "1"]  # fmt: skip
    return launch(command, port, log_dir / f"{name}.log")


def wait_ready(*started: Process) -> None:
    for process in started:
        processes.wait_ready(
            lambda process=process: process.request("GET", "/v2/health/ready")[0] == 200,
            process.process, process.log.name, output=process.log.read_text,
        )  # fmt: skip


@dataclass
class Shadows:
    serving: Process
    int8: Process
    other: Process
    slow: Process
    mirror_file: Path
    digests: dict[str, str]
    model: Path


@pytest.fixture(scope="module")
def shadows(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shadows]:
    root = tmp_path_factory.mktemp("shadow")
    model = build_tiny_mlp(root / "tiny.onnx")
    other_model = build_tiny_mlp(root / "tiny-seed1.onnx", seed=1)
    calibration = write_demo_samples(model, root / "calibration.npz", count=64)
    cache = root / "cache"
    digests = {
        precision: build_engine(str(model), "onnxruntime", precision, cache,
                                calibration=str(calibration) if precision == "int8" else None,
                                max_batch_size=32).digest
        for precision in ("fp32", "int8")
    }  # fmt: skip
    mirror_file = root / "mirror" / "target.yaml"
    mirror_file.parent.mkdir()
    slow_port = free_port()
    started = [
        serve(root, "serving", "--engine", digests["fp32"], "--cache", str(cache),
              "--mirror-target-file", str(mirror_file),
              "--mirror-poll-interval-milliseconds", str(POLL_MS)),
        serve(root, "int8", "--engine", digests["int8"], "--cache", str(cache)),
        serve(root, "other", "--onnx", str(other_model)),
        # A candidate that holds every request for far longer than the tests run.
        launch([sys.executable, "-c", SLOW_CANDIDATE, str(slow_port), "3600"], slow_port,
               root / "slow.log"),
    ]  # fmt: skip
    codes: list[int] = []
    with contextlib.ExitStack() as stack:  # each process stopped, whatever fails
        for process in started:
            stack.callback(lambda process=process: codes.append(process.stop()))
        wait_ready(*started)
        yield Shadows(*started, mirror_file, {**digests, "other": "sha256:" + "0" * 64}, model)
    assert codes[1:] == [0, 0, 0]  # other, int8, serving (stopped last first)


def write_target(
    shadows: Shadows, to: Process | None, digest: str = "", percent: int = 100, **policy: int
) -> None:
    """Replaces the mirror file at once (as kubelet does), never half-written."""
    if to is None:
        content = ""
    else:
        content = json.dumps({"target": {
            "url": to.url, "modelName": "tiny", "candidateVersion": "2",
            "candidateDigest": digest, "trafficPercent": percent, "policy": policy,
        }})  # fmt: skip
    staging = shadows.mirror_file.with_suffix(".tmp")
    staging.write_text(content)
    os.replace(staging, shadows.mirror_file)


def switch(shadows: Shadows, to: Process | None, digest: str = "", **kwargs: int) -> None:
    """Points the serving at `to` (from zero: a candidate already mirrored to is switched
    off first), and waits until /v2/shadow shows it: the running process polls the file."""
    current = shadows.serving.shadow()["candidate"]
    if to is not None and current and (current["url"], current["digest"]) == (to.url, digest):
        switch(shadows, None)
    write_target(shadows, to, digest, **kwargs)

    def shown() -> bool:
        status = shadows.serving.shadow()
        if to is None:
            return not status["active"]
        candidate = status["candidate"]
        return bool(
            candidate
            and (candidate["url"], candidate["digest"]) == (to.url, digest)
            and status["trafficPercent"] == kwargs.get("percent", 100)
        )

    wait_for(shown, what=f"the serving to mirror to {to.url if to else 'nothing'}", every=0.01)


def infer_many(shadows: Shadows, count: int, seed: int) -> list[np.ndarray]:
    """`count` requests of 1-4 rows from 4 tritonclient threads, JSON and binary inputs;
    every answer must be 200."""

    def one(i: int) -> np.ndarray:
        client = triton.InferenceServerClient(f"{HOST}:{shadows.serving.port}")
        x = np.random.default_rng(seed * 1000 + i).standard_normal((1 + i % 4, 16))
        tensor = triton.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x.astype(np.float32), binary_data=bool(i % 2))
        return client.infer("tiny", [tensor]).as_numpy("logits")

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(count)))


def wait_compared(shadows: Shadows, count: int) -> dict:
    return wait_for(
        lambda: (status := shadows.serving.shadow())["requests"]["compared"] >= count and status,
        what=f"{count} compared requests",
        every=0.02,
    )


def candidate_requests(candidate: Process) -> float:
    return sum(s.value for s in candidate.metrics()
               if s.name == "kubeinfer_requests_total" and s.labels["code"] == "200")  # fmt: skip


def shadow_samples(serving: Process) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for s in serving.metrics()
        if s.name.startswith("kubeinfer_shadow") and not s.name.endswith("_created")
    }


def test_an_int8_candidate_agrees_closely_and_metrics_agree_with_v2_shadow(shadows) -> None:
    switch(shadows, shadows.int8, shadows.digests["int8"])
    before = candidate_requests(shadows.int8)
    infer_many(shadows, 40, seed=1)
    status = wait_compared(shadows, 40)
    assert candidate_requests(shadows.int8) - before == 40  # each one reached the candidate
    assert status["requests"] == {"compared": 40, "dropped": 0, "candidateError": 0,
                                  "timeout": 0}  # fmt: skip
    assert status["mismatches"] == 0
    # int8 is close but not identical: on these inputs (not the calibration's) the mean
    # request's largest difference is a few hundredths of logits of magnitude ~1, with
    # the odd outlier near 0.3
    assert 0 < status["meanAbsDifference"] < 0.1 and status["maxAbsDifference"] < 0.5
    assert status["minCosineSimilarity"] > 0.99
    assert status["top1"]["rows"] == sum(1 + i % 4 for i in range(40))
    assert status["top1"]["agreement"] >= 0.9
    assert status["latency"]["servingP99Seconds"] > 0
    assert status["latency"]["candidateP99Seconds"] > 0

    samples = shadow_samples(shadows.serving)
    labels = {"model": "tiny", "serving_version": "1", "candidate_version": "2",
              "candidate_digest": shadows.digests["int8"], "role": "shadow"}  # fmt: skip

    def value(name: str, **extra: str) -> float:
        return samples[(name, tuple(sorted({**labels, **extra}.items())))]

    for outcome, key in (
        ("compared", "compared"),
        ("dropped", "dropped"),
        ("candidate_error", "candidateError"),
        ("timeout", "timeout"),
    ):
        assert value("kubeinfer_shadow_requests_total", outcome=outcome) == \
            status["requests"][key]  # fmt: skip
    assert value("kubeinfer_shadow_mismatches_total") == status["mismatches"]
    assert value("kubeinfer_shadow_max_abs_difference") == status["maxAbsDifference"]
    assert value("kubeinfer_shadow_top1_rows_total") == status["top1"]["rows"]
    assert value("kubeinfer_shadow_top1_agreements_total") == status["top1"]["agreements"]
    for histogram, key in (
        ("abs_difference", "meanAbsDifference"),
        ("cosine_similarity", "meanCosineSimilarity"),
    ):
        name = f"kubeinfer_shadow_{histogram}"
        mean = value(name + "_sum") / value(name + "_count")
        assert mean == pytest.approx(status[key])  # fmt: skip
    for side in ("serving", "candidate"):
        name = f"kubeinfer_shadow_{side}_duration_seconds_bucket"
        buckets = [(float(dict(k[1])["le"]), v) for k, v in samples.items() if k[0] == name]
        assert histogram_quantile(0.99, buckets) == status["latency"][f"{side}P99Seconds"]


def test_a_different_model_disagrees(shadows) -> None:
    switch(shadows, shadows.other, shadows.digests["other"])
    assert shadows.serving.shadow()["requests"]["compared"] == 0  # another candidate: reset
    infer_many(shadows, 30, seed=2)
    status = wait_compared(shadows, 30)
    assert status["mismatches"] == 0  # same names, shapes and datatypes: values differ
    assert status["top1"]["agreement"] < 0.5
    assert status["maxAbsDifference"] > 0.5
    assert status["meanCosineSimilarity"] < 0.8


def test_exactly_the_share_of_requests_answered_200_is_mirrored(shadows) -> None:
    switch(shadows, shadows.int8, shadows.digests["int8"], percent=25)
    good = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                   "data": [0.5] * 16}]}).encode()  # fmt: skip
    bad = good.replace(b'"shape": [1, 16]', b'"shape": [1, 15]')
    before = candidate_requests(shadows.int8)
    for i in range(40):
        assert shadows.serving.request("POST", "/v2/models/tiny/infer", good)[0] == 200
        if i % 3 == 0:  # refused requests are neither counted nor mirrored
            assert shadows.serving.request("POST", "/v2/models/tiny/infer", bad)[0] == 400
    wait_compared(shadows, 10)
    time.sleep(0.1)  # not a wait: time for an eleventh comparison to show, which must not
    assert shadows.serving.shadow()["requests"]["compared"] == 10  # 25 % of 40, exactly
    assert candidate_requests(shadows.int8) - before == 10


def test_every_infer_response_carries_server_timing(shadows) -> None:
    for binary_output in (False, True):
        body = json.dumps(
            {
                "inputs": [
                    {"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}
                ],
                "parameters": {"binary_data_output": binary_output},
            }
        ).encode()
        status, headers, _ = shadows.serving.request("POST", "/v2/models/tiny/infer", body)
        assert status == 200 and 0 < parse_server_timing(headers["Server-Timing"]) < 1
        assert ("Inference-Header-Content-Length" in headers) == binary_output  # fmt: skip
    status, headers, _ = shadows.serving.request("POST", "/v2/models/tiny/infer", b"{")
    assert status == 400 and parse_server_timing(headers["Server-Timing"]) is not None


def test_switching_the_target_file_a_to_b_to_empty(shadows) -> None:
    a, b = shadows.int8, shadows.other
    switch(shadows, a, shadows.digests["int8"])
    infer_many(shadows, 10, seed=3)
    wait_compared(shadows, 10)
    switch(shadows, b, shadows.digests["other"])
    digests = {dict(k[1]).get("candidate_digest") for k in shadow_samples(shadows.serving)}
    assert digests == {shadows.digests["other"]}  # A's series went with it
    before = {p.port: candidate_requests(p) for p in (a, b)}
    infer_many(shadows, 10, seed=4)
    assert wait_compared(shadows, 10)["requests"]["compared"] == 10
    assert candidate_requests(a) == before[a.port]  # only B is mirrored to now
    assert candidate_requests(b) == before[b.port] + 10

    switch(shadows, None)
    infer_many(shadows, 10, seed=5)
    time.sleep(0.2)  # not a wait: time for a mirrored request to show, which must not
    assert candidate_requests(b) == before[b.port] + 10  # nothing mirrored any more
    assert shadows.serving.shadow()["candidate"] is None
    assert shadow_samples(shadows.serving) == {}


def test_an_invalid_file_keeps_the_target_and_is_logged_once(shadows) -> None:
    switch(shadows, shadows.int8, shadows.digests["int8"])
    staging = shadows.mirror_file.with_suffix(".tmp")
    staging.write_text("target: {url: 'not a url', trafficPercent: 500}\n")
    os.replace(staging, shadows.mirror_file)

    def reports() -> list[str]:
        log = shadows.serving.log.read_text()
        return [line for line in log.splitlines() if "Ignored the mirror target file" in line]

    wait_for(reports, what="the invalid file reported")
    # not a wait: several polls of the same bad content, which must not be reported again
    time.sleep(POLL_MS / 1000 * 6)
    infer_many(shadows, 10, seed=6)
    status = wait_compared(shadows, 10)
    assert status["candidate"]["digest"] == shadows.digests["int8"]  # still mirrored
    reports = reports()
    assert len(reports) == 1, reports
    assert "target.url" in reports[0] and "target.trafficPercent" in reports[0]
    assert shadows.serving.process.poll() is None


def test_broken_candidates_cost_the_serving_nothing(shadows, tmp_path: Path) -> None:
    doomed = serve(tmp_path, "doomed", "--onnx", str(shadows.model))
    wait_ready(doomed)
    switch(shadows, doomed, "sha256:doomed")
    stop = threading.Event()
    answered: list[int] = []

    def load() -> None:  # tritonclient raises on any answer but 200
        while not stop.is_set():
            answered.append(len(infer_many(shadows, 8, seed=len(answered))))

    loader = threading.Thread(target=load)
    loader.start()
    try:
        wait_for(lambda: shadows.serving.shadow()["requests"]["compared"] > 0, what="a compare")
        assert doomed.stop() == 0  # stopped mid-run
        errors = lambda: shadows.serving.shadow()["requests"]["candidateError"]  # noqa: E731
        wait_for(lambda: errors() > 0, what="a candidate error once it stopped")
    finally:
        stop.set()
        loader.join(60)
    assert not loader.is_alive() and sum(answered) >= 16

    # The slow candidate holds every request, and the mirror waits up to 10 min for each:
    # had the serving waited on the mirror, not one answer would come. The mirror holds 4
    # in flight and 8 queued: the rest of 64 requests are dropped, not waited for.
    switch(shadows, shadows.slow, "sha256:held", timeout_milliseconds=600_000, max_queue_size=8)
    assert len(infer_many(shadows, 64, seed=7)) == 64  # every one answered 200
    requests = shadows.serving.shadow()["requests"]
    assert requests["compared"] == requests["timeout"] == requests["candidateError"] == 0
    assert requests["dropped"] > 0
    switch(shadows, shadows.slow, "sha256:slow", timeout_milliseconds=200)
    infer_many(shadows, 16, seed=8)
    wait_for(lambda: shadows.serving.shadow()["requests"]["timeout"] > 0)
    assert shadows.serving.shadow()["requests"]["compared"] == 0
    log = shadows.serving.log.read_text()
    assert "Traceback" not in log


def test_sigterm_is_not_held_up_by_mirrored_work(shadows, tmp_path: Path) -> None:
    port = free_port()  # a candidate that would answer in an hour
    stuck = launch([sys.executable, "-c", SLOW_CANDIDATE, str(port), "3600"], port,
                   tmp_path / "stuck.log")  # fmt: skip
    mirror_file = tmp_path / "target.json"
    mirror_file.write_text(json.dumps({"target": {
        "url": stuck.url, "modelName": "tiny", "candidateVersion": "2",
        "trafficPercent": 100, "policy": {"timeoutMilliseconds": 600_000},
    }}))  # fmt: skip
    serving = serve(tmp_path, "serving", "--onnx", str(shadows.model),
                    "--mirror-target-file", str(mirror_file))  # fmt: skip
    wait_ready(serving, stuck)
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                   "data": [0.5] * 16}]}).encode()  # fmt: skip
    for _ in range(8):
        assert serving.request("POST", "/v2/models/tiny/infer", body)[0] == 200
    assert serving.shadow()["requests"] == {
        "compared": 0,
        "dropped": 0,
        "candidateError": 0,
        "timeout": 0,
    }  # 8 in the slow candidate's hands
    try:  # the mirror would wait 10 minutes: stop() kills after 30 s
        assert serving.stop() == 0
        assert "Traceback" not in serving.log.read_text()
    finally:
        stuck.process.kill()
        stuck.process.wait()


@pytest.mark.parametrize(
    ("config", "flags", "message"),
    [
        ("mirrorTargetFile: [a, b]\n", (), "mirrorTargetFile: Input should be a valid string"),
        ("mirrorPollIntervalMilliseconds: 1\n", (), "mirrorPollIntervalMilliseconds"),
        ("", ("--mirror-target-file", " "), "mirrorTargetFile: must be a file path"),
        ("", ("--mirror-target-file", "{dir}"), "is a directory"),
    ],
)
def test_a_bad_mirror_configuration_exits_2(tmp_path: Path, config, flags, message) -> None:
    file = tmp_path / "runtime.yaml"
    file.write_text("modelName: tiny\nengine: {onnxPath: /nope.onnx}\n" + config)
    flags = tuple(f.format(dir=tmp_path) for f in flags)
    done = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", "serve", "--config", str(file), *flags],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
