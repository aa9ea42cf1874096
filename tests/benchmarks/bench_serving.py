"""`make bench`: kubeinfer against an unbatched server and MLServer, on this machine.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/bench_serving.py [--quick] [--out .bench/results.md]

For each deterministic model from `kubeinfer.cli.demo.mlp_models` (the overhead-bound
small MLP and the ~170 MB memory-bound MLP) it measures the in-process ONNX Runtime
ceiling at batch 1..64, then starts each server as a subprocess on a loopback port (one
at a time), checks its answers against ONNX Runtime in-process (through tritonclient),
and drives it with 1, 8, 32 and 64 closed-loop clients sending single-item requests (v2
JSON; Triton binary too at 32 clients) from perf_analyzer (`kubeinfer.cli.tune.perf`: a
warm-up run, then three windows making up `--duration`). Before those, one kubeinfer
serving both REST and gRPC is driven over REST JSON, REST binary and gRPC at 1 and 32
clients in `--transport-rounds` interleaved rounds (`transports.py`; `--transports-only`
runs just that; `--baseline TREE` runs an older source tree's server beside this
checkout's in the same rounds). The mean batch size and the server's CPU per request are
the deltas of the server's own counters over the measured run. Last, the memory-bound
model's fp32 and int8 engines, built through `kubeinfer build`, are served side by side.
It prints one Markdown report (serving table, ceiling table, gRPC beside REST, int8
table, the issue's targets) and writes it to `--out`.

Every server gets the same ONNX Runtime session settings as kubeinfer's engine:
`--threads` intra-op threads (default: the CPU count, ONNX Runtime's own default here), one
inter-op thread, no spin-waiting. kubeinfer runs one execution slot (`--kubeinfer-args`):
its threads already use every core. All of it is printed in the report's header.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from engine_ceiling import measure_ceiling, reference_outputs
from kubeinfer.cli.demo.mlp_models import build_memory_bound_mlp, build_small_mlp
from kubeinfer.cli.tune import perf
from kubeinfer.cli.tune.server_side import BATCH_SIZE, Counts, read_counts
from report import (
    Int8Comparison,
    Row,
    ceiling_table,
    check_targets,
    int8_table,
    serving_table,
    targets_table,
)
from servers import (
    HOST,
    REPO,
    KubeinferSpec,
    ServerFailed,
    ServerProcess,
    ServerSpec,
    http_get,
    kubeinfer_spec,
    mlserver_spec,
    unbatched_spec,
)
from transports import (
    BEFORE,
    baseline_spec,
    before_after_table,
    compare_transports,
    of_server,
    transports_table,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # waiting
from waiting import wait_for

SMALL, MEMORY = "small-mlp", "memory-bound-mlp"
MODELS = {SMALL: build_small_mlp, MEMORY: build_memory_bound_mlp}
INPUT, OUTPUT = "input", "logits"
DISTINCT_REQUESTS = 16


# --------------------------------------------------------------------------- CPU accounting

_TICK = os.sysconf("SC_CLK_TCK")


def _busy_cpu_s() -> float:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / _TICK


def _session_cpu_s(session_id: int) -> float:
    """CPU of every live process in a session (a server and its workers)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session_id:
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


# --------------------------------------------------------------------------- metrics


@dataclass
class Snapshot:
    busy_s: float
    server_s: float
    counts: Counts
    at: float
    """time.monotonic() when it was taken."""


def snapshot(spec: ServerSpec, server: ServerProcess) -> Snapshot:
    """The machine's busy CPU, the server's (its session's), and its own counters:
    kubeinfer's, or the batch sizes our MLServer runtime logs as `bench_batch_size`."""
    assert server.process is not None
    counts = Counts(None, None, None)
    if spec.metrics_url:
        status, body = http_get(spec.metrics_url)
        if status == 200:
            name = "bench_batch_size" if spec.label == "mlserver" else BATCH_SIZE
            counts = read_counts(body.decode(), spec.model_name, name)
    return Snapshot(_busy_cpu_s(), _session_cpu_s(server.process.pid), counts, time.monotonic())


# --------------------------------------------------------------------------- one server


