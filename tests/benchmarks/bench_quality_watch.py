"""What the quality watch costs the serving runtime: no watch, and the watch sampling 1 %
and 5 % of its requests to a real fp32 reference, side by side in one run.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/bench_quality_watch.py [--quick] [--rounds 3]
        [--no-pin] [--model small-mlp|memory-bound-mlp] [--shares 0,1,5]
        [--baseline TREE] [--broken-references]

The harness is `mirror_harness.py`'s (shared with `bench_shadow.py`: the same servers,
pinning, load generator and CPU accounting); only the roles turn around: the serving
serves a demo MLP's int8 engine and the reference its fp32 engine, both built through the
engine cache and started as `kubeinfer serve` processes on loopback. The serving's
`--mirror-target-file` is rewritten between runs (atomically, as kubelet does) to hold no
watch (an empty file) or a `qualityWatch` at each share of `--shares` with a slice header
(which the load's requests do not carry: they count as `other`, and the header is looked
up on every request) and the default exemplar buffer (16 rows), so every per request cost
the watch adds is in the figures; each run starts once /v2/quality shows the new share.

`--baseline TREE` runs a second serving from the kubeinfer source tree at TREE (say
`git archive <commit> runtime contract cli operator cluster | tar -x -C TREE`), beside
this checkout's, on the same CPU, against the same reference, so a change's before and
after come from one run. Every (serving, share) condition runs in each of `--rounds`
interleaved rounds, in a rotating order; each figure is the median over the rounds, and
the ratios are against the same serving with no watch.

`--broken-references` measures instead what a broken reference costs the serving: no
watch, then a watch at 100 % (200 ms timeout, a queue of 8) whose reference answers a
second late (a scripted aiohttp server) or is a port nobody listens on, in interleaved
rounds; per condition the serving's p99 and each round's p99 against the same round's
no watch. (The test suite asserts the mechanism instead: the serving answers while the
mirror's requests are still unanswered, `test_quality_e2e.py`.)
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import mirror_harness as harness
import numpy as np
from servers import HOST, REPO, ServerProcess, free_port

THIS = "this checkout"


def quality_status(port: int) -> dict:
    return harness.get_json(port, "/v2/quality")


def set_share(mirror_file: Path, serving_port: int, reference_port: int, share: int,
              model: str) -> None:  # fmt: skip
    """Rewrites the mirror file for a watch at `share` % (0: none) and waits for it."""
    harness.write_mirror_file(mirror_file, None if share == 0 else {"qualityWatch": {
        "reference": {"url": f"http://{HOST}:{reference_port}", "modelName": model,
                      "candidateVersion": "fp32",
                      "candidateDigest": f"bench-{share}-{time.monotonic_ns()}",
                      "trafficPercent": share},
        "sliceHeader": "X-Tenant",
    }})  # fmt: skip
    harness.wait_until(
        lambda: quality_status(serving_port),
        lambda s: (share == 0 and not s["active"]) or s["samplePercent"] == share,
        f"the serving did not take the {share} % watch",
    )


@dataclass
class Serving:
    label: str
    process: ServerProcess
    mirror_file: Path
    samples: list[dict[str, np.ndarray]]


@dataclass
class Run:
    serving: str
    share: int
    throughput: float
    p50_ms: float
    p99_ms: float
    serving_cpu_ms: float
    compared: int
    dropped: int
    effective_rate: float | None
    agreement: float | None


def one_run(
    args: argparse.Namespace, serving: Serving, share: int, reference: ServerProcess
) -> Run:
    process = serving.process
    assert process.process is not None
    set_share(serving.mirror_file, process.spec.port, reference.spec.port, share, args.model)
    window = harness.measure(args, process.spec, serving.samples, [process.process.pid])
    time.sleep(1.0)  # the last samples gathered (up to 0.5 s) are compared by then
    status = quality_status(process.spec.port)
    run = Run(
        serving=serving.label,
        share=share,
        throughput=window.throughput,
        p50_ms=window.p50_ms,
        p99_ms=window.p99_ms,
        serving_cpu_ms=window.cpu_ms[0],
        compared=status["requests"]["compared"],
        dropped=status["requests"]["dropped"],
        effective_rate=status["effectiveSampleRate"],
        agreement=status["top1"]["agreement"],
    )
    print(f"  {serving.label[:24]:>24} {share:>3} %: {run.throughput:7.0f} req/s  "
          f"p50 {run.p50_ms:6.2f} ms  p99 {run.p99_ms:6.2f} ms  "
          f"serving CPU {run.serving_cpu_ms:5.3f} ms/req  compared {run.compared}  "
          f"dropped {run.dropped}  effective rate {run.effective_rate}", flush=True)  # fmt: skip
    return run


def table(runs: list[Run], shares: tuple[int, ...]) -> str:
    lines = [
        "| serving | watch | req/s | vs none | p50 ms | p99 ms | p99 vs none "
        "| serving CPU ms/req | vs none | compared | dropped | effective rate |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in dict.fromkeys(r.serving for r in runs):
        mine = [r for r in runs if r.serving == label]

        def med(share: int, field: str, of: list[Run] = mine) -> float:
            return harness.median([getattr(r, field) for r in of if r.share == share])

        base_throughput, base_cpu, base_p99 = (
            med(0, "throughput"), med(0, "serving_cpu_ms"), med(0, "p99_ms"),
        )  # fmt: skip
        for share in shares:
            runs_at = [r for r in mine if r.share == share]
            throughput, cpu, p99 = (
                med(share, "throughput"), med(share, "serving_cpu_ms"), med(share, "p99_ms"),
            )  # fmt: skip
            rates = [r.effective_rate for r in runs_at if r.effective_rate is not None]
            lines.append(
                f"| {label} | {'none' if share == 0 else f'{share} %'} | {throughput:.0f} "
                f"| {throughput / base_throughput:.3f} | {med(share, 'p50_ms'):.2f} "
                f"| {p99:.2f} | {p99 / base_p99:.3f} | {cpu:.3f} | {cpu / base_cpu:.3f} "
                f"| {sum(r.compared for r in runs_at)} | {sum(r.dropped for r in runs_at)} "
                f"| {harness.median(rates) if rates else 0:.4f} |"
            )
    return "\n".join(lines)


def spreads(runs: list[Run], shares: tuple[int, ...]) -> str:
    """Each round's throughput ratio against the same round's no watch, so the noise of
    the machine shows beside the medians."""
    lines = []
    for label in dict.fromkeys(r.serving for r in runs):
        mine = [r for r in runs if r.serving == label]
        none = [r.throughput for r in mine if r.share == 0]
        for share in shares[1:]:
            ratios = [r.throughput / base for r, base in
                      zip([r for r in mine if r.share == share], none, strict=True)]  # fmt: skip
            lines.append(f"{label}, {share} %: per round " +
                         " ".join(f"{x:.3f}" for x in ratios) +
                         f"; their median {harness.median(ratios):.3f}")  # fmt: skip
    return "\n".join(lines)


SLOW_REFERENCE = """
import asyncio, sys
from aiohttp import web

