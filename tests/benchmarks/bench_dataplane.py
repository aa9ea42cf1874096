"""The baseline commit's runtime against this commit's, side by side (issue 41, item 8):
`kubeinfer serve` of the baseline (default c80431e, the last commit whose runtime served
through the Python data plane) and of this checkout (the Rust data plane,
`kubeinfer_dataplane`), with the raw engine, in one run, on this machine.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/bench_dataplane.py [--quick] [--rounds N]
        [--baseline REV] [--models small-mlp,memory-bound-mlp,bert-encoder]
        [--no-overload] [--out .bench/dataplane.md]

The baseline (`--baseline REV`, default c80431e) is a `git worktree add --detach` of that
commit at `.bench/baseline-<rev>` (made once from the repository this file is in, then
reused; a directory given instead is used as it is). Its server is this venv's Python
running `-m kubeinfer.cli serve` with a folder first on PYTHONPATH whose `kubeinfer`
links to the worktree's packages (`checkout_site`); a child process prints where
`kubeinfer`, its runtime and its command line import from before anything is measured,
and the run stops unless it is the worktree. The flags that pick each runtime's data
plane come from what it has (`checkout_site.data_plane_flags`): `--data-plane python`
for the baseline, nothing (or `--data-plane rust` while this checkout still has both) for
this commit. A baseline that has only the Rust data plane (a commit from after the Python
one was removed) serves through its own build of it:
`checkout_site.extension_into` builds its `kubeinfer_dataplane` with maturin and unpacks
it into the baseline's folder, so two builds of the Rust path compare side by side
(`--baseline <an earlier commit> --models small-mlp --no-overload`).

For each model (`dataplane_workloads`: the overhead-bound small MLP, the ~170 MB
memory-bound MLP and a BERT-shaped encoder with requests of 8 to 128 tokens served with
PadToBuckets at 16/32/64/128, max batch 16) three servers run at once on loopback ports:
the baseline's, this commit's (same flags: `--max-batch-size 32` (16 for the encoder),
`--execution-slots 1`, `--threads` intra-op threads) and the hand-written unbatched
server (`unbatched_server.py`, the latency baseline); one that does not start is noted
and the others go on. Each answers the model's distinct requests with ONNX Runtime's own
outputs first (tritonclient, every transport it is driven over, shared memory through
tritonclient's regions), then perf_analyzer (`kubeinfer.cli.tune.perf`, as
`bench_serving.one_run` drives it: a warm-up, then three windows making up `--duration`)
drives closed loops of single-item requests at 1 and 32 clients over every transport
the server serves: REST JSON, REST binary, gRPC (when the server's gRPC port answers)
and system shared memory (when the server lists `system_shared_memory` among its
extensions; perf_analyzer's `--shared-memory system`). Within each round the two
kubeinfer servers take turns going first on every cell, so a shared machine's drift
falls on both; `--rounds` rounds, medians per cell, and each ratio the median of the
rounds' own ratios.

Per row: requests/s and client p50/p99 (perf_analyzer); the mean batch formed (the
server's own `kubeinfer_batch_size` histogram over the measured windows, from /metrics:
a server without /metrics shows —, but at 1 client, where a closed loop's batches are
its one request each); the server's CPU µs per request (/proc/<pid>/stat of its
processes, over the measured windows, per request answered). Then the raw engine: ONNX
Runtime in this process, same session settings, at the batch sizes the servers formed
(the two whole sizes around each mean, interpolated), its items/s and its CPU µs per
row. vs raw is a server's requests/s over the raw engine's items/s at that server's own
mean batch (where that batch is unknown, the raw engine's best over the sizes measured:
a stricter bound, so marked); vs baseline, this commit's over the baseline's.

For this commit's server, the GIL crossings (`kubeinfer_dataplane.gil_crossings()`, which
the server logs as `gil_crossings=N` when it stops) over its whole life, less one per
execution slot taken at start, per batch it ran (the batch histogram's count from
/metrics just before it stops), and a probe: a fresh server answering 64 requests one
after another.

Last (unless `--no-overload`), the overload method of `bench_hostile.py` and
docs/overload.md on the small MLP, for both runtimes: a fresh server per encoding pinned
to CPU 0 (one ONNX Runtime thread, one slot, `--max-queue-size 8`), its capacity with 8
closed-loop clients, then 32-row requests at five times that rate; goodput (200s within
their deadline) as a share of capacity, and the 503s' p99.

It prints one Markdown report (the side-by-side table with its ratios, the raw engine's
figures, the issue's goals each marked met or missed, the overload table) and writes it
to `--out` (.bench/dataplane.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import bench_hostile
from bench_serving import INPUT, MEMORY, MODELS, SMALL
from checkout_site import (
    DEFAULT_BASELINE,
    baseline_checkout,
    data_plane_flags,
    extension_into,
    imports_from,
    package_links,
)
from dataplane_report import BASELINE, NAMES, OURS, TRANSPORTS, UNBATCHED, Labels, ModelRun, body
from dataplane_servers import (
    Served,
    check_answers,
    check_shared_memory,
    discover,
    gil_crossings,
    measure,
)
from dataplane_workloads import ENCODER_MODEL, WORKLOADS, mlp_workload, raw_engine, sizes_around
from kubeinfer.cli.tune import perf
from kubeinfer.cli.tune.server_side import BATCH_SIZE, read_counts
from report import Row
from servers import (
    HOST,
    REPO,
    KubeinferSpec,
    ServerFailed,
    ServerProcess,
    ServerSpec,
    http_get,
    kubeinfer_spec,
    unbatched_spec,
)

PYTHON = str(REPO / ".venv" / "bin" / "python")
"""This venv's Python: both runtimes' servers run on it (the baseline's with its own
packages first on the import path)."""


# --------------------------------------------------------------------------- the runtimes


@dataclass(frozen=True)
class Runtimes:
    """The two runtimes compared: where each one's `kubeinfer` comes from and the flags
    that pick its data plane."""

    baseline: Path
    """The baseline's checkout (the worktree)."""
    baseline_site: Path
    """The folder put first on PYTHONPATH for the baseline's servers."""
    baseline_flags: tuple[str, ...]
    ours_flags: tuple[str, ...]
    labels: Labels
    imports: str
    """What the baseline's child printed of where it imports `kubeinfer` from."""

    def overload_trees(self) -> list[bench_hostile.Tree]:
        return [
            bench_hostile.Tree(self.labels.baseline, str(self.baseline_site), self.baseline_flags),
            bench_hostile.Tree(self.labels.ours, None, self.ours_flags),
        ]