def check_answers(spec: ServerSpec, items: np.ndarray, encoding: str, expected: np.ndarray) -> None:
    """Every distinct request once through tritonclient, answered with ONNX Runtime's
    own output."""
    grpc = encoding == "grpc"
    if grpc:
        import tritonclient.grpc as client_lib
    else:
        import tritonclient.http as client_lib  # type: ignore[no-redef]
    port = spec.grpc_port if isinstance(spec, KubeinferSpec) and grpc else spec.port
    client = client_lib.InferenceServerClient(f"{HOST}:{port}")
    binary = {} if grpc else {"binary_data": encoding == "binary"}
    try:
        for index, item in enumerate(items):
            tensor = client_lib.InferInput(INPUT, [1, item.size], "FP32")
            tensor.set_data_from_numpy(item[None].astype(np.float32), **binary)
            answer = client.infer(
                spec.model_name,
                [tensor],
                outputs=[client_lib.InferRequestedOutput(OUTPUT, **binary)],
            )
            if not np.allclose(answer.as_numpy(OUTPUT)[0], expected[index], 1e-3, 1e-3):
                raise ServerFailed(f"{spec.label}: wrong {encoding} output for request {index}")
    finally:
        client.close()


def load_runs(
    spec: ServerSpec,
    server: ServerProcess,
    model: str,
    items: np.ndarray,
    expected: np.ndarray,
    plan: list[tuple[str, int]],
    args: argparse.Namespace,
    label: str | None = None,
) -> list[Row]:
    rows = []
    for encoding in dict.fromkeys(e for e, _ in plan):
        check_answers(spec, items, encoding, expected)
    for encoding, clients in plan:
        best: Row | None = None
        for attempt in range(args.retries + 1):
            wait_for_quiet(args)
            row = one_run(spec, server, model, items, encoding, clients, args, label)
            if best is None or row.foreign_cpu_pct < best.foreign_cpu_pct:
                best = row
            if row.foreign_cpu_pct <= args.max_other_cpu:
                break
            print(f"  (other processes used {row.foreign_cpu_pct:.0f}% CPU: run {attempt + 1} "
                  f"of {args.retries + 1})", flush=True)  # fmt: skip
        assert best is not None
        rows.append(best)
    return rows


def wait_for_quiet(args: argparse.Namespace) -> None:
    """With `--max-other-cpu` set, waits (up to `--quiet-timeout`) until the machine's
    busy CPU over one second is below it: a shared machine's neighbours come and go."""
    if args.max_other_cpu >= 100:
        return

    def quiet() -> bool:
        before = _busy_cpu_s()
        time.sleep(1.0)  # not a wait: the second the busy CPU is measured over
        return (_busy_cpu_s() - before) / (os.cpu_count() or 1) * 100 < args.max_other_cpu

    with contextlib.suppress(AssertionError):  # never quiet: measured anyway, as before
        wait_for(quiet, within=args.quiet_timeout, every=0)


