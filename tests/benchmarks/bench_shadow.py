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
and each run starts once /v2/shadow shows the new share. 32 closed-loop clients
(perf_analyzer's) send single-item JSON requests. The three shares run in `--rounds`
interleaved rounds, in a rotating order, so drift on a shared machine falls
on every share alike; each figure is the median over the rounds.

Per share: throughput, p50/p99 at the client, the serving's and the candidate's CPU per
serving request (from /proc), and what /v2/shadow counted (compared, dropped). The
serving's CPU per request is the cost of the mirror itself (encoding the candidate's
request, the HTTP client, decoding and comparing), which throughput alone hides on a
2-core machine where the candidate takes its CPU from the same cores.

The harness (building, pinning: `--pin`, the default, or `--no-pin`, the load window and
its CPU accounting, the rounds) is `mirror_harness.py`'s, shared with
`bench_quality_watch.py`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import mirror_harness as harness
from servers import HOST, REPO, ServerProcess

SHARES = (0, 10, 100)


def shadow_status(port: int) -> dict:
    return harness.get_json(port, "/v2/shadow")


def set_share(
    mirror_file: Path, serving_port: int, candidate_port: int, share: int, model: str
) -> None:
    """Rewrites the mirror file for `share` % and waits until the serving shows it."""
    harness.write_mirror_file(mirror_file, None if share == 0 else {"target": {
        "url": f"http://{HOST}:{candidate_port}", "modelName": model,
        "candidateVersion": "int8", "candidateDigest": f"bench-{share}-{time.monotonic_ns()}",
        "trafficPercent": share,
    }})  # fmt: skip
    harness.wait_until(
        lambda: shadow_status(serving_port),
        lambda s: (share == 0 and not s["active"]) or s["trafficPercent"] == share,
        f"the serving did not take the {share} % target",
    )


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
    agreement: float | None
    max_abs_difference: float | None


def one_run(args, share, serving, candidate, mirror_file, samples) -> Run:
    set_share(mirror_file, serving.spec.port, candidate.spec.port, share, args.model)
    window = harness.measure(args, serving.spec, samples,
                     [serving.process.pid, candidate.process.pid])  # fmt: skip
    status = shadow_status(serving.spec.port)
    run = Run(
        share=share,
        throughput=window.throughput,
        p50_ms=window.p50_ms,
        p99_ms=window.p99_ms,
        serving_cpu_ms=window.cpu_ms[0],
        candidate_cpu_ms=window.cpu_ms[1],
        compared=status["requests"]["compared"],
        dropped=status["requests"]["dropped"],
        agreement=status["top1"]["agreement"],
        max_abs_difference=status["maxAbsDifference"],
    )
    print(f"  {share:>3} %: {run.throughput:7.0f} req/s  p50 {run.p50_ms:6.2f} ms  "
          f"p99 {run.p99_ms:6.2f} ms  serving CPU {run.serving_cpu_ms:5.3f} ms/req  "
          f"candidate CPU {run.candidate_cpu_ms:5.3f} ms/req  compared {run.compared}  "
          f"dropped {run.dropped}", flush=True)  # fmt: skip
    return run


def table(runs: list[Run]) -> str:
    by_share = {share: [r for r in runs if r.share == share] for share in SHARES}

    def med(share: int, field: str) -> float:
        return harness.median([getattr(r, field) for r in by_share[share]])

    base_throughput, base_cpu = med(0, "throughput"), med(0, "serving_cpu_ms")
    lines = [
        "| mirrored | req/s | vs 0 % | p50 ms | p99 ms | serving CPU ms/req | vs 0 % "
        "| candidate CPU ms/req | compared | dropped |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for share in SHARES:
        throughput, cpu = med(share, "throughput"), med(share, "serving_cpu_ms")
        lines.append(
            f"| {share} % | {throughput:.0f} | {throughput / base_throughput:.3f} "
            f"| {med(share, 'p50_ms'):.2f} | {med(share, 'p99_ms'):.2f} "
            f"| {cpu:.3f} | {cpu / base_cpu:.3f} | {med(share, 'candidate_cpu_ms'):.3f} "
            f"| {sum(r.compared for r in by_share[share])} "
            f"| {sum(r.dropped for r in by_share[share])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args: argparse.Namespace = harness.parse_args("kubeinfer shadow mirroring benchmark", argv)
    pinned, threads = harness.pinned_threads(args)
    work = REPO / ".bench" / "shadow"
    engines = harness.build_engines(work, args.model)
    mirror_file = harness.empty_mirror_file(work / "mirror" / "target.json")
    serving_spec = harness.engine_spec(engines, args.model, threads, "fp32", "serving", mirror_file)
    candidate_spec = harness.engine_spec(engines, args.model, threads, "int8", "candidate")
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
            harness.pin(serving.process.pid, {0})
            harness.pin(candidate.process.pid, {1})
            os.sched_setaffinity(0, {1})
        samples = harness.samples_for(args.model)
        for index, order in harness.rotations(SHARES, args.rounds):
            print(f"round {index + 1}", flush=True)
            for share in order:
                runs.append(one_run(args, share, serving, candidate, mirror_file, samples))
    print("\n" + table(runs))
    last = [r for r in runs if r.share == 100][-1]
    print(f"\n(compared and dropped: summed over the rounds, warm-up included; the int8 "
          f"candidate against fp32 in the last 100 % run: top-1 agreement {last.agreement}, "
          f"max |diff| {last.max_abs_difference})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