def runtimes(rev: str) -> Runtimes:
    """The baseline checked out (`checkout_site.baseline_checkout`), its import folder
    made and checked in a child process; this checkout's flags."""
    checkout = baseline_checkout(rev)
    site = package_links(checkout, REPO / ".bench" / "sites")
    # A baseline that still has the Python data plane is served through it; one that has
    # only the Rust one, through its own build of it.
    plane = "python" if (checkout / "runtime" / "serving.py").is_file() else "rust"
    if plane == "rust" and extension_into(checkout, site, PYTHON) is None:
        raise ValueError(f"{checkout} has no data plane to serve through")
    imports = imports_from(site, checkout, PYTHON)
    print(f"baseline {rev}: {checkout}\n{imports}", flush=True)
    name = rev if not Path(rev).is_dir() else checkout.name
    return Runtimes(
        checkout, site, data_plane_flags(checkout, plane), data_plane_flags(REPO, "rust"),
        Labels(f"baseline {name} ({plane.capitalize()} data plane)"), imports,
    )  # fmt: skip


def baseline_spec(spec: KubeinferSpec, run: Runtimes) -> KubeinferSpec:
    """`spec`'s server (this checkout's `kubeinfer serve`) run by the baseline instead:
    this venv's Python, `-m kubeinfer.cli`, the baseline's folder on PYTHONPATH."""
    command = [PYTHON, "-m", "kubeinfer.cli", *spec.command[1:], *run.baseline_flags]
    env = {**spec.env, "PYTHONPATH": str(run.baseline_site)}
    return dataclasses.replace(spec, label=BASELINE, command=command, env=env)


# --------------------------------------------------------------------------- servers


# --------------------------------------------------------------------------- one model


