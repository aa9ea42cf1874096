"""What the production checks cost a replica under load: the same saturating load on one
`kubeinfer serve` with and without `POST /v2/known-answers` (what the operator sends each
`intervalSeconds`) sent back to back, side by side in one run. A script, not a test.

    .venv/bin/python tests/benchmarks/bench_known_answer_cost.py [--rounds 3]
        [--duration 12] [--clients 32]

For each engine (the small and the memory-bound demo MLPs at fp32, built here into a
temporary cache), one server is loaded by perf_analyzer (HTTP, binary tensors, one row per
request) in interleaved rounds: a measured run without checks, then one during which a
client sends the checks one after another (each waits for an idle batcher, at most
`IDLE_WAIT_SECONDS`, then runs the set at the lowest priority). Per engine: requests/s
without and with (the median of the rounds' ratios), the checks run per minute, each
check's engine time under load (the server's `kubeinfer_known_answer_seconds_total`) and
its wall time (the wait for idle included), and the share of one replica's engine time
the checks take at the default interval (engine time per check / 300 s): the figure the
goal (under 0.5 %) is about. A throughput difference smaller than the rounds' spread is
noise, and the table says so by giving both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kubeinfer.cli.demo.mlp_models import build_memory_bound_mlp, build_small_mlp
from kubeinfer.cli.tune import perf
from kubeinfer.operator.api.v1alpha1.inference_deployment import KnownAnswersSpec
from kubeinfer.runtime.building.engine_build import build_engine
from prometheus_client.parser import text_string_to_metric_families
from servers import HOST, REPO, ServerProcess, kubeinfer_spec

MODEL = "m"
CHECK_SECONDS = "kubeinfer_known_answer_seconds"
DEFAULT_INTERVAL_SECONDS = KnownAnswersSpec().interval_seconds


@dataclass(frozen=True)
class Round:
    without_rps: float
    with_rps: float
    checks: int
    engine_seconds: float
    wall_seconds: float
    measured_seconds: float


def engine_seconds(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=30) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == f"{CHECK_SECONDS}_total"
    )


class Checker:
    """Sends the checks one after another while running, as the operator would if its
    interval were nothing; each must answer 200 and pass."""

    def __init__(self, url: str) -> None:
        self._url, self._stop = url, threading.Event()
        self.walls: list[float] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        try:
            self._check_until_stopped()
        except BaseException as error:  # raised again in the caller's thread, on exit
            self.error = error

    def _check_until_stopped(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            request = urllib.request.Request(self._url, method="POST", data=b"")
            with urllib.request.urlopen(request, timeout=60) as response:
                verdict = json.loads(response.read())["latest"]
            if verdict["result"] != "passed":
                raise RuntimeError(f"a check did not pass under load: {verdict}")
            self.walls.append(time.monotonic() - started)

    def __enter__(self) -> Checker:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)
        if self.error is not None:
            raise RuntimeError("a check failed under load") from self.error


def one_round(spec, samples, args, work: Path) -> Round:  # type: ignore[no-untyped-def]
    target = perf.Target(f"{HOST}:{spec.port}", MODEL, "http", "binary")
    load = perf.Load(concurrency=args.clients)
    window = args.duration / 3
    without = perf.run(target, load, samples, window, work / "without", args.warmup)
    marks: list[tuple[float, float]] = []
    checks_url = f"http://{HOST}:{spec.port}/v2/known-answers"
    with Checker(checks_url) as checker:
        during = perf.run(
            target, load, samples, window, work / "with", args.warmup,
            lambda: marks.append((time.monotonic(), engine_seconds(spec.metrics_url))),
        )  # fmt: skip
        walls = list(checker.walls)
    (start, engine_before), (end, engine_after) = marks
    return Round(
        without.requests_per_second, during.requests_per_second, len(walls),
        engine_after - engine_before, statistics.median(walls) if walls else 0.0, end - start,
    )  # fmt: skip


def row(name: str, rounds: list[Round]) -> str:
    ratios = [r.with_rps / r.without_rps for r in rounds]
    checks = sum(r.checks for r in rounds)
    per_check = sum(r.engine_seconds for r in rounds) / max(checks, 1)
    per_minute = checks / sum(r.measured_seconds for r in rounds) * 60
    share = per_check / DEFAULT_INTERVAL_SECONDS
    return (
        f"| {name} | {statistics.median(r.without_rps for r in rounds):.0f} | "
        f"{statistics.median(r.with_rps for r in rounds):.0f} | "
        f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
        f"{per_minute:.1f} | {per_check * 1000:.1f} | "
        f"{statistics.median(r.wall_seconds for r in rounds):.2f} | {share * 100:.4f} % |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=12.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    rows = []
    print(f"load average before: {os.getloadavg()[0]:.2f} on {threads} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-known-answer-cost-") as scratch:
        root = Path(scratch)
        models = {
            "small-mlp fp32": (build_small_mlp(root / "small.onnx"), 512),
            "memory-bound-mlp fp32": (build_memory_bound_mlp(root / "large.onnx"), 1024),
        }
        for name, (model, width) in models.items():
            built = build_engine(str(model), "onnxruntime", "fp32", root / "cache",
                                 max_batch_size=32)  # fmt: skip
            spec = kubeinfer_spec(model, MODEL, threads, engine=(built.digest, root / "cache"))
            rng = np.random.default_rng(7)
            samples = [{"input": rng.standard_normal((width,)).astype(np.float32)}
                       for _ in range(16)]  # fmt: skip
            rounds = []
            with ServerProcess(spec, root / "logs" / name.replace(" ", "-")):
                for number in range(args.rounds):
                    work = REPO / ".bench" / "perf-analyzer" / "known-answer-cost"
                    rounds.append(one_round(spec, samples, args, work))
                    each = rounds[-1]
                    print(f"{name} round {number + 1}: {each.without_rps:.0f} / "
                          f"{each.with_rps:.0f} req/s, {each.checks} checks, "
                          f"{each.engine_seconds * 1000:.1f} ms engine", flush=True)  # fmt: skip
            rows.append(row(name, rounds))
    print(f"\n{args.rounds} rounds of {args.duration:g} s measured at {args.clients} clients "
          f"each way; load average after {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print("| engine | req/s without checks | req/s with checks back to back | ratio (range) "
          "| checks/min | engine ms per check | wall s per check | share at "
          f"{DEFAULT_INTERVAL_SECONDS} s |")  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