def one_run(
    spec: ServerSpec,
    server: ServerProcess,
    model: str,
    items: np.ndarray,
    encoding: str,
    clients: int,
    args: argparse.Namespace,
    label: str | None,
) -> Row:
    """perf_analyzer's closed loop of single-item requests; the server's CPU and counters
    and the machine's busy CPU over its measured run."""
    grpc_port = spec.grpc_port if isinstance(spec, KubeinferSpec) else None
    if encoding == "grpc":
        assert grpc_port is not None, "gRPC asked of a server without a gRPC port"
        target = perf.Target(f"{HOST}:{grpc_port}", spec.model_name, "grpc")
    else:
        target = perf.Target(f"{HOST}:{spec.port}", spec.model_name, "http", encoding)
    marks: list[Snapshot] = []
    result = perf.run(
        target, perf.Load(concurrency=clients), [{INPUT: x} for x in items],
        args.duration / 3, REPO / ".bench" / "perf-analyzer" / spec.label, args.warmup,
        lambda: marks.append(snapshot(spec, server)),
    )  # fmt: skip
    start, end = marks
    span = end.at - start.at
    mean_batch = None
    if None not in (start.counts.rows, end.counts.rows, start.counts.batches, end.counts.batches):
        batches = end.counts.batches - start.counts.batches  # type: ignore[operator]
        if batches > 0:
            mean_batch = (end.counts.rows - start.counts.rows) / batches  # type: ignore[operator]
    # Requests over the run: the server's own count where it keeps one, else
    # perf_analyzer's throughput over the run's time.
    answered = (
        end.counts.answered - start.counts.answered
        if end.counts.answered is not None and start.counts.answered is not None
        else result.requests_per_second * span
    )
    answered = max(answered, 1.0)
    server_s = end.server_s - start.server_s
    foreign = (end.busy_s - start.busy_s) - server_s - result.client_cpu_seconds
    row = Row(
        model=model,
        server=label or spec.label,
        encoding=encoding,
        clients=clients,
        throughput=result.requests_per_second,
        p50_ms=result.p50_milliseconds,
        p99_ms=result.p99_milliseconds,
        mean_batch=mean_batch,
        errors=0,  # perf_analyzer stops at a failed request: a run that ended answered all
        client_us_per_request=result.client_cpu_seconds / answered * 1e6,
        server_cpu_ms_per_request=server_s / answered * 1000,
        foreign_cpu_pct=max(0.0, foreign) / (os.cpu_count() or 1) / span * 100,
    )
    print(
        f"  {row.server:>10} {model:>17} {encoding:>6} {clients:>3} clients: "
        f"{row.throughput:7.0f} req/s  p50 {row.p50_ms:7.2f} ms  p99 {row.p99_ms:7.2f} ms"
        f"  batch {row.mean_batch or 0:5.1f}"
        f"  server CPU {row.server_cpu_ms_per_request:5.2f} ms/req"
        f"  other CPU {row.foreign_cpu_pct:3.0f}%",
        flush=True,
    )
    return row


def serve_and_load(spec: ServerSpec, *run_args: object, label: str | None = None) -> list[Row]:
    log_dir = REPO / ".bench" / "logs"
    with ServerProcess(spec, log_dir) as server:
        return load_runs(spec, server, *run_args, label=label)  # type: ignore[arg-type]


def transport_rounds(
    path: Path, model: str, items: np.ndarray, expected: np.ndarray, args: argparse.Namespace
) -> list[list[Row]]:
    """One kubeinfer serving REST and gRPC (and, with `--baseline`, the baseline tree's
    beside it); their three transports in interleaved rounds
    (`transports.compare_transports`)."""

    def spec() -> KubeinferSpec:  # each on ports of its own
        extra = tuple(args.kubeinfer_args.split())
        return kubeinfer_spec(path, model, args.threads, extra_args=extra, grpc=True)

    specs = [spec()]
    if args.baseline:
        specs.append(baseline_spec(spec(), args.baseline, REPO / ".bench" / "baseline"))

    def run(spec: KubeinferSpec, server: ServerProcess, encoding: str, clients: int) -> Row:
        wait_for_quiet(args)
        return one_run(spec, server, model, items, encoding, clients, args, None)

    with contextlib.ExitStack() as stack:
        runs = {}
        for each in specs:
            server = stack.enter_context(ServerProcess(each, REPO / ".bench" / "logs"))
            for encoding in ("json", "binary", "grpc"):
                check_answers(each, items, encoding, expected)
            runs[each.label] = functools.partial(run, each, server)
        return compare_transports(runs, args.transport_rounds)


# --------------------------------------------------------------------------- int8


def build_engine(model_path: Path, precision: str, cache: Path, calibration: Path) -> dict:
    command = [
        str(REPO / ".venv" / "bin" / "kubeinfer"), "build", "--model", str(model_path),
        "--backend", "onnxruntime", "--precision", precision, "--max-batch-size", "32",
        "--cache", str(cache), "--json",
    ]  # fmt: skip
    if precision == "int8":
        command += ["--calibration", str(calibration)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kubeinfer build {precision} failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout)