def run_model(model: str, args: argparse.Namespace) -> ModelRun:
    work = WORKLOADS[model]()
    run: Runtimes = args.runtimes
    extra = (*args.kubeinfer_args.split(), *work.flags)

    def ours() -> KubeinferSpec:
        spec = kubeinfer_spec(work.path, model, args.threads, work.max_batch_size,
                              (*extra, *run.ours_flags), grpc=True)  # fmt: skip
        return dataclasses.replace(spec, label=OURS)

    specs: dict[str, ServerSpec] = {
        BASELINE: baseline_spec(kubeinfer_spec(work.path, model, args.threads,
                                               work.max_batch_size, extra, grpc=True), run),
        OURS: ours(),
        UNBATCHED: unbatched_spec(work.path, model, args.threads),
    }  # fmt: skip
    notes: list[str] = []
    logs = REPO / ".bench" / "logs"
    rounds: list[list[Row]] = []
    ours_batches, ours_log = None, None
    with contextlib.ExitStack() as stack:
        servers: dict[str, Served] = {}
        for label, spec in specs.items():
            try:
                process = stack.enter_context(ServerProcess(spec, logs))
            except ServerFailed as error:
                notes.append(f"{model}: {label} did not start: {str(error)[-600:]}")
                print(f"{model}: {label} did not start", flush=True)
                continue
            served = servers[label] = discover(label, spec, process, work)
            print(f"{model}: {label} serves {', '.join(served.transports)}; /metrics: "
                  f"{'yes' if served.metrics else 'no'}", flush=True)  # fmt: skip
            for transport in served.transports:
                if transport == "shm":
                    check_shared_memory(served, work)
                else:
                    check_answers(served, work, transport)
        for number in range(args.rounds):
            print(f"{model}: round {number + 1} of {args.rounds}", flush=True)
            measured: list[Row] = []
            for clients in args.clients:
                for transport in TRANSPORTS:
                    order = [BASELINE, OURS] if number % 2 == 0 else [OURS, BASELINE]
                    if clients == 1:
                        order.append(UNBATCHED)
                    for label in order:
                        served = servers.get(label)  # type: ignore[assignment]
                        if served is None or transport not in served.transports:
                            continue
                        try:
                            measured.append(measure(served, work, transport, clients, args))
                        except perf.PerfAnalyzerFailed as error:
                            note = f"{model}: {label} {NAMES[transport]} {clients} clients: {error}"
                            print("  failed:", note, flush=True)
                            if note not in notes:
                                notes.append(note)
            rounds.append(measured)
        mine = servers.get(OURS)
        if mine is not None:
            ours_log = mine.process.log_path
            if mine.metrics and mine.spec.metrics_url:
                _, text = http_get(mine.spec.metrics_url)
                ours_batches = read_counts(text.decode(), None, BATCH_SIZE).batches
        transports = {label: s.transports for label, s in servers.items()}
        metrics = {label: s.metrics for label, s in servers.items()}
    crossings, slots = gil_crossings(ours_log) if ours_log else (None, None)
    batches = [r.mean_batch for rows in rounds for r in rows]
    print(f"{model}: raw engine", flush=True)
    sizes = sizes_around(batches, work.max_batch_size)
    raw = raw_engine(work, args.threads, sorted(sizes), args.raw_seconds)
    return ModelRun(model, work.max_batch_size, rounds, transports, metrics, raw, crossings,
                    slots, ours_batches, notes)  # fmt: skip


PROBE_REQUESTS = 64


def crossings_probe(args: argparse.Namespace) -> str:
    """GIL crossings per batch, counted exactly whether or not the server counts its
    batches: a fresh server of this commit on the small MLP answers PROBE_REQUESTS
    requests sent one after another (nothing else in flight: each is a batch of one),
    then stops; its crossings less its slots' at start, per request."""
    work = mlp_workload(SMALL)
    flags = (*args.kubeinfer_args.split(), *args.runtimes.ours_flags)
    spec = kubeinfer_spec(work.path, SMALL, args.threads, work.max_batch_size, flags)
    spec = dataclasses.replace(spec, label=f"{OURS}-probe")
    import tritonclient.http as triton

    with ServerProcess(spec, REPO / ".bench" / "logs") as running:
        client = triton.InferenceServerClient(f"{HOST}:{spec.port}", network_timeout=30)
        try:
            for index in range(PROBE_REQUESTS):
                feed = work.feeds[index % len(work.feeds)][INPUT]
                given = triton.InferInput(INPUT, list(feed.shape), "FP32")
                given.set_data_from_numpy(feed, binary_data=True)
                client.infer(SMALL, [given])
        finally:
            client.close()
        log = running.log_path
    crossings, slots = gil_crossings(log)
    if crossings is None:
        return "- probe: this commit's server logged no `gil_crossings=` at stop."
    per = (crossings - (slots or 0)) / PROBE_REQUESTS
    return (
        f"- probe ({SMALL}, a fresh server, {PROBE_REQUESTS} requests one after another, "
        f"so {PROBE_REQUESTS} batches of one): {crossings} crossings, {slots} of them its "
        f"slots' at start: **{per:.3f} per batch**."
    )


# --------------------------------------------------------------------------- overload


