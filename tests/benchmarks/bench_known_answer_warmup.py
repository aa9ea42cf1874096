"""What the known-answer check at start costs and what it saves: the first request's
latency after readiness, with the check (an engine served from the cache, `--engine`)
and without it (the very same engine file served as it is, `--onnx`, which has no known
answers), each from a fresh `kubeinfer serve` process; and what the check adds to the
time to ready. A script, not a test.

    .venv/bin/python tests/benchmarks/bench_known_answer_warmup.py [--runs 5]

For each model (the small and the memory-bound demo MLPs at fp32 and int8, and the
BERT-style encoder at fp32; built here into a temporary cache by `build_engine`), each
run starts a process, waits for readiness, sends one request of one row (the first
request), then a second, over one keep-alive connection, and stops it; runs alternate
between the two ways of serving. The table gives the medians over the runs: time from
the process's start to ready, the check's own seconds (`GET /v2/known-answers`), and the
first and second requests' round trips (client side, `time.monotonic`) with the server's
own time for each in brackets (its `Server-Timing`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from ports import free_port  # noqa: E402


def _models(work: Path) -> dict[str, tuple[Path, str, dict[str, str]]]:
    """name -> (model file, precision, extra build arguments)."""
    from kubeinfer.cli.demo.mlp_models import build_memory_bound_mlp, build_small_mlp
    from kubeinfer.runtime.building.calibration import write_demo_samples
    from models.transformer_models import build_encoder

    small = build_small_mlp(work / "small.onnx")
    large = build_memory_bound_mlp(work / "memory-bound.onnx")
    encoder = build_encoder(work / "encoder.onnx")
    small_calibration = {"calibration": str(write_demo_samples(small, work / "s.npz"))}
    large_calibration = {"calibration": str(write_demo_samples(large, work / "l.npz"))}
    return {
        "small-mlp fp32": (small, "fp32", {}),
        "small-mlp int8": (small, "int8", small_calibration),
        "memory-bound-mlp fp32": (large, "fp32", {}),
        "memory-bound-mlp int8": (large, "int8", large_calibration),
        "encoder fp32 (8 tokens)": (encoder, "fp32", {}),
    }


def _request(name: str, model: str) -> dict:  # type: ignore[type-arg]
    rng = np.random.default_rng(1)
    if model.startswith("encoder"):
        inputs = [
            {"name": n, "datatype": "INT64", "shape": [1, 8], "data": values}
            for n, values in (
                ("input_ids", rng.integers(1, 1000, 8).tolist()),
                ("attention_mask", [1] * 8),
                ("token_type_ids", [0] * 8),
            )
        ]
    else:
        width = 512 if model.startswith("small") else 1024
        data = rng.standard_normal(width).astype(np.float32).tolist()
        inputs = [{"name": "input", "datatype": "FP32", "shape": [1, width], "data": data}]
    return {"inputs": inputs}


def _get(connection: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, response.read()


def _run(source: list[str], name: str, request: dict, extra: list[str]) -> dict[str, float]:  # type: ignore[type-arg]
    port = free_port()
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "kubeinfer.cli", "serve", *source, "--model-name", "m",
         "--host", "127.0.0.1", "--port", str(port), "--intra-op-threads", "2",
         "--max-batch-size", "8", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"kubeinfer serve exited with {process.returncode}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                if _get(connection, "/v2/health/ready")[0] == 200:
                    break
                connection.close()
            except OSError:
                pass
            time.sleep(0.01)
        ready = time.monotonic() - started
        _, verdicts = _get(connection, "/v2/known-answers")
        at_start = json.loads(verdicts)["atStart"]
        body = json.dumps(request).encode()
        latencies, server = [], []
        for _ in range(2):
            sent = time.monotonic()
            connection.request("POST", "/v2/models/m/infer", body)
            response = connection.getresponse()
            response.read()
            latencies.append(time.monotonic() - sent)
            assert response.status == 200, response.status
            timing = response.getheader("Server-Timing", "")
            server.append(float(timing.partition("dur=")[2]) / 1000)
        connection.close()
    finally:
        process.terminate()
        process.wait(timeout=60)
    return {
        "ready": ready,
        "check": at_start["seconds"] if at_start["result"] != "skipped" else 0.0,
        "first": latencies[0],
        "second": latencies[1],
        "first_server": server[0],
        "second_server": server[1],
    }


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from kubeinfer.runtime.building.engine_build import build_engine

    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-known-answers-") as work:
        root = Path(work)
        for name, (model, precision, extra) in _models(root).items():
            built = build_engine(str(model), "onnxruntime", precision, root / "cache",
                                 max_batch_size=8, **extra)  # type: ignore[arg-type]  # fmt: skip
            shapes = []
            if name.startswith("encoder"):
                for n in ("input_ids", "attention_mask", "token_type_ids"):
                    shapes += ["--input-shape", f"{n}=1:8:16"]
            ways = {
                "with the check": ["--engine", built.digest, "--cache", str(root / "cache")],
                "without (--onnx)": ["--onnx", str(built.engine_path)],
            }
            runs: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
            for index in range(args.runs):
                for way, source in ways.items():
                    runs[way].append(_run(source, name, _request(name, name), shapes))
                say(f"{name}: run {index + 1} of {args.runs}")
            for way, measured in runs.items():
                rows.append(
                    f"| {name} | {way} | {_median(measured, 'ready'):.2f} | "
                    f"{_median(measured, 'check') * 1000:.1f} | "
                    f"{_median(measured, 'first') * 1000:.2f} "
                    f"({_median(measured, 'first_server') * 1000:.2f}) | "
                    f"{_median(measured, 'second') * 1000:.2f} "
                    f"({_median(measured, 'second_server') * 1000:.2f}) |"
                )
    print(
        "| engine | served | to ready (s) | check (ms) | first request, ms (server) "
        "| second, ms (server) |"
    )
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