def int8_comparison(
    model_path: Path, items: np.ndarray, args: argparse.Namespace
) -> Int8Comparison:
    from kubeinfer.runtime.building.calibration import write_demo_samples

    work = REPO / ".bench" / "engines"
    calibration = write_demo_samples(model_path, work / "calibration.npz", count=160)
    sizes, ceilings, served, accuracy = {}, {}, {}, {}
    for precision in ("fp32", "int8"):
        started = time.monotonic()
        manifest = build_engine(model_path, precision, work, calibration)
        digest = manifest["digest"]
        engine_path = work / "engines" / digest.removeprefix("sha256:") / manifest["engineFile"]
        print(f"  built {precision} {digest[:19]} in {time.monotonic() - started:.0f}s", flush=True)
        sizes[precision] = engine_path.stat().st_size / 1e6
        points = measure_ceiling(engine_path, args.threads, args.ceiling_seconds, (1, 32))
        ceilings[precision] = {p.batch_size: p.items_per_second for p in points}
        expected = reference_outputs(engine_path, items)
        spec = kubeinfer_spec(
            engine_path,
            MEMORY,
            args.threads,
            extra_args=tuple(args.kubeinfer_args.split()),
            engine=(digest, work),
        )
        plan = [("json", 32), ("binary", 32)]
        rows = serve_and_load(spec, MEMORY, items, expected, plan, args,
                              label=f"kubeinfer-{precision}")  # fmt: skip
        served.update({(precision, row.encoding): row for row in rows})
        if precision == "int8" and manifest.get("accuracy"):
            output = manifest["accuracy"]["outputs"][0]
            accuracy = {k: v for k, v in output.items() if isinstance(v, int | float)}
    return Int8Comparison(sizes, ceilings, served, accuracy)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="kubeinfer serving benchmark")
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke check)")
    parser.add_argument("--duration", type=float, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds before each run")
    parser.add_argument("--clients", default="1,8,32,64")
    parser.add_argument("--models", default=f"{SMALL},{MEMORY}")
    parser.add_argument("--servers", default="kubeinfer,unbatched,mlserver")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="ONNX Runtime intra-op threads, the same in every server (default: the CPU "
        "count, ONNX Runtime's own default on a machine without SMT)",
    )
    parser.add_argument("--mlserver-workers", type=int, default=1, help="MLServer parallel_workers")
    parser.add_argument(
        "--kubeinfer-args",
        default="--execution-slots 1",
        help="extra `kubeinfer serve` flags (default: one slot, whose intra-op threads "
        "already use every core: a second slot oversubscribes the cores and halves the "
        "batches; measured on the memory-bound model at 32 clients: batch 16 instead of 10-11, "
        "+11%% JSON and +19%% binary throughput)",
    )
    parser.add_argument(
        "--max-other-cpu",
        type=float,
        default=100.0,
        help="on a shared machine: wait for and re-run rows where other processes used "
        "more than this %% of the CPU (100: off)",
    )
    parser.add_argument("--retries", type=int, default=2, help="re-runs of a noisy row")
    parser.add_argument("--quiet-timeout", type=float, default=30.0)
    parser.add_argument("--no-int8", action="store_true", help="skip the fp32 vs int8 rows")
    parser.add_argument(
        "--transport-rounds",
        type=int,
        default=3,
        help="interleaved rounds of kubeinfer's REST JSON, REST binary and gRPC at 1 and 32 "
        "clients on one server (0: none)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="TREE",
        help="also run the transport rounds against the kubeinfer source tree TREE (e.g. "
        "`git worktree add --detach /tmp/before <commit>`), beside this checkout",
    )
    parser.add_argument(
        "--transports-only",
        action="store_true",
        help="only the transport rounds (no ceiling, no other server, no int8)",
    )
    parser.add_argument("--out", type=Path, default=REPO / ".bench" / "results.md")
    args = parser.parse_args(argv)
    args.duration = args.duration or (3.0 if args.quick else 10.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 3.0)
    args.ceiling_seconds = 0.3 if args.quick else 1.5
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    servers = [s for s in args.servers.split(",") if s]
    models = args.models.split(",")
    started = datetime.datetime.now(datetime.UTC)
    model_dir = REPO / ".bench" / "models"
    rows: list[Row] = []
    transports: dict[str, list[list[Row]]] = {}
    ceilings = {}
    int8: Int8Comparison | str | None = None
    for model in models:
        path = model_dir / f"{model}.onnx"
        if not path.exists():
            MODELS[model](path)
        width = 512 if model == SMALL else 1024
        items = np.random.default_rng(7).standard_normal((DISTINCT_REQUESTS, width))
        items = items.astype(np.float32)
        expected = reference_outputs(path, items)
        if "kubeinfer" in servers and args.transport_rounds > 0:
            print(f"{model}: kubeinfer over REST JSON, REST binary and gRPC", flush=True)
            transports[model] = transport_rounds(path, model, items, expected, args)
        if args.transports_only:
            continue
        print(f"{model}: in-process ceiling", flush=True)
        ceilings[model] = measure_ceiling(path, args.threads, args.ceiling_seconds)
        for server in servers:
            plan = [("json", c) for c in clients]
            if server != "mlserver" and 32 in clients:  # MLServer has no binary extension
                plan.append(("binary", 32))
            if server == "kubeinfer":
                spec = kubeinfer_spec(
                    path, model, args.threads, extra_args=tuple(args.kubeinfer_args.split())
                )
            elif server == "unbatched":
                spec = unbatched_spec(path, model, args.threads)
            else:
                spec = mlserver_spec(path, model, args.threads, REPO / ".bench" / "mlserver",
                                     parallel_workers=args.mlserver_workers)  # fmt: skip
            print(f"{model}: {server}", flush=True)
            rows += serve_and_load(spec, model, items, expected, plan, args)
        if model == MEMORY and not args.no_int8:
            print(f"{model}: fp32 vs int8 engines", flush=True)
            try:
                int8 = int8_comparison(path, items, args)
            except Exception as error:  # reported in the output, the rest still stands
                int8 = f"skipped: {error}"
    text = render(args, started, rows, ceilings, int8, models, transports)
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written to {args.out}")
    return 0


