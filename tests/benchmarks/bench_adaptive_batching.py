"""Batching policy Adaptive against a sweep of Static settings, under traffic whose mix
shifts over time (issue 20, item 1), measured in one run.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/bench_adaptive_batching.py [--rounds 3]
        [--phase-seconds 8] [--slo-ms 100] [--quick] [--json PATH]

The servers run with this interpreter and its import path (`python -m kubeinfer.cli
serve`), so on a checkout others are editing, run it from an export of a commit with
PYTHONPATH pointing there, as docs/latency-objective.md shows.

Each configuration is a real `kubeinfer serve` process (its RuntimeConfig from a
`--config` file, as the operator renders it) serving the memory-bound demo MLP ([batch,
1024] -> 3x4096 -> [batch, 1000], ~170 MB of weights: a batch of 1 costs nearly what a
batch of 8 does, as on a GPU) with ONNX Runtime, one intra-op thread, two execution slots
(TensorRT's default: a batch can wait for a free slot, which is what a queue delay is
about) and maxBatchSize 32. The same open-loop traffic goes to each, in three phases
played back to back without a pause: small requests at a moderate rate, large requests,
then a burst of small requests; arrivals are Poisson (a seeded schedule, the same for every
configuration), binary tensors, each request on an idle keep-alive connection; a
request's latency counts from when it was due (a server that falls behind is charged for
the queue it causes). The load is our own client's (`kubeinfer.cli.tune.load`): Triton's
perf_analyzer sends every request of a run with one batch size, and these phases change
it without a pause. A second of the first phase's traffic warms each server up, unmeasured.

The configurations: Adaptive with the SLO (sloMarginPercent 20) and Static with a sweep
of maxQueueDelayMicroseconds (no preferred sizes, so a batch waits for maxBatchSize), plus
Static on one execution slot (where the delay has no effect). Rounds interleave them (each
round runs every configuration once, in a rotated order), so the load of other processes
on a shared machine falls on all alike; the load average is printed before and after.

Per phase and configuration: the p99 latency of each round, their median (what "holds the
SLO" judges: a neighbour's burst in one round on a shared machine moves one round, not
the median) and the p99 of all rounds' requests pooled, the throughput (answered requests
per second of the phase; the median over rounds), and errors. The verdict per phase: Adaptive's p99
within the SLO, and its throughput against the best Static setting whose p99 holds it.
Adaptive's own choices (its setting and reason, from GET /v2/batching) are sampled through
each phase and shown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from kubeinfer.cli.demo.mlp_models import build_memory_bound_mlp
from kubeinfer.cli.tune.load import LoadGenError, open_connection
from kubeinfer.cli.tune.server import HOST, ServerProcess, ServerSpec, free_port, http_get

MODEL = "bench"
INPUT, OUTPUT, ITEM = "input", "logits", 1024


@dataclass(frozen=True)
class Phase:
    name: str
    rows: int
    rate: float
    """Requests per second."""
    seconds: float


@dataclass(frozen=True)
class Config:
    label: str
    batching: dict[str, object]


def phases(seconds: float, rate_scale: float = 1.0) -> list[Phase]:
    return [
        Phase("small", 1, 30 * rate_scale, seconds),
        Phase("large", 16, 15 * rate_scale, seconds),
        Phase("burst", 1, 300 * rate_scale, seconds),
    ]


def configs(slo_ms: float) -> list[Config]:
    common = {"maxBatchSize": 32, "executionSlots": 2}
    statics = [
        Config(f"static delay {us / 1000:g} ms", {**common, "maxQueueDelayMicroseconds": us})
        for us in (0, 2000, 10_000, 50_000)
    ]
    one_slot = Config("static 1 slot", {**common, "executionSlots": 1})
    adaptive = Config(
        f"adaptive (SLO {slo_ms:g} ms)", {**common, "policy": "Adaptive", "sloMarginPercent": 20}
    )
    return [adaptive, *statics, one_slot]


# --------------------------------------------------------------------------- requests


def binary_request(port: int, rows: int, seed: int) -> bytes:
    x = np.random.default_rng(seed).standard_normal((rows, ITEM)).astype(np.float32)
    data = x.tobytes()
    header = json.dumps({
        "inputs": [{"name": INPUT, "shape": [rows, ITEM], "datatype": "FP32",
                    "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": OUTPUT, "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    body = header + data
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        f"Connection: keep-alive\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n\r\n"
    )
    return head.encode() + body


def schedule(plan: list[Phase], warmup_s: float, seed: int) -> list[tuple[float, int]]:
    """(offset seconds, phase index; -1 for the warm-up) of every arrival: Poisson."""
    rng = np.random.default_rng(seed)
    arrivals: list[tuple[float, int]] = []
    start = 0.0
    for index, phase in [(-1, plan[0]), *enumerate(plan)]:
        length = warmup_s if index < 0 else phase.seconds
        t = start
        while True:
            t += rng.exponential(1 / phase.rate)
            if t >= start + length:
                break
            arrivals.append((t, index))
        start += length
    return arrivals


# --------------------------------------------------------------------------- one run


@dataclass
class PhaseResult:
    latencies: list[float] = field(default_factory=list)
    answered: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    settings: Counter[str] = field(default_factory=Counter)


async def play(
    port: int, plan: list[Phase], arrivals: list[tuple[float, int]], warmup_s: float
) -> list[PhaseResult]:
    """Sends every arrival when due, each on an idle connection (a new one when none is
    idle); waits for the answers (up to 30 s after the last is due)."""
    raws = {
        i: binary_request(port, p.rows, seed=i + 1) for i, p in [(-1, plan[0]), *enumerate(plan)]
    }
    results = [PhaseResult() for _ in plan]
    idle: list = []
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()

    async def one(due: float, index: int) -> None:
        while idle and not idle[-1].usable:
            idle.pop().close()
        try:
            conn = idle.pop() if idle else await open_connection(HOST, port)
            response = await conn.send(raws[index])
        except (LoadGenError, OSError) as error:
            if index >= 0:
                results[index].errors[type(error).__name__] += 1
            return
        done = loop.time()
        if response.headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            idle.append(conn)
        if index < 0:
            return
        if response.status == 200:
            results[index].latencies.append(done - due)
            results[index].answered += 1
        else:
            results[index].errors[str(response.status)] += 1

    start = loop.time() + 0.05
    for offset, index in arrivals:
        due = start + offset
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(one(due, index))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    for task in tasks:
        task.cancel()
    for conn in idle:
        conn.close()
    return results


def sample_settings(
    port: int, plan: list[Phase], warmup_s: float, results: list[PhaseResult], stop: threading.Event
) -> None:
    """Reads GET /v2/batching every 0.25 s and counts the settings seen in each phase."""
    started = time.monotonic() + 0.05
    edges = np.cumsum([warmup_s] + [p.seconds for p in plan])
    while not stop.wait(0.25):
        phase = int(np.searchsorted(edges, time.monotonic() - started, side="right")) - 1
        if not 0 <= phase < len(plan):
            continue
        try:
            _, body = http_get(f"http://{HOST}:{port}/v2/batching", timeout=1.0)
            status = json.loads(body)
        except (OSError, ValueError):
            continue
        if status.get("policy") == "Adaptive":
            delay_ms = status["queueDelayMicroseconds"] / 1000
            slots = status["parallelSlots"]
            together = "serialized" if slots is not None and slots < 1.25 else "overlapping"
            results[phase].settings[
                f"{status['preferredBatchSize']} rows / {delay_ms:g} ms, {together} "
                f"({status['reason']})"
            ] += 1


def run_config(
    config: Config,
    model: Path,
    slo_ms: float,
    plan: list[Phase],
    seed: int,
    workdir: Path,
    gpu_widths: list[int] | None = None,
) -> list[PhaseResult]:
    port = free_port()
    runtime_config = {
        "modelName": MODEL,
        "engine": {"onnxPath": str(model)},
        "batching": config.batching,
        "host": HOST,
        "httpPort": port,
        "intraOpThreads": 1,
        "sloP99LatencyMilliseconds": slo_ms,
    }
    config_path = workdir / f"config-{port}.yaml"
    config_path.write_text(yaml.safe_dump(runtime_config))
    # This interpreter and its import path: a snapshot of a commit runs as a whole.
    command = [sys.executable, "-m", "kubeinfer.cli", "serve", "--config", str(config_path)]
    if gpu_widths is not None:  # the same runtime, serving gpu_served's CuPy engine
        from gpu_served import server_command

        command = server_command(config_path, gpu_widths, graphs=False)
    warmup_s = 1.0
    arrivals = schedule(plan, warmup_s, seed)
    with ServerProcess(ServerSpec("kubeinfer", command, port, MODEL), workdir / "logs"):
        stop = threading.Event()
        results_holder: list[PhaseResult] = [PhaseResult() for _ in plan]
        sampler = threading.Thread(
            target=sample_settings, args=(port, plan, warmup_s, results_holder, stop), daemon=True
        )
        sampler.start()
        try:
            results = asyncio.run(play(port, plan, arrivals, warmup_s))
        finally:
            stop.set()
            sampler.join()
        for result, sampled in zip(results, results_holder, strict=True):
            result.settings = sampled.settings
    return results


# --------------------------------------------------------------------------- the report


def p99_ms(latencies: list[float]) -> float:
    return float(np.percentile(latencies, 99) * 1000) if latencies else float("nan")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def report(
    plan: list[Phase],
    runs: dict[str, list[list[PhaseResult]]],
    slo_ms: float,
    adaptive_label: str,
) -> tuple[str, dict[str, object]]:
    lines: list[str] = []
    summary: dict[str, object] = {}
    for index, phase in enumerate(plan):
        offered = phase.rate
        lines += [
            f"\n### Phase {index + 1}: {phase.name} ({phase.rows}-row requests, "
            f"{offered:g}/s offered, {phase.seconds:g} s)\n",
            "| configuration | p99 ms (median of rounds) | p99 ms per round | p99 ms pooled "
            "| req/s (median) | rows/s | errors | holds SLO |",
            "|---|--:|---|--:|--:|--:|--:|---|",
        ]
        figures: dict[str, dict[str, float | bool]] = {}
        for label, rounds in runs.items():
            per_round = [r[index] for r in rounds]
            pooled = p99_ms([x for r in per_round for x in r.latencies])
            throughput = statistics.median(r.answered / phase.seconds for r in per_round)
            errors = sum(sum(r.errors.values()) for r in per_round)
            rounds_p99 = [p99_ms(r.latencies) for r in per_round]
            p99 = statistics.median(rounds_p99)
            holds = p99 <= slo_ms and errors == 0
            figures[label] = {
                "p99_ms": p99,
                "p99_ms_rounds": rounds_p99,
                "p99_ms_pooled": pooled,
                "throughput": throughput,
                "holds": holds,
            }
            round_p99 = ", ".join(f"{x:.0f}" for x in rounds_p99)
            lines.append(
                f"| {label} | {p99:.1f} | {round_p99} | {pooled:.1f} | {throughput:.1f} | "
                f"{throughput * phase.rows:.0f} | {errors} | {'yes' if holds else 'no'} |"
            )
        statics = {k: v for k, v in figures.items() if k != adaptive_label and v["holds"]}
        # Throughput first; between equals (open loop: all that keep up), the lower p99.
        best = (
            max(statics, key=lambda k: (figures[k]["throughput"], -figures[k]["p99_ms"]))
            if statics
            else None
        )
        mine = figures[adaptive_label]
        ratio = mine["throughput"] / figures[best]["throughput"] if best else float("nan")
        met = bool(mine["holds"]) and (best is None or ratio >= 0.95)
        settings: Counter[str] = Counter()
        for r in runs[adaptive_label]:
            settings.update(r[index].settings)
        seen = ", ".join(f"{s} x{n}" for s, n in settings.most_common(4))
        lines.append(
            f"\nAdaptive p99 {mine['p99_ms']:.1f} ms ({'within' if mine['holds'] else 'over'} the "
            f"{slo_ms:g} ms SLO); best Static holding the SLO: {best or 'none'}; Adaptive's "
            f"throughput / its: {ratio:.3f}; goal {'met' if met else 'MISSED'}. "
            f"Adaptive's settings sampled: {seen or 'none'}."
        )
        summary[phase.name] = {"figures": figures, "best_static": best, "ratio": ratio, "met": met}
    return "\n".join(lines), summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-seconds", type=float, default=8.0)
    parser.add_argument("--slo-ms", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s phases")
    parser.add_argument("--only", nargs="*", help="labels to run (default: all)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--gpu-widths",
        help="serve gpu_served.py's CuPy MLP of these layer widths on the GPU instead "
        f"(the first must be {ITEM}), e.g. 1024,8192,8192,8192,1000",
    )
    parser.add_argument("--rate-scale", type=float, default=1.0, help="multiplies every rate")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.phase_seconds = 1, 3.0
    gpu_widths = [int(w) for w in args.gpu_widths.split(",")] if args.gpu_widths else None
    if gpu_widths is not None and gpu_widths[0] != ITEM:
        parser.error(f"--gpu-widths must start with {ITEM}, the requests' row width")
    plan = phases(args.phase_seconds, args.rate_scale)
    all_configs = configs(args.slo_ms)
    adaptive_label = all_configs[0].label
    chosen = [
        c for c in all_configs if not args.only or c.label in args.only or c is all_configs[0]
    ]
    print(f"load average before: {loadavg()} on {os.cpu_count()} CPUs", flush=True)
    runs: dict[str, list[list[PhaseResult]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bench-adaptive-") as scratch:
        workdir = Path(scratch)
        model = build_memory_bound_mlp(workdir / "memory-bound.onnx")
        for round_index in range(args.rounds):
            shift = round_index % len(chosen)
            for config in chosen[shift:] + chosen[:shift]:
                started = time.monotonic()
                runs[config.label].append(
                    run_config(config, model, args.slo_ms, plan, args.seed, workdir, gpu_widths)
                )
                print(
                    f"round {round_index + 1}: {config.label} in "
                    f"{time.monotonic() - started:.0f} s, load {loadavg()}",
                    file=sys.stderr,
                    flush=True,
                )
    text, summary = report(
        plan, {c.label: runs[c.label] for c in chosen}, args.slo_ms, adaptive_label
    )
    print(text)
    print(f"\nload average after: {loadavg()}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
