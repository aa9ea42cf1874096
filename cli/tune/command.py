"""`kubeinfer tune`: find the static batching settings that meet a p99 SLO at the highest
throughput, by measuring them.

    kubeinfer tune MODEL --slo-p99-ms MS (--concurrency N | --rate R | --trace FILE)
                   [--rows 1,8,32 | --rows 1:6,8:3,32:1]
                   [--queue-delays-us 0,1000,4000] [--max-batch-sizes 8,32]
                   [--execution-slots 1,2] [--duration-seconds 5] [--warmup-seconds 1]
                   [--node-cost-per-hour PRICE] [--cache DIR] [--json] ...

MODEL is an ONNX file (built into the engine cache first, as `kubeinfer build` does) or
an engine directory of a cache (`CACHE/engines/<hex>`). For every combination of the
swept values, a real `kubeinfer serve` starts on a free loopback port, is offered the
traffic for the warm-up and then the measured window, and stops; a line per point goes to
stderr with the time left. Triton's perf_analyzer sends the traffic (JSON over HTTP; it
must be installed: the tune extra, or on Debian 12 `make .venv/bin/perf_analyzer`); a mix
of request sizes, which it cannot send in one run, goes through kubeinfer's own client.
Then stdout gets the points, the throughput/p99 frontier, and the `runtime.batching`
block of the highest-throughput point whose p99 meets the SLO (with every request
answered), with what it serves per CPU-second (per GPU-second for a GPU engine) and,
given the node's price, what 1,000 inferences (requests answered) cost, by the formula of
the operator's status.cost (`kubeinfer.contract.cost`); `--json` gives the same as one
JSON object.

Traffic: `--concurrency N` closed-loop clients, or `--rate R` requests per second
arriving as a Poisson process (open loop: a slow server is charged for the queue it
builds), with request sizes from `--rows`; or `--trace FILE`, a recording replayed in open
loop (its format: `kubeinfer.cli.tune.traffic`).

Exit codes: 0 with a setting that meets the SLO; 1 when none does (the closest point is
printed, marked as such) or no point could be measured; 2 for bad arguments or a model
that cannot be served; 130 when interrupted (Ctrl-C), after reporting the points measured
so far.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeinfer.cli.tune.frontier import Setting
    from kubeinfer.cli.tune.sweep import Traffic

DEFAULT_QUEUE_DELAYS_US = "0,1000,4000"
DEFAULT_EXECUTION_SLOTS = "1,2"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("the list is empty")
    return values


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="sweep the batcher's settings under a traffic shape and print the "
        "runtime.batching block that meets a p99 SLO at the highest throughput",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add = parser.add_argument
    add(
        "model",
        type=Path,
        metavar="MODEL",
        help="an ONNX file, or an engine directory of a cache (CACHE/engines/<hex>)",
    )
    add(
        "--slo-p99-ms",
        type=_positive(float),
        required=True,
        metavar="MS",
        help="the p99 latency the setting must meet, in milliseconds",
    )
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument(
        "--concurrency", type=_positive(int), metavar="N", help="N closed-loop clients"
    )
    shape.add_argument(
        "--rate",
        type=_positive(float),
        metavar="R",
        help="R requests per second, Poisson arrivals (open loop)",
    )
    shape.add_argument(
        "--trace",
        type=Path,
        metavar="FILE",
        help='a recorded trace, JSON lines {"offsetSeconds": S, "rows": N}, replayed in open loop',
    )
    add(
        "--rows",
        metavar="SIZES",
        help="request sizes in rows, with optional weights: 1,8,32 or 1:6,8:3,32:1 "
        "(default 1; not with --trace)",
    )
    add(
        "--queue-delays-us",
        type=_int_list,
        metavar="LIST",
        default=DEFAULT_QUEUE_DELAYS_US,
        help=f"maxQueueDelayMicroseconds values (default {DEFAULT_QUEUE_DELAYS_US})",
    )
    add(
        "--max-batch-sizes",
        type=_int_list,
        metavar="LIST",
        help="maxBatchSize values (default 8,32, each raised to the largest request's rows)",
    )
    add(
        "--execution-slots",
        type=_int_list,
        metavar="LIST",
        default=DEFAULT_EXECUTION_SLOTS,
        help=f"executionSlots values (default {DEFAULT_EXECUTION_SLOTS})",
    )
    add(
        "--duration-seconds",
        type=_positive(float),
        default=5.0,
        metavar="SECONDS",
        help="measured window per point (default 5)",
    )
    add(
        "--warmup-seconds",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="load before each window, not measured (default 1)",
    )
    add(
        "--node-cost-per-hour",
        type=_positive(float),
        metavar="PRICE",
        help="the node's price per hour, for the cost of 1,000 inferences (requests answered)",
    )
    add(
        "--cache",
        type=Path,
        metavar="DIR",
        help="engine cache to build an ONNX model into (default: a temporary one, removed "
        "at the end)",
    )
    add(
        "--backend",
        choices=("onnxruntime", "tensorrt"),
        default="onnxruntime",
        help="engine backend when building an ONNX model",
    )
    add(
        "--precision",
        choices=("fp32", "fp16"),
        default="fp32",
        help="engine precision when building (int8 needs calibration data: build with "
        "kubeinfer build, then tune its engine directory)",
    )
    add(
        "--intra-op-threads",
        type=_positive(int),
        metavar="N",
        help="ONNX Runtime threads of every point's server",
    )
    add(
        "--max-queue-size",
        type=_positive(int),
        metavar="N",
        help="maxQueueSize of every point's server (and of the block)",
    )
    add("--seed", type=int, default=0, help="seed of the arrivals and request sizes (default 0)")
    add("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)  # fmt: skip


def _error(message: str) -> int:
    print(f"kubeinfer tune: {message}", file=sys.stderr)
    return 2


class _Refused(Exception):
    """Arguments that describe no sweep; `run` prints the message and exits 2, as argparse
    does with its own refusals."""


def run(args: argparse.Namespace) -> int:
    from kubeinfer.cli.tune import perf, sweep

    if args.warmup_seconds < 0:
        return _error(f"--warmup-seconds must be at least 0, not {args.warmup_seconds:g}")
    try:
        shape, largest, described = _traffic(args)
        grid = _grid(args, largest)
    except _Refused as refusal:
        return _error(str(refusal))

    if len(sweep.traffic_sizes(shape)) == 1:  # perf_analyzer sends it: is it there?
        try:
            perf.find_perf_analyzer()
        except perf.PerfAnalyzerMissing as error:
            return _error(str(error))
    if args.model.is_dir() and args.cache is not None:
        return _error("--cache is where an ONNX model is built; an engine directory is served "
                      "from the cache it is in")  # fmt: skip
    temporary = None
    cache = args.cache
    if cache is None and not args.model.is_dir():
        temporary = Path(tempfile.mkdtemp(prefix="kubeinfer-tune-"))
        cache = temporary / "cache"
    try:
        return _sweep(args, grid, shape, described, cache)
    except sweep.TuneError as error:
        return _error(str(error))
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _traffic(args: argparse.Namespace) -> tuple[Traffic, int, str]:
    """The traffic the arguments describe over the warm-up and the window, the most rows
    one of its requests holds (every swept batch size must take it), and the words that
    name it in the progress lines and the report."""
    import numpy as np
    from kubeinfer.cli.tune import sweep, traffic

    until = args.warmup_seconds + args.duration_seconds
    rng = np.random.default_rng(args.seed)
    try:
        if args.trace is not None:
            if args.rows is not None:
                raise _Refused("--rows does not apply to --trace: the trace gives every size")
            try:
                text = args.trace.read_text()
            except OSError as error:
                raise _Refused(f"cannot read the trace: {error}") from None
            recorded = traffic.parse_trace(text, str(args.trace))
            replayed = sweep.OpenLoop(tuple(traffic.replay_trace(recorded, until)))
            largest = max(a.rows for a in recorded)
            described = (
                f"trace {args.trace} ({len(recorded)} requests per "
                f"{traffic.trace_period_seconds(recorded):.2f} s play), open loop"
            )
            return replayed, largest, described
        mix = traffic.parse_rows_mix(args.rows or "1")
        shares = zip(mix.rows, mix.shares, strict=True)
        sizes = ", ".join(
            f"{rows} row{'' if rows == 1 else 's'} {share:.0%}" for rows, share in shares
        )
        if args.concurrency is not None:
            closed = sweep.ClosedLoop(args.concurrency, mix)
            return closed, mix.largest, f"{args.concurrency} closed-loop clients, {sizes}"
        arrivals = traffic.poisson_arrivals(args.rate, until, mix, rng)
        described = f"{args.rate:g} requests/s, Poisson arrivals, {sizes}"
        return sweep.OpenLoop(tuple(arrivals)), mix.largest, described
    except traffic.TrafficError as error:
        raise _Refused(str(error)) from None


def _grid(args: argparse.Namespace, largest: int) -> list[Setting]:
    """Every combination of the swept values, refused when a value is one `kubeinfer
    serve` would refuse or a batch size cannot hold the largest request."""
    from kubeinfer.cli.tune import frontier as decide
    from pydantic import ValidationError

    batch_sizes = args.max_batch_sizes or decide.default_max_batch_sizes(largest)
    try:
        grid = decide.sweep_grid(args.queue_delays_us, batch_sizes, args.execution_slots)
    except ValidationError as error:
        first = error.errors()[0]
        raise _Refused(
            f"{'.'.join(map(str, first['loc']))}: {first['msg']} (a swept value)"
        ) from None
    smallest_batch = min(s.max_batch_size for s in grid)
    if largest > smallest_batch:
        raise _Refused(
            f"requests of {largest} rows need maxBatchSize >= {largest}, but "
            f"--max-batch-sizes includes {smallest_batch}: the server would refuse them"
        )
    return grid


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _sweep(
    args: argparse.Namespace,
    grid: list[Setting],
    shape: Traffic,
    described: str,
    cache: Path | None,
) -> int:
    from kubeinfer.cli.tune import frontier as decide
    from kubeinfer.cli.tune import report, sweep

    largest_batch = max(s.max_batch_size for s in grid)
    engine = sweep.prepare_engine(
        args.model.resolve(), cache, args.backend, args.precision, largest_batch,
        lambda line: _progress(f"build: {line}"),
    )  # fmt: skip
    key = engine.manifest.key
    timing = sweep.Timing(args.warmup_seconds, args.duration_seconds)
    options = sweep.ServerOptions(args.intra_op_threads, args.max_queue_size)
    per_point = args.warmup_seconds + args.duration_seconds
    _progress(
        f"Sweeping {len(grid)} point{'' if len(grid) == 1 else 's'} of {per_point:g} s each "
        f"(plus each server's start) against {key.backend} {key.precision} engine "
        f"{engine.digest[:19]}...: {described}"
    )
    points = []
    started = time.monotonic()
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="kubeinfer-tune-logs-") as logs:
        try:
            for index, setting in enumerate(grid, start=1):
                point = sweep.measure_point(engine, setting, shape, timing, options, Path(logs))
                points.append(point)
                eta = decide.eta_seconds(index, len(grid), time.monotonic() - started)
                _progress(report.progress_line(index, len(grid), point, args.slo_p99_ms, eta))
        except KeyboardInterrupt:  # the point's server is stopped on the way out
            interrupted = True
            _progress(f"Interrupted: the report covers the {len(points)} points measured")
    frontier = decide.pareto_frontier(points)
    choice = decide.choose(points, args.slo_p99_ms)
    context = report.Context(
        slo_p99_milliseconds=args.slo_p99_ms,
        traffic=described,
        engine=f"{key.backend} {key.precision} {engine.digest}",
        window=f"{args.duration_seconds:g} s measured after {args.warmup_seconds:g} s warm-up "
        "per point" + (f" (interrupted after {len(points)} of {len(grid)})" if interrupted else ""),
        gpu_engine=key.backend == "tensorrt",
        node_cost_per_hour=args.node_cost_per_hour,
        max_queue_size=args.max_queue_size,
    )
    if args.json:
        print(json.dumps(report.json_report(points, frontier, choice, context), indent=2))
    else:
        print(report.text_report(points, frontier, choice, context), end="")
    if interrupted:
        return 130
    return 0 if choice.meets_slo else 1
