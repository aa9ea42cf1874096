"""The load generator's switch, measured: the same closed-loop load sent by our old client
and by Triton's perf_analyzer, against one `kubeinfer serve`, side by side in one run.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/bench_loadgen.py [--old 8c6df0c] [--rounds 3]
        [--clients 8,32] [--duration 6] [--warmup 1] [--quick]

The old client is the asyncio one the benchmarks used before the switch (`cli/tune/load.py`
and `tests/benchmarks/loadgen.py` at the commit `--old`, read with `git show` into a
scratch folder and imported from there). One server (the small demo MLP, ONNX Runtime,
one execution slot, REST and gRPC) is driven with single-item requests in Triton's binary
tensor form over HTTP and raw contents over gRPC, at each `--clients`, by both generators
in turn, `--rounds` interleaved rounds (which goes first alternates), so a shared
machine's drift falls on both alike. Per row: each generator's throughput, p50 and p99
(medians over the rounds), the server's CPU per request it answered and its mean batch
(its own counters, read around the measured window), the generator's own CPU per
request, and the medians of the rounds' ratios perf_analyzer / old.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
from kubeinfer.cli.demo.mlp_models import build_small_mlp
from kubeinfer.cli.tune import perf
from kubeinfer.cli.tune.server_side import Snapshot, between, snapshot
from servers import HOST, REPO, KubeinferSpec, ServerProcess, kubeinfer_spec

MODEL, INPUT, OUTPUT, WIDTH = "small-mlp", "input", "logits", 512
WIRES = ("http binary", "grpc")
GENERATORS = ("old", "perf_analyzer")


def old_client(revision: str, scratch: Path) -> ModuleType:
    """The old loadgen module (and the load module it re-exported), as of `revision`."""

    def show(path: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:{path}"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip

    (scratch / "old_load.py").write_text(show("cli/tune/load.py"))
    loadgen = show("tests/benchmarks/loadgen.py")
    (scratch / "old_loadgen.py").write_text(
        loadgen.replace("from kubeinfer.cli.tune.load import", "from old_load import")
    )
    sys.path.insert(0, str(scratch))
    return importlib.import_module("old_loadgen")


@dataclass
class Figures:
    throughput: float
    p50_ms: float
    p99_ms: float
    server_cpu_ms: float
    mean_batch: float
    client_cpu_us: float


def _server_figures(marks: list[Snapshot]) -> tuple[float, float, float]:
    side = between(*marks)
    answered = side.answered or 1.0
    return answered, (side.cpu_seconds or 0.0) / answered * 1000, side.mean_batch_rows or 0.0


def by_old(old: ModuleType, spec: KubeinferSpec, wire: str, clients: int, args, mark) -> Figures:
    items = np.random.default_rng(7).standard_normal((16, WIDTH)).astype(np.float32)
    marks: list[Snapshot] = []
    if wire == "grpc":
        requests = [old.encode_grpc_infer(MODEL, INPUT, x) for x in items]
        loop, port = old.run_closed_loop_grpc, spec.grpc_port
    else:
        requests = [
            old.encode_binary_infer(HOST, spec.port, MODEL, INPUT, OUTPUT, x) for x in items
        ]
        loop, port = old.run_closed_loop, spec.port
    result = asyncio.run(loop(
        HOST, port, requests, clients, args.warmup, args.duration,
        on_window_start=lambda: marks.append(mark()), on_window_end=lambda: marks.append(mark()),
    ))  # fmt: skip
    if result.errors:
        raise RuntimeError(f"the old client saw errors: {result.error_samples[:2]}")
    answered, server_ms, batch = _server_figures(marks)
    return Figures(result.throughput, result.percentile_ms(50), result.percentile_ms(99),
                   server_ms, batch, result.client_cpu_s / answered * 1e6)  # fmt: skip


def by_perf(spec: KubeinferSpec, wire: str, clients: int, args, mark) -> Figures:
    items = np.random.default_rng(7).standard_normal((16, WIDTH)).astype(np.float32)
    marks: list[Snapshot] = []
    target = (perf.Target(f"{HOST}:{spec.grpc_port}", MODEL, "grpc") if wire == "grpc"
              else perf.Target(f"{HOST}:{spec.port}", MODEL, "http", "binary"))  # fmt: skip
    result = perf.run(
        target, perf.Load(concurrency=clients), [{INPUT: x} for x in items], args.duration / 3,
        REPO / ".bench" / "perf-analyzer" / "loadgen", args.warmup, lambda: marks.append(mark()),
    )  # fmt: skip
    answered, server_ms, batch = _server_figures(marks)
    return Figures(result.requests_per_second, result.p50_milliseconds, result.p99_milliseconds,
                   server_ms, batch, result.client_cpu_seconds / answered * 1e6)  # fmt: skip


def median(values: list[float]) -> float:
    return statistics.median(values)


def table(runs: dict[tuple[str, int, str], list[Figures]], clients: list[int]) -> str:
    lines = [
        "| wire | clients | req/s old / perf_analyzer (ratio) | p50 ms old / perf_analyzer "
        "(ratio) | p99 ms old / perf_analyzer (ratio) | server CPU ms/req old / "
        "perf_analyzer | mean batch old / perf_analyzer | generator CPU µs/req old / "
        "perf_analyzer |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for wire in WIRES:
        for count in clients:
            old, new = runs[(wire, count, "old")], runs[(wire, count, "perf_analyzer")]

            def cell(
                get: Callable[[Figures], float], digits: int, ratio: bool = True,
                old: list[Figures] = old, new: list[Figures] = new,
            ) -> str:  # fmt: skip
                a, b = median([get(f) for f in old]), median([get(f) for f in new])
                text = f"{a:.{digits}f} / {b:.{digits}f}"
                if ratio:
                    ratios = [get(n) / get(o) for o, n in zip(old, new, strict=True) if get(o)]
                    text += f" ({median(ratios):.2f}x)"
                return text

            lines.append(
                f"| {wire} | {count} | {cell(lambda f: f.throughput, 0)} "
                f"| {cell(lambda f: f.p50_ms, 2)} | {cell(lambda f: f.p99_ms, 2)} "
                f"| {cell(lambda f: f.server_cpu_ms, 3, False)} "
                f"| {cell(lambda f: f.mean_batch, 1, False)} "
                f"| {cell(lambda f: f.client_cpu_us, 0, False)} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="8c6df0c", help="the commit of the old client")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--duration", type=float, default=6.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="1 round of 1.5 s")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 1.5, 0.5
    clients = [int(c) for c in args.clients.split(",")]
    runs: dict[tuple[str, int, str], list[Figures]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as scratch:
        old = old_client(args.old, Path(scratch))
        model = build_small_mlp(Path(scratch) / "small-mlp.onnx")
        threads = os.cpu_count() or 1
        spec = kubeinfer_spec(model, MODEL, threads, extra_args=("--execution-slots", "1"),
                              grpc=True)  # fmt: skip
        print(f"load average before: {os.getloadavg()[0]:.2f} on {threads} CPUs", flush=True)
        with ServerProcess(spec, Path(scratch) / "logs") as server:
            assert server.process is not None
            pid = server.process.pid

            def mark() -> Snapshot:
                return snapshot([pid], spec.metrics_url, MODEL)

            for number in range(args.rounds):
                order = GENERATORS if number % 2 == 0 else GENERATORS[::-1]
                for wire in WIRES:
                    for count in clients:
                        for generator in order:
                            figures = (by_old(old, spec, wire, count, args, mark)
                                       if generator == "old"
                                       else by_perf(spec, wire, count, args, mark))  # fmt: skip
                            runs.setdefault((wire, count, generator), []).append(figures)
                            print(f"round {number + 1} {wire:>11} {count:>3} clients "
                                  f"{generator:>13}: {figures.throughput:7.0f} req/s  p50 "
                                  f"{figures.p50_ms:6.2f} ms  p99 {figures.p99_ms:7.2f} ms",
                                  flush=True)  # fmt: skip
    print(f"\n{args.rounds} interleaved rounds, {args.warmup:g} s warm-up + "
          f"{args.duration:g} s measured each; load average after "
          f"{os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print(table(runs, clients))
    return 0


if __name__ == "__main__":
    sys.exit(main())