def render(args, started, rows, ceilings, int8, models, transports) -> str:  # type: ignore[no-untyped-def]
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    parts = [
        f"# kubeinfer serving benchmark ({started:%Y-%m-%d %H:%M} UTC)\n",
        f"`{' '.join(['bench_serving.py', *sys.argv[1:]])}` on {os.cpu_count()} CPUs ({cpu}), "
        f"load generator on the same machine; {args.warmup:g} s warm-up + {args.duration:g} s "
        f"measured per row; ONNX Runtime {args.threads} intra-op thread(s), no spinning, in "
        "every server; "
        f"kubeinfer `--max-batch-size 32 {args.kubeinfer_args}` (other batching settings "
        f"at their defaults); MLServer 1.7.1 adaptive "
        f"batching max batch 32, 5 ms, parallel_workers={args.mlserver_workers}. Load average "
        f"at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}. 'other CPU' is what "
        "processes other than the server and the load generator used during the window.\n",
    ]
    if rows:
        parts += [
            "## Serving (single-item requests, closed loop)\n",
            serving_table(rows, ceilings),
            "\n## In-process ONNX Runtime ceiling (items/s, time per batch)\n",
            ceiling_table(ceilings),
        ]
    for model, rounds in transports.items():
        title = f"{len(rounds)} interleaved rounds, medians"
        if not args.baseline:
            parts += [
                f"\n## gRPC beside REST ({model}, one kubeinfer serve, {title})\n",
                transports_table(model, rounds),
            ]
            continue
        parts += [
            f"\n## gRPC beside REST ({model}, this checkout and {args.baseline}, {title})\n",
            "This checkout:\n",
            transports_table(model, of_server(rounds, "kubeinfer")),
            f"\nBefore ({args.baseline}):\n",
            transports_table(model, of_server(rounds, BEFORE)),
            "\nThis checkout against before, same rounds:\n",
            before_after_table(model, rounds, "kubeinfer"),
        ]
    if isinstance(int8, Int8Comparison):
        parts += [
            f"\n## fp32 vs int8 engines ({MEMORY}, kubeinfer build + serve)\n",
            int8_table(int8),
        ]
    elif isinstance(int8, str):
        parts += [f"\n## fp32 vs int8 ({MEMORY})\n", int8 + "\n"]
    if SMALL in models and MEMORY in models and rows:
        parts += [
            "\n## Targets (issue 3, item 8)\n",
            targets_table(check_targets(rows, MEMORY, SMALL)),
        ]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