async def infer(request):
    await request.read()
    await asyncio.sleep(1.0)
    return web.json_response({"error": "answered too late"}, status=503)

app = web.Application()
app.router.add_post("/v2/models/{name}/infer", infer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, shutdown_timeout=0.1)
"""


def broken_watch(mirror_file: Path, serving_port: int, url: str | None, model: str) -> None:
    """A watch at 100 % to `url` with a short timeout and a small queue (None: no watch),
    and waits until the serving runs it."""
    digest = f"bench-broken-{time.monotonic_ns()}"
    harness.write_mirror_file(mirror_file, None if url is None else {"qualityWatch": {"reference": {
        "url": url, "modelName": model, "candidateVersion": "fp32", "candidateDigest": digest,
        "trafficPercent": 100, "policy": {"timeoutMilliseconds": 200, "maxQueueSize": 8},
    }}})  # fmt: skip
    harness.wait_until(
        lambda: quality_status(serving_port),
        lambda s: (
            not s["active"] if url is None else (s["reference"] or {}).get("digest") == digest
        ),
        f"the serving did not take the watch to {url}",
    )


def broken_references(args: argparse.Namespace, serving: Serving, references: dict) -> str:
    """The serving's p99 with no watch and with a watch to each broken reference, in
    interleaved rounds: a table of medians and each round's ratio to no watch."""
    process = serving.process
    assert process.process is not None
    p99s: dict[str, list[float]] = {name: [] for name in references}
    throughputs: dict[str, list[float]] = {name: [] for name in references}
    for index, order in harness.rotations(list(references), args.rounds):
        for name in order:
            broken_watch(serving.mirror_file, process.spec.port, references[name], args.model)
            window = harness.measure(args, process.spec, serving.samples, [process.process.pid])
            p99s[name].append(window.p99_ms)
            throughputs[name].append(window.throughput)
            print(f"round {index + 1} {name}: {window.throughput:.0f} req/s, p99 "
                  f"{window.p99_ms:.2f} ms", flush=True)  # fmt: skip
    broken_watch(serving.mirror_file, process.spec.port, None, args.model)
    lines = ["| reference | req/s | p99 ms | p99 / no watch, per round | their median |",
             "|---|---:|---:|---|---:|"]  # fmt: skip
    for name in references:
        ratios = [on / off for on, off in zip(p99s[name], p99s["none"], strict=True)]
        per_round = " ".join(f"{r:.2f}" for r in ratios)
        throughput, p99 = harness.median(throughputs[name]), harness.median(p99s[name])
        lines.append(f"| {name} | {throughput:.0f} | {p99:.2f} "
                     f"| {per_round} | {harness.median(ratios):.2f} |")  # fmt: skip
    return "\n".join(lines)


