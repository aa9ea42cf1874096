"""What the quality watch costs the serving runtime: no watch, and the watch sampling 1 %
and 5 % of its requests to a real fp32 reference, side by side in one run.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/bench_quality_watch.py [--quick] [--rounds 3]
        [--no-pin] [--model small-mlp|memory-bound-mlp]

The harness is `bench_shadow.py`'s (the same servers, pinning, load generator and CPU
accounting); only the roles turn around: the serving serves a demo MLP's int8 engine and
the reference its fp32 engine, both built through the engine cache and started as
`kubeinfer serve` processes on loopback. The serving's `--mirror-target-file` is rewritten
between runs (atomically, as kubelet does) to hold no watch (an empty file) or a
`qualityWatch` at 1 % or 5 % with a slice header (which the load's requests do not carry:
they count as `other`, and the header is looked up on every request) and the default
exemplar buffer (16 rows), so every per request cost the watch adds is in the figures;
each run starts once /v2/quality shows the new share. The three conditions run in
`--rounds` interleaved rounds, in a rotating order; each figure is the median over the
rounds, and the ratios are against no watch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_shadow import MODELS, parse_args, pin, process_cpu_seconds
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from loadgen import encode_json_infer, run_closed_loop
from servers import HOST, REPO, ServerProcess, http_get, kubeinfer_spec

SHARES = (0, 1, 5)  # 0: no watch


def quality_status(port: int) -> dict:
    status, body = http_get(f"http://{HOST}:{port}/v2/quality")
    assert status == 200, body
    return json.loads(body)


def set_share(mirror_file: Path, serving_port: int, reference_port: int, share: int,
              model: str) -> None:  # fmt: skip
    """Rewrites the mirror file for a watch at `share` % (0: none) and waits for it."""
    content = "" if share == 0 else json.dumps({"qualityWatch": {
        "reference": {"url": f"http://{HOST}:{reference_port}", "modelName": model,
                      "candidateVersion": "fp32",
                      "candidateDigest": f"bench-{share}-{time.monotonic_ns()}",
                      "trafficPercent": share},
        "sliceHeader": "X-Tenant",
    }})  # fmt: skip
    staging = mirror_file.with_suffix(".tmp")
    staging.write_text(content)
    os.replace(staging, mirror_file)
    deadline = time.monotonic() + 10
    while True:
        status = quality_status(serving_port)
        if (share == 0 and not status["active"]) or status["samplePercent"] == share:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the serving did not take the {share} % watch: {status}")
        time.sleep(0.02)


@dataclass
class Run:
    share: int
    throughput: float
    p50_ms: float
    p99_ms: float
    serving_cpu_ms: float
    compared: int
    dropped: int
    effective_rate: float | None
    agreement: float | None


def one_run(args: argparse.Namespace, share: int, serving: ServerProcess,
            reference: ServerProcess, mirror_file: Path, requests: list[bytes]) -> Run:  # fmt: skip
    assert serving.process is not None
    set_share(mirror_file, serving.spec.port, reference.spec.port, share, args.model)
    marks: dict[str, float] = {}
    pid = serving.process.pid
    result = asyncio.run(
        run_closed_loop(
            HOST, serving.spec.port, requests, args.clients, args.warmup, args.duration,
            on_window_start=lambda: marks.__setitem__("start", process_cpu_seconds(pid)),
            on_window_end=lambda: marks.__setitem__("end", process_cpu_seconds(pid)),
        )
    )  # fmt: skip
    status = quality_status(serving.spec.port)
    done = max(1, result.completed + result.errors)
    run = Run(
        share=share,
        throughput=result.throughput,
        p50_ms=result.percentile_ms(50),
        p99_ms=result.percentile_ms(99),
        serving_cpu_ms=(marks["end"] - marks["start"]) / done * 1000,
        compared=status["requests"]["compared"],
        dropped=status["requests"]["dropped"],
        effective_rate=status["effectiveSampleRate"],
        agreement=status["top1"]["agreement"],
    )
    print(f"  {share:>3} %: {run.throughput:7.0f} req/s  p50 {run.p50_ms:6.2f} ms  "
          f"p99 {run.p99_ms:6.2f} ms  serving CPU {run.serving_cpu_ms:5.3f} ms/req  "
          f"compared {run.compared}  dropped {run.dropped}  effective rate "
          f"{run.effective_rate}", flush=True)  # fmt: skip
    return run


def table(runs: list[Run]) -> str:
    by_share = {share: [r for r in runs if r.share == share] for share in SHARES}

    def median(share: int, field: str) -> float:
        return statistics.median(getattr(r, field) for r in by_share[share])

    base_throughput, base_cpu = median(0, "throughput"), median(0, "serving_cpu_ms")
    base_p99 = median(0, "p99_ms")
    lines = [
        "| watch | req/s | vs none | p50 ms | p99 ms | p99 vs none | serving CPU ms/req "
        "| vs none | compared | dropped | effective rate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for share in SHARES:
        throughput, cpu = median(share, "throughput"), median(share, "serving_cpu_ms")
        p99 = median(share, "p99_ms")
        rates = [r.effective_rate for r in by_share[share] if r.effective_rate is not None]
        lines.append(
            f"| {'none' if share == 0 else f'{share} %'} | {throughput:.0f} "
            f"| {throughput / base_throughput:.3f} | {median(share, 'p50_ms'):.2f} "
            f"| {p99:.2f} | {p99 / base_p99:.3f} | {cpu:.3f} | {cpu / base_cpu:.3f} "
            f"| {sum(r.compared for r in by_share[share])} "
            f"| {sum(r.dropped for r in by_share[share])} "
            f"| {statistics.median(rates) if rates else 0:.4f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pinned = args.pin and len(os.sched_getaffinity(0)) >= 2
    threads = 1 if pinned else (os.cpu_count() or 1)
    work = REPO / ".bench" / "quality-watch"
    builder, width = MODELS[args.model]
    model = work / f"{args.model}.onnx"
    if not model.exists():
        builder(model)
    calibration = write_demo_samples(model, work / f"{args.model}-calibration.npz", count=160)
    digests = {
        precision: build_engine(str(model), "onnxruntime", precision, work / "cache",
                                calibration=str(calibration) if precision == "int8" else None,
                                max_batch_size=32).digest
        for precision in ("fp32", "int8")
    }  # fmt: skip
    mirror_file = work / "mirror" / "mirror.json"
    mirror_file.parent.mkdir(parents=True, exist_ok=True)
    mirror_file.write_text("")
    serving_spec = kubeinfer_spec(
        model, args.model, threads, engine=(digests["int8"], work / "cache"),
        extra_args=("--execution-slots", "1", "--mirror-target-file", str(mirror_file),
                    "--mirror-poll-interval-milliseconds", "100"),
    )  # fmt: skip
    serving_spec.label = "serving"
    reference_spec = kubeinfer_spec(
        model, args.model, threads, engine=(digests["fp32"], work / "cache"),
        extra_args=("--execution-slots", "1"),
    )  # fmt: skip
    reference_spec.label = "reference"
    items = np.random.default_rng(7).standard_normal((16, width)).astype(np.float32)
    print(f"kubeinfer quality watch benchmark: {args.model} int8 serving, fp32 reference, "
          f"{args.clients} closed-loop clients, {args.rounds} rounds of {args.warmup:g} s + "
          f"{args.duration:g} s per condition, "
          f"{'pinned: serving CPU 0, reference + load CPU 1' if pinned else 'unpinned'}, "
          f"{threads} ONNX Runtime thread(s) per server", flush=True)  # fmt: skip
    log_dir = work / "logs"
    runs: list[Run] = []
    with ServerProcess(serving_spec, log_dir) as serving, \
            ServerProcess(reference_spec, log_dir) as reference:  # fmt: skip
        assert serving.process is not None and reference.process is not None
        if pinned:
            pin(serving.process.pid, {0})
            pin(reference.process.pid, {1})
            os.sched_setaffinity(0, {1})
        requests = [encode_json_infer(HOST, serving_spec.port, args.model, "input", x)
                    for x in items]  # fmt: skip
        for index in range(args.rounds):
            order = SHARES[index % 3 :] + SHARES[: index % 3]
            print(f"round {index + 1}", flush=True)
            for share in order:
                runs.append(one_run(args, share, serving, reference, mirror_file, requests))
    print("\n" + table(runs))
    last = [r for r in runs if r.share == 5][-1]
    print(f"\n(compared and dropped: summed over the rounds, warm-up included; effective "
          f"rate: compared / answered since the watch started, median over the rounds; the "
          f"int8 serving against fp32 in the last 5 % run: top-1 agreement "
          f"{last.agreement})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