def overload(args: argparse.Namespace) -> str:
    """bench_hostile's overload rounds, a tree per runtime, its server on CPU 0 and this
    process (the load generator) on CPU 1 while it runs."""
    affinity = os.sched_getaffinity(0)
    model = REPO / ".bench" / "models" / "small-mlp.onnx"
    if not model.exists():
        MODELS[SMALL](model)
    try:
        if len(affinity) > 1:
            os.sched_setaffinity(0, {bench_hostile.CLIENT_CPU})
        load = os.getloadavg()[0]
        rounds = bench_hostile.overload_rounds(
            args.runtimes.overload_trees(), model, REPO / ".bench" / "logs",
            args.overload_rounds, args.quick,
        )  # fmt: skip
        return bench_hostile.overload_report(rounds, (load, os.getloadavg()[0]))
    finally:
        os.sched_setaffinity(0, affinity)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke check)")
    parser.add_argument("--duration", type=float, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds before each run")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (medians per cell)")
    parser.add_argument("--clients", default="1,32")
    parser.add_argument("--models", default=f"{SMALL},{MEMORY},{ENCODER_MODEL}")
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        metavar="REV",
        help="the commit whose runtime this one is compared with (its worktree at "
        ".bench/baseline-<rev>), or a checkout's directory (default %(default)s)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="ONNX Runtime intra-op threads, in every server and the raw engine",
    )
    parser.add_argument(
        "--kubeinfer-args",
        default="--execution-slots 1",
        help="extra `kubeinfer serve` flags, both runtimes alike",
    )
    parser.add_argument("--no-overload", action="store_true", help="skip the 5x overload runs")
    parser.add_argument("--overload-rounds", type=int, help="overload rounds (default 3, quick 1)")
    parser.add_argument("--out", type=Path, default=REPO / ".bench" / "dataplane.md")
    args = parser.parse_args(argv)
    args.duration = args.duration or (3.0 if args.quick else 10.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 3.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.overload_rounds = args.overload_rounds or (1 if args.quick else 3)
    args.raw_seconds = 0.3 if args.quick else 1.5
    args.clients = [int(c) for c in args.clients.split(",")]
    # bench_serving.one_run's knobs, unused here but read there
    args.max_other_cpu, args.retries, args.quiet_timeout = 100.0, 0, 0.0
    return args


def _commit(where: Path = REPO) -> str:
    done = subprocess.run(
        ["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    args.runtimes = runtimes(args.baseline)
    runs, failures = [], []
    for model in args.models.split(","):
        try:
            runs.append(run_model(model, args))
        except (ServerFailed, perf.PerfAnalyzerMissing) as error:
            failures.append(f"{model}: {error}")
            print(f"{model}: FAILED {error}", flush=True)
    probe = None
    try:
        print("GIL crossings probe", flush=True)
        probe = crossings_probe(args)
    except Exception as error:  # reported, the rest still stands
        probe = f"- probe not run: {type(error).__name__}: {str(error)[-300:]}"
    overload_text = None
    if not args.no_overload:
        print("overload: small MLP, 5x capacity, both runtimes", flush=True)
        try:
            overload_text = overload(args)
        except Exception as error:  # reported, the rest still stands
            overload_text = f"Overload not measured: {type(error).__name__}: {error}\n"
    text = render(args, started, load_before, runs, failures, overload_text, probe)
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written to {args.out}")
    return 0 if not failures else 1


def render(args, started, load_before, runs, failures, overload_text, probe) -> str:  # type: ignore[no-untyped-def]
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = "unknown CPU"
    run: Runtimes = args.runtimes
    load = lambda values: " ".join(f"{v:.1f}" for v in values)  # noqa: E731
    flags = lambda given: " ".join(given) or "no data-plane flag"  # noqa: E731
    heading = [
        f"# kubeinfer: the baseline's runtime and this commit's side by side "
        f"({started:%Y-%m-%d %H:%M} UTC, commit {_commit()}, baseline {_commit(run.baseline)})\n",
        f"`{' '.join(['bench_dataplane.py', *sys.argv[1:]])}` on {os.cpu_count()} CPUs ({cpu}), "
        f"perf_analyzer on the same machine; {args.rounds} round(s), {args.warmup:g} s warm-up "
        f"+ {args.duration:g} s measured per row; ONNX Runtime {args.threads} intra-op "
        f"thread(s), no spinning, in every server and the raw engine; kubeinfer "
        f"`--max-batch-size 32 {args.kubeinfer_args}` (16 and PadToBuckets for the encoder) "
        f"on both runtimes. Load average (1/5/15 min) at the start: {load(load_before)}, at "
        f"the end: {load(os.getloadavg())}. 'other CPU' is what processes other than the "
        "server and perf_analyzer used during the window (the median over the cell's rows).\n",
        f"- {run.labels.baseline}: `{PYTHON} -m kubeinfer.cli serve` "
        f"({flags(run.baseline_flags)}) with `{run.baseline_site}` first on PYTHONPATH, "
        f"its `kubeinfer` the worktree `{run.baseline}`; the child imported:\n\n"
        + "".join(f"      {line}\n" for line in run.imports.splitlines()),
        f"- {run.labels.ours}: `.venv/bin/kubeinfer serve` ({flags(run.ours_flags)}).",
    ]
    return "\n".join(heading + body(runs, run.labels, args.clients, probe, failures, overload_text))


if __name__ == "__main__":
    sys.exit(main())