def slow_reference(log_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "slow-reference.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-c", SLOW_REFERENCE, str(port)],
                                   stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    harness.wait_until(lambda: process.poll(), lambda code: code is None and _listening(port),
               "the slow reference did not start")  # fmt: skip
    return process, f"http://{HOST}:{port}"


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((HOST, port)) == 0


def more_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shares", default="0,1,5", help="sampling shares in percent, 0 (no watch) first"
    )
    parser.add_argument(
        "--baseline", type=Path, metavar="TREE", help="also run an older tree's serving"
    )
    parser.add_argument(
        "--broken-references", action="store_true",
        help="measure a slow and a dead reference against no watch instead",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = harness.parse_args("kubeinfer quality watch benchmark", argv, more_options)
    shares = tuple(int(s) for s in args.shares.split(","))
    if shares[0] != 0:
        raise SystemExit("--shares must start with 0 (no watch): the ratios are against it")
    pinned, threads = harness.pinned_threads(args)
    work = REPO / ".bench" / "quality-watch"
    engines = harness.build_engines(work, args.model)
    trees = [(THIS, None)] + ([(f"baseline {args.baseline}", args.baseline)]
                              if args.baseline else [])  # fmt: skip
    specs = []
    for index, (label, tree) in enumerate(trees):
        mirror_file = harness.empty_mirror_file(work / "mirror" / f"mirror-{index}.json")
        spec = harness.engine_spec(
            engines, args.model, threads, "int8", f"serving-{index}", mirror_file
        )
        if tree is not None:
            spec = harness.from_tree(spec, tree, work / "baseline-package")
        specs.append((label, spec, mirror_file))
    reference_spec = harness.engine_spec(engines, args.model, threads, "fp32", "reference")
    print(f"kubeinfer quality watch benchmark: {args.model} int8 serving ({len(trees)} "
          f"tree(s)), fp32 reference, {args.clients} closed-loop clients, {args.rounds} "
          f"rounds of {args.warmup:g} s + {args.duration:g} s per condition, "
          f"{'pinned: serving CPU 0, reference + load CPU 1' if pinned else 'unpinned'}, "
          f"{threads} ONNX Runtime thread(s) per server; load average before "
          f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    log_dir = work / "logs"
    runs: list[Run] = []
    with ExitStack() as running:
        reference = running.enter_context(ServerProcess(reference_spec, log_dir))
        servings = [Serving(label, running.enter_context(ServerProcess(spec, log_dir)),
                            mirror_file, harness.samples_for(args.model))
                    for label, spec, mirror_file in specs]  # fmt: skip
        assert reference.process is not None
        if pinned:
            for serving in servings:
                assert serving.process.process is not None
                harness.pin(serving.process.process.pid, {0})
            harness.pin(reference.process.pid, {1})
            os.sched_setaffinity(0, {1})
        if args.broken_references:
            slow, slow_url = slow_reference(log_dir)
            running.callback(slow.wait, 30)
            running.callback(slow.terminate)
            references = {"none": None, "slow": slow_url, "dead": f"http://{HOST}:{free_port()}"}
            print("\n" + broken_references(args, servings[0], references))
            return 0
        conditions = [(serving, share) for serving in servings for share in shares]
        for index, order in harness.rotations(conditions, args.rounds):
            print(f"round {index + 1}", flush=True)
            for serving, share in order:
                runs.append(one_run(args, serving, share, reference))
    print("\n" + table(runs, shares))
    print("\n" + spreads(runs, shares))
    last = [r for r in runs if r.share == max(shares)][-1]
    print(f"\n(compared and dropped: summed over the rounds, warm-up included; effective "
          f"rate: compared / answered since the watch started, median over the rounds; the "
          f"int8 serving against fp32 in the last {last.share} % run: top-1 agreement "
          f"{last.agreement}; load average after {os.getloadavg()[0]:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
