"""What shadow mirroring costs the serving runtime: 0 %, 10 % and 100 % of its requests
mirrored to a real candidate, side by side in one run.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/bench_shadow.py [--quick] [--rounds 3] [--no-pin]
        [--model small-mlp|memory-bound-mlp]

The serving serves a demo MLP's fp32 engine (the overhead-bound small one by default, where
a served request costs the least and the mirror's own cost shows the most), the candidate
its int8 engine, both built through the engine cache and started as `kubeinfer serve`
processes on loopback; the serving's `--mirror-target-file` is rewritten between runs
(atomically, as kubelet does) to mirror 0 % (an empty file: mirroring off), 10 % or 100 %,
and each run starts once /v2/shadow shows the new share. 32 closed-loop clients (the cheap raw-HTTP
generator in `loadgen.py`) send single-item JSON requests. The three shares run in
`--rounds` interleaved rounds, in a rotating order, so drift on a shared machine falls
on every share alike; each figure is the median over the rounds.

Per share: throughput, p50/p99 at the client, the serving's and the candidate's CPU per
serving request (from /proc), and what /v2/shadow counted (compared, dropped). The
serving's CPU per request is the cost of the mirror itself (encoding the candidate's
request, the HTTP client, decoding and comparing), which throughput alone hides on a
2-core machine where the candidate takes its CPU from the same cores.

Pinning (`--pin`, the default): the serving runs alone on CPU 0, the candidate and this
load generator share CPU 1, each server with one ONNX Runtime thread, so the candidate's
work does not take the serving's core and the throughput ratio shows the mirror's own
cost; with `--no-pin` all share both cores (two threads each), as an unpinned pod would.
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
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from kubeinfer.runtime.demo_models import build_memory_bound_mlp, build_small_mlp
from loadgen import encode_json_infer, run_closed_loop
from servers import HOST, REPO, ServerProcess, http_get, kubeinfer_spec

MODELS = {"small-mlp": (build_small_mlp, 512), "memory-bound-mlp": (build_memory_bound_mlp, 1024)}
SHARES = (0, 10, 100)
_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, every thread included."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of a running process onto `cpus` (threads it starts later inherit)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), cpus)


def shadow_status(port: int) -> dict:
    status, body = http_get(f"http://{HOST}:{port}/v2/shadow")
    assert status == 200, body
    return json.loads(body)


def set_share(
    mirror_file: Path, serving_port: int, candidate_port: int, share: int, model: str
) -> None:
    """Rewrites the mirror file for `share` % and waits until the serving shows it."""
    content = "" if share == 0 else json.dumps({"target": {
        "url": f"http://{HOST}:{candidate_port}", "modelName": model,
        "candidateVersion": "int8", "candidateDigest": f"bench-{share}-{time.monotonic_ns()}",
        "trafficPercent": share,
    }})  # fmt: skip
    staging = mirror_file.with_suffix(".tmp")
    staging.write_text(content)
    os.replace(staging, mirror_file)
    deadline = time.monotonic() + 10
    while True:
        status = shadow_status(serving_port)
        if (share == 0 and not status["active"]) or status["trafficPercent"] == share:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the serving did not take the {share} % target: {status}")
        time.sleep(0.02)


@dataclass
class Run:
    share: int
    throughput: float
    p50_ms: float
    p99_ms: float
    serving_cpu_ms: float
    candidate_cpu_ms: float
    compared: int
    dropped: int
    errors: int
    agreement: float | None
    max_abs_difference: float | None


def one_run(args, share, serving, candidate, mirror_file, requests) -> Run:
    set_share(mirror_file, serving.spec.port, candidate.spec.port, share, args.model)
    marks: dict[str, tuple[float, float]] = {}

    def mark(name: str) -> None:
        marks[name] = (process_cpu_seconds(serving.process.pid),
                       process_cpu_seconds(candidate.process.pid))  # fmt: skip

    result = asyncio.run(
        run_closed_loop(
            HOST, serving.spec.port, requests, args.clients, args.warmup, args.duration,
            on_window_start=lambda: mark("start"), on_window_end=lambda: mark("end"),
        )
    )  # fmt: skip
    status = shadow_status(serving.spec.port)
    done = max(1, result.completed + result.errors)
    (p0, c0), (p1, c1) = marks["start"], marks["end"]
    run = Run(
        share=share,
        throughput=result.throughput,
        p50_ms=result.percentile_ms(50),
        p99_ms=result.percentile_ms(99),
        serving_cpu_ms=(p1 - p0) / done * 1000,
        candidate_cpu_ms=(c1 - c0) / done * 1000,
        compared=status["requests"]["compared"],
        dropped=status["requests"]["dropped"],
        errors=result.errors,
        agreement=status["top1"]["agreement"],
        max_abs_difference=status["maxAbsDifference"],
    )
    print(f"  {share:>3} %: {run.throughput:7.0f} req/s  p50 {run.p50_ms:6.2f} ms  "
          f"p99 {run.p99_ms:6.2f} ms  serving CPU {run.serving_cpu_ms:5.3f} ms/req  "
          f"candidate CPU {run.candidate_cpu_ms:5.3f} ms/req  compared {run.compared}  "
          f"dropped {run.dropped}  errors {run.errors}", flush=True)  # fmt: skip
    return run


def table(runs: list[Run]) -> str:
    by_share = {share: [r for r in runs if r.share == share] for share in SHARES}

    def median(share: int, field: str) -> float:
        return statistics.median(getattr(r, field) for r in by_share[share])

    base_throughput, base_cpu = median(0, "throughput"), median(0, "serving_cpu_ms")
    lines = [
        "| mirrored | req/s | vs 0 % | p50 ms | p99 ms | serving CPU ms/req | vs 0 % "
        "| candidate CPU ms/req | compared | dropped |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for share in SHARES:
        throughput, cpu = median(share, "throughput"), median(share, "serving_cpu_ms")
        lines.append(
            f"| {share} % | {throughput:.0f} | {throughput / base_throughput:.3f} "
            f"| {median(share, 'p50_ms'):.2f} | {median(share, 'p99_ms'):.2f} "
            f"| {cpu:.3f} | {cpu / base_cpu:.3f} | {median(share, 'candidate_cpu_ms'):.3f} "
            f"| {sum(r.compared for r in by_share[share])} "
            f"| {sum(r.dropped for r in by_share[share])} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="kubeinfer shadow mirroring benchmark")
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke check)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--model", choices=sorted(MODELS), default="small-mlp")
    parser.add_argument("--duration", type=float, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds before each run")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serving alone on CPU 0; candidate and load generator on CPU 1",
    )
    args = parser.parse_args(argv)
    args.duration = args.duration or (2.0 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    if args.quick:
        args.rounds = min(args.rounds, 2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pinned = args.pin and len(os.sched_getaffinity(0)) >= 2
    threads = 1 if pinned else (os.cpu_count() or 1)
    work = REPO / ".bench" / "shadow"
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
    mirror_file = work / "mirror" / "target.json"
    mirror_file.parent.mkdir(parents=True, exist_ok=True)
    mirror_file.write_text("")
    serving_spec = kubeinfer_spec(
        model, args.model, threads, engine=(digests["fp32"], work / "cache"),
        extra_args=("--execution-slots", "1", "--mirror-target-file", str(mirror_file),
                    "--mirror-poll-interval-milliseconds", "100"),
    )  # fmt: skip
    serving_spec.label = "serving"
    candidate_spec = kubeinfer_spec(
        model, args.model, threads, engine=(digests["int8"], work / "cache"),
        extra_args=("--execution-slots", "1"),
    )  # fmt: skip
    candidate_spec.label = "candidate"
    items = np.random.default_rng(7).standard_normal((16, width)).astype(np.float32)
    print(f"kubeinfer shadow benchmark: {args.model}, {args.clients} closed-loop clients, "
          f"{args.rounds} rounds of {args.warmup:g} s + {args.duration:g} s per share, "
          f"{'pinned: serving CPU 0, candidate + load CPU 1' if pinned else 'unpinned'}, "
          f"{threads} ONNX Runtime thread(s) per server", flush=True)  # fmt: skip
    log_dir = work / "logs"
    runs: list[Run] = []
    with ServerProcess(serving_spec, log_dir) as serving, \
            ServerProcess(candidate_spec, log_dir) as candidate:  # fmt: skip
        assert serving.process is not None and candidate.process is not None
        if pinned:
            pin(serving.process.pid, {0})
            pin(candidate.process.pid, {1})
            os.sched_setaffinity(0, {1})
        requests = [encode_json_infer(HOST, serving_spec.port, args.model, "input", x)
                    for x in items]  # fmt: skip
        for index in range(args.rounds):
            order = SHARES[index % 3 :] + SHARES[: index % 3]
            print(f"round {index + 1}", flush=True)
            for share in order:
                runs.append(one_run(args, share, serving, candidate, mirror_file, requests))
    print("\n" + table(runs))
    last = [r for r in runs if r.share == 100][-1]
    print(f"\n(compared and dropped: summed over the rounds, warm-up included; the int8 "
          f"candidate against fp32 in the last 100 % run: top-1 agreement {last.agreement}, "
          f"max |diff| {last.max_abs_difference})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
