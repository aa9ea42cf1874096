"""The data planes side by side (issue 41, item 8): `kubeinfer serve --data-plane python`,
`--data-plane rust` and the raw engine, in one run, on this machine.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/bench_dataplane.py [--quick] [--rounds N]
        [--models small-mlp,memory-bound-mlp,bert-encoder] [--no-overload]
        [--out .bench/dataplane.md]

For each model (`kubeinfer.runtime.demo_models`: the overhead-bound small MLP and the
~170 MB memory-bound MLP; and a BERT-shaped encoder (`bert-encoder`),
bench_transformers' size, requests of 8 to 128 tokens served with PadToBuckets at
16/32/64/128, max batch 16) three servers run at once on loopback ports: kubeinfer on the
Python data plane, kubeinfer on the Rust data plane (same flags: `--max-batch-size 32`
(16 for the encoder), `--execution-slots 1`, `--threads` intra-op threads) and the
hand-written unbatched server (`unbatched_server.py`, the latency baseline); one that
does not start is noted and the others go on. Each answers the model's distinct
requests with ONNX Runtime's own outputs first (tritonclient, every transport it is
driven over, shared memory through tritonclient's regions), then perf_analyzer
(`kubeinfer.cli.tune.perf`, as `bench_serving.one_run` drives it: a warm-up, then three
windows making up `--duration`) drives closed loops of single-item requests at 1 and 32 clients
over every transport the server serves: REST JSON, REST binary, gRPC (when the server's
gRPC port answers) and system shared memory (when the server lists
`system_shared_memory` among its extensions; perf_analyzer's `--shared-memory system`).
Within each round the Python and Rust servers take turns going first on every cell, so a
shared machine's drift falls on both; `--rounds` rounds, medians per cell, and each ratio
the median of the rounds' own ratios.

Per row: requests/s and client p50/p99 (perf_analyzer); the mean batch formed (the
server's own `kubeinfer_batch_size` histogram over the measured windows, from /metrics:
a server without /metrics shows —, but at 1 client, where a closed loop's batches are
its one request each); the server's CPU µs per request (/proc/<pid>/stat of
its processes, over the measured windows, per request answered). Then the raw engine:
ONNX Runtime in this process, same session settings (`engine_ceiling.open_session`), at
the batch sizes the servers formed (the two whole sizes around each mean, interpolated),
its items/s and its CPU µs per row (the process's CPU time over the runs; for the
encoder, batches of one bucket's requests padded to it, weighted by the buckets'
shares). Rust/raw is the Rust server's requests/s over the raw engine's items/s at the
Rust server's own mean batch (where that batch is unknown, the raw engine's best items/s
and CPU per row over the sizes measured: a stricter bound, so marked).

For the Rust server, the GIL crossings (`kubeinfer_dataplane.gil_crossings()`, which the
server logs as `gil_crossings=N` when it stops) over its whole life, less one per
execution slot taken at start, per batch it ran (the batch histogram's count from
/metrics just before it stops; without /metrics only the total is given).

Last (unless `--no-overload`), the overload method of `bench_hostile.py` and
docs/overload.md on the small MLP, for both data planes: a fresh server per encoding
pinned to CPU 0 (one ONNX Runtime thread, one slot, `--max-queue-size 8`), its capacity
with 8 closed-loop clients, then 32-row requests at five times that rate; goodput (200s
within their deadline) as a share of capacity, and the 503s' p99.

It prints one Markdown report (the side-by-side table with its ratios, the raw engine's
figures, the issue's goals each marked met or missed, the overload table) and writes it
to `--out` (.bench/dataplane.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import bench_hostile
import numpy as np
from bench_serving import (
    DISTINCT_REQUESTS,
    INPUT,
    MEMORY,
    MODELS,
    OUTPUT,
    SMALL,
    Snapshot,
    snapshot,
)
from engine_ceiling import open_session, reference_outputs
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

PYTHON, RUST, UNBATCHED = "python", "rust", "unbatched"
TRANSPORTS = ("json", "binary", "grpc", "shm")
NAMES = {"json": "REST JSON", "binary": "REST binary", "grpc": "gRPC", "shm": "system shm"}
OUTPUT_BYTES = {SMALL: 128 * 4, MEMORY: 1000 * 4}
"""Bytes of one request's output (the shared-memory region perf_analyzer sets aside)."""
WIDTH = {SMALL: 512, MEMORY: 1024}
ENCODER_MODEL = "bert-encoder"

GOAL_OF_RAW = {SMALL: 0.50, MEMORY: 0.85}
"""Rust's requests/s as a share of the raw engine's items/s at the batch it formed."""
GOAL_CPU_US = 40.0
"""The Rust server's CPU per request less the engine's own CPU per row, at most."""


# --------------------------------------------------------------------------- servers


@dataclass
class Served:
    """A running server and what it was found to serve."""

    label: str
    spec: ServerSpec
    process: ServerProcess
    transports: tuple[str, ...]
    metrics: bool
    """Whether it serves /metrics (the batch histogram, the requests answered)."""


def _grpc_answers(port: int | None, model: str) -> bool:
    if port is None:
        return False
    try:
        import tritonclient.grpc as grpc_client

        client = grpc_client.InferenceServerClient(f"{HOST}:{port}")
        try:
            return bool(client.is_model_ready(model, client_timeout=3.0))
        finally:
            client.close()
    except Exception:  # no gRPC there: refused, unimplemented, timed out
        return False


def _extensions(port: int) -> list[str]:
    import json

    try:
        status, body = http_get(f"http://{HOST}:{port}/v2")
        return list(json.loads(body).get("extensions", [])) if status == 200 else []
    except (OSError, ValueError):
        return []


def _serves_metrics(spec: ServerSpec) -> bool:
    if not spec.metrics_url:
        return False
    try:
        status, _ = http_get(spec.metrics_url)
    except OSError:
        return False
    return status == 200


def discover(label: str, spec: ServerSpec, process: ServerProcess, work: Workload) -> Served:
    """The transports `spec`'s running server answers on, and whether it keeps counters."""
    transports = ["json", "binary"]
    grpc_port = spec.grpc_port if isinstance(spec, KubeinferSpec) else None
    if _grpc_answers(grpc_port, spec.model_name):
        transports.append("grpc")
    if "system_shared_memory" in _extensions(spec.port) and work.output_bytes:
        transports.append("shm")
    return Served(label, spec, process, tuple(transports), _serves_metrics(spec))


@contextlib.contextmanager
def shared_memory(output_bytes: int) -> Iterator[None]:
    """perf_analyzer's command lines, inside, put the inputs and outputs in system shared
    memory (`--shared-memory system`; it registers the regions itself)."""
    original = perf.command

    def command(*args: object, **kwargs: object) -> list[str]:
        line = original(*args, **kwargs)  # type: ignore[arg-type]
        return [
            *line,
            "--shared-memory",
            "system",
            "--output-shared-memory-size",
            str(output_bytes),
        ]

    perf.command = command  # type: ignore[assignment]
    try:
        yield
    finally:
        perf.command = original  # type: ignore[assignment]


def measure(
    served: Served, work: Workload, transport: str, clients: int, args: argparse.Namespace
) -> Row:
    """One closed-loop run of perf_analyzer, as `bench_serving.one_run` (its snapshots of
    the server's CPU and counters around the measured windows) for any inputs; shared
    memory through perf_analyzer's own flags."""
    spec, server = served.spec, served.process
    if transport == "grpc":
        assert isinstance(spec, KubeinferSpec) and spec.grpc_port is not None
        target = perf.Target(f"{HOST}:{spec.grpc_port}", spec.model_name, "grpc")
    else:
        encoding = "binary" if transport == "shm" else transport
        target = perf.Target(f"{HOST}:{spec.port}", spec.model_name, "http", encoding)
    marks: list[Snapshot] = []
    samples = [{name: array[0] for name, array in feed.items()} for feed in work.feeds]
    place = REPO / ".bench" / "perf-analyzer" / f"{served.label}-{work.model}"
    in_shm = transport == "shm" and work.output_bytes
    with shared_memory(work.output_bytes or 0) if in_shm else contextlib.nullcontext():
        result = perf.run(
            target, perf.Load(concurrency=clients), samples,
            max(args.duration / 3, work.min_window_seconds), place,
            max(args.warmup, 3 * work.min_window_seconds) if args.warmup else 0.0,
            lambda: marks.append(snapshot(spec, server)),
        )  # fmt: skip
    start, end = marks
    span = end.at - start.at
    mean_batch = None
    if None not in (start.counts.rows, end.counts.rows, start.counts.batches, end.counts.batches):
        batches = end.counts.batches - start.counts.batches  # type: ignore[operator]
        if batches > 0:
            mean_batch = (end.counts.rows - start.counts.rows) / batches  # type: ignore[operator]
    if mean_batch is None and clients == 1 and served.label != UNBATCHED:
        mean_batch = 1.0  # one client in a closed loop: every batch is its one request
    answered = (
        end.counts.answered - start.counts.answered
        if end.counts.answered is not None and start.counts.answered is not None
        else result.requests_per_second * span
    )
    answered = max(answered, 1.0)
    server_s = end.server_s - start.server_s
    foreign = (end.busy_s - start.busy_s) - server_s - result.client_cpu_seconds
    row = Row(
        model=work.model,
        server=served.label,
        encoding=transport,
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
        f"  {row.server:>9} {work.model:>16} {NAMES[transport]:>11} {clients:>3} clients: "
        f"{row.throughput:7.0f} req/s  p50 {row.p50_ms:7.2f} ms  p99 {row.p99_ms:7.2f} ms"
        f"  batch {row.mean_batch or 0:5.1f}"
        f"  server CPU {row.server_cpu_ms_per_request * 1000:6.0f} us/req"
        f"  other CPU {row.foreign_cpu_pct:3.0f}%",
        flush=True,
    )
    return row


def check_answers(served: Served, work: Workload, transport: str) -> None:
    """Every distinct request once through tritonclient, answered with ONNX Runtime's own
    output (run at batch 1 in this process)."""
    grpc = transport == "grpc"
    if grpc:
        import tritonclient.grpc as client_lib
    else:
        import tritonclient.http as client_lib  # type: ignore[no-redef]
    from tritonclient.utils import np_to_triton_dtype

    spec = served.spec
    port = spec.grpc_port if isinstance(spec, KubeinferSpec) and grpc else spec.port
    client = client_lib.InferenceServerClient(f"{HOST}:{port}")
    binary = {} if grpc else {"binary_data": transport == "binary"}
    try:
        for index, feed in enumerate(work.feeds):
            tensors = []
            for name, array in feed.items():
                tensor = client_lib.InferInput(
                    name, list(array.shape), np_to_triton_dtype(array.dtype)
                )
                tensor.set_data_from_numpy(array, **binary)
                tensors.append(tensor)
            wanted = [client_lib.InferRequestedOutput(work.output, **binary)]
            answer = client.infer(spec.model_name, tensors, outputs=wanted).as_numpy(work.output)
            if not np.allclose(answer, work.expected[index], 1e-3, 1e-3):
                raise ServerFailed(f"{served.label}: wrong {transport} output for request {index}")
    finally:
        client.close()


def check_shared_memory(served: Served, work: Workload) -> None:
    """Every distinct request once through system shared memory (tritonclient's regions:
    the inputs read from one each, the output written into another), answered with ONNX
    Runtime's own output."""
    import tritonclient.http as triton
    import tritonclient.utils.shared_memory as shm
    from tritonclient.utils import np_to_triton_dtype

    spec, label = served.spec, served.label
    client = triton.InferenceServerClient(f"{HOST}:{spec.port}", network_timeout=30)
    key = f"/bench-dataplane-{os.getpid()}-{label}"
    sizes = {name: array.nbytes for name, array in work.feeds[0].items()}
    sizes[work.output] = work.expected[0].nbytes
    handles = {n: shm.create_shared_memory_region(f"{label}-{n}", f"{key}-{n}", size)
               for n, size in sizes.items()}  # fmt: skip
    try:
        for name, size in sizes.items():
            client.register_system_shared_memory(f"{label}-{name}", f"{key}-{name}", size)
        for index, feed in enumerate(work.feeds):
            tensors = []
            for name, array in feed.items():
                shm.set_shared_memory_region(handles[name], [array])
                tensor = triton.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                tensor.set_shared_memory(f"{label}-{name}", array.nbytes)
                tensors.append(tensor)
            wanted = triton.InferRequestedOutput(work.output)
            wanted.set_shared_memory(f"{label}-{work.output}", sizes[work.output])
            client.infer(spec.model_name, tensors, outputs=[wanted])
            expected = work.expected[index]
            answer = shm.get_contents_as_numpy(handles[work.output], expected.dtype, expected.shape)
            if not np.allclose(answer, expected, 1e-3, 1e-3):
                raise ServerFailed(f"{label}: wrong shared-memory output for request {index}")
    finally:
        with contextlib.suppress(Exception):
            client.unregister_system_shared_memory()
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)
        client.close()


def gil_crossings(log: Path) -> tuple[int | None, int | None]:
    """The crossings the Rust server logged at stop, and its execution slots."""
    text = log.read_text(errors="replace") if log.exists() else ""
    crossings = re.findall(r"gil_crossings=(\d+)", text)
    slots = re.findall(r"execution_slots=(\d+)", text)
    return (int(crossings[-1]) if crossings else None, int(slots[-1]) if slots else None)


# --------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    """One model: its requests, their expected answers, and how it is served."""

    model: str
    path: Path
    feeds: list[dict[str, np.ndarray]]
    """The distinct requests, each one row (batch axis 1) of every input."""
    expected: list[np.ndarray]
    """ONNX Runtime's `output` for each request run alone."""
    output: str
    max_batch_size: int
    flags: tuple[str, ...]
    """`kubeinfer serve` flags of this model, both data planes alike."""
    output_bytes: int | None
    """Bytes of one request's outputs (perf_analyzer's output region); None: shapes that
    vary, which perf_analyzer's shared memory does not take."""
    raw_batches: Callable[[int], list[tuple[float, dict[str, np.ndarray]]]]
    """The raw engine's batches of a size: (the share of requests they stand for, feed)."""
    min_window_seconds: float = 0.0
    """perf_analyzer's shortest window, the warm-up's too: longer than a request takes at
    32 clients (a window in which nothing was answered does not count, and ten such end
    the run)."""


def mlp_workload(model: str) -> Workload:
    path = REPO / ".bench" / "models" / f"{model}.onnx"
    if not path.exists():
        MODELS[model](path)
    width = WIDTH[model]
    items = np.random.default_rng(7).standard_normal((DISTINCT_REQUESTS, width))
    items = items.astype(np.float32)
    expected = reference_outputs(path, items)
    rng = np.random.default_rng(1)

    def raw_batches(size: int) -> list[tuple[float, dict[str, np.ndarray]]]:
        return [(1.0, {INPUT: rng.standard_normal((size, width)).astype(np.float32)})]

    return Workload(
        model, path, [{INPUT: item[None]} for item in items], [e[None] for e in expected],
        OUTPUT, 32, (), OUTPUT_BYTES[model], raw_batches,
    )  # fmt: skip


def encoder_workload() -> Workload:
    """A BERT-shaped encoder (bench_transformers' size: hidden 256, 4 layers), requests of
    8 to 128 tokens, served with PadToBuckets (16/32/64/128), max batch 16, as
    bench_transformers serves it; the raw engine's batches are one bucket's requests
    padded to the bucket, each bucket weighted by its share of the requests."""
    from bench_transformers import BUCKETS, ENCODER, LONGEST, MAX_BATCH, SHORTEST, bucket
    from models.transformer_models import build_encoder, encoder_inputs

    path = REPO / ".bench" / "models" / f"{ENCODER_MODEL}.onnx"
    if not path.exists():
        build_encoder(path, ENCODER)
    rng = np.random.default_rng(7)
    lengths = [int(n) for n in rng.integers(SHORTEST, LONGEST + 1, 2 * DISTINCT_REQUESTS)]
    feeds = [encoder_inputs(rng, 1, n, ENCODER) for n in lengths]
    session = open_session(path, 1)
    try:
        expected = [session.run(["logits"], feed)[0] for feed in feeds]
    finally:
        del session
        gc.collect()
    text = ("input_ids", "attention_mask", "token_type_ids")
    flags = ("--shape-batching", "PadToBuckets", "--shape-buckets", ",".join(map(str, BUCKETS)),
             *(f"--input-shape={n}=1:64:{LONGEST}:0" for n in text))  # fmt: skip
    by_bucket: dict[int, list[int]] = {}
    for index, n in enumerate(lengths):
        by_bucket.setdefault(bucket(n), []).append(index)

    def raw_batches(size: int) -> list[tuple[float, dict[str, np.ndarray]]]:
        out = []
        for length, members in sorted(by_bucket.items()):
            chosen = [members[i % len(members)] for i in range(size)]
            feed = {
                name: np.concatenate([np.pad(feeds[i][name], [(0, 0), (0, length - lengths[i])])
                                      for i in chosen])
                for name in text
            }  # fmt: skip
            out.append((len(members) / len(lengths), feed))
        return out

    return Workload(
        ENCODER_MODEL, path, feeds, expected, "logits", MAX_BATCH, flags, None, raw_batches, 4.0
    )


WORKLOADS: dict[str, Callable[[], Workload]] = {
    SMALL: lambda: mlp_workload(SMALL),
    MEMORY: lambda: mlp_workload(MEMORY),
    ENCODER_MODEL: encoder_workload,
}


# --------------------------------------------------------------------------- raw engine


@dataclass(frozen=True)
class RawPoint:
    batch_size: int
    seconds_per_batch: float
    cpu_seconds_per_batch: float

    @property
    def items_per_second(self) -> float:
        return self.batch_size / self.seconds_per_batch

    @property
    def cpu_us_per_row(self) -> float:
        return self.cpu_seconds_per_batch / self.batch_size * 1e6


def raw_engine(
    work: Workload, threads: int, sizes: Sequence[int], seconds: float
) -> dict[int, RawPoint]:
    """ONNX Runtime in this process (the servers' session settings) at each batch size: per
    batch of the workload's, 2 warm-up runs, then runs for `seconds` (at least 3); the
    median wall time of a run (a shared machine's pauses, which a mean would take in, fall
    on a few runs) and this process's CPU time (every thread: the intra-op threads too)
    per batch, the batches weighted by the share of requests they stand for."""
    session = open_session(work.path, threads)
    points = {}
    try:
        for size in sorted(set(sizes)):
            wall = cpu = 0.0
            for weight, feed in work.raw_batches(size):
                for _ in range(2):
                    session.run(None, feed)
                times: list[float] = []
                start, cpu_start = time.perf_counter(), time.process_time()
                while len(times) < 3 or time.perf_counter() - start < seconds:
                    began = time.perf_counter()
                    session.run(None, feed)
                    times.append(time.perf_counter() - began)
                wall += weight * statistics.median(times)
                cpu += weight * (time.process_time() - cpu_start) / len(times)
            points[size] = RawPoint(size, wall, cpu)
    finally:
        del session
        gc.collect()
    return points


def sizes_around(batches: Sequence[float | None], largest: int) -> set[int]:
    """The whole batch sizes either side of each mean, and 1 and `largest` always."""
    sizes = {1, largest}
    for b in batches:
        if b is not None and not math.isnan(b):
            sizes |= {max(1, math.floor(b)), min(largest, max(1, math.ceil(b)))}
    return sizes


def raw_at(points: dict[int, RawPoint], batch: float) -> tuple[float, float]:
    """The raw engine's items/s and CPU µs per row at a mean batch, interpolated between
    the whole sizes either side (seconds and CPU per batch are close to linear there)."""
    low, high = max(1, math.floor(batch)), max(1, math.ceil(batch))
    a, b = points[low], points[high]
    w = batch - low if high != low else 0.0
    seconds = a.seconds_per_batch + w * (b.seconds_per_batch - a.seconds_per_batch)
    cpu = a.cpu_seconds_per_batch + w * (b.cpu_seconds_per_batch - a.cpu_seconds_per_batch)
    return batch / seconds, cpu / batch * 1e6


# --------------------------------------------------------------------------- one model


@dataclass
class ModelRun:
    model: str
    max_batch_size: int
    rounds: list[list[Row]]
    transports: dict[str, tuple[str, ...]]
    metrics: dict[str, bool]
    raw: dict[int, RawPoint]
    crossings: int | None
    slots: int | None
    rust_batches: float | None
    """Batches the Rust server ran over its life (its /metrics just before it stopped)."""
    notes: list[str]


def run_model(model: str, args: argparse.Namespace) -> ModelRun:
    work = WORKLOADS[model]()
    extra = (*args.kubeinfer_args.split(), *work.flags)

    def ours(data_plane: str) -> KubeinferSpec:
        spec = kubeinfer_spec(work.path, model, args.threads, work.max_batch_size,
                              (*extra, "--data-plane", data_plane), grpc=True)  # fmt: skip
        return dataclasses.replace(spec, label=data_plane)

    specs = {PYTHON: ours(PYTHON), RUST: ours(RUST),
             UNBATCHED: unbatched_spec(work.path, model, args.threads)}  # fmt: skip
    notes: list[str] = []
    logs = REPO / ".bench" / "logs"
    rounds: list[list[Row]] = []
    rust_batches, rust_log = None, None
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
                    order = [PYTHON, RUST] if number % 2 == 0 else [RUST, PYTHON]
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
        rust = servers.get(RUST)
        if rust is not None:
            rust_log = rust.process.log_path
            if rust.metrics and rust.spec.metrics_url:
                _, body = http_get(rust.spec.metrics_url)
                rust_batches = read_counts(body.decode(), None, BATCH_SIZE).batches
        transports = {label: s.transports for label, s in servers.items()}
        metrics = {label: s.metrics for label, s in servers.items()}
    crossings, slots = gil_crossings(rust_log) if rust_log else (None, None)
    batches = [r.mean_batch for rows in rounds for r in rows]
    print(f"{model}: raw engine", flush=True)
    sizes = sizes_around(batches, work.max_batch_size)
    raw = raw_engine(work, args.threads, sorted(sizes), args.raw_seconds)
    return ModelRun(model, work.max_batch_size, rounds, transports, metrics, raw, crossings,
                    slots, rust_batches, notes)  # fmt: skip


# --------------------------------------------------------------------------- report


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _cell(run: ModelRun, label: str, transport: str, clients: int) -> list[Row]:
    return [
        r
        for rows in run.rounds
        for r in rows
        if (r.server, r.encoding, r.clients) == (label, transport, clients)
    ]


@dataclass(frozen=True)
class Cell:
    """One (model, transport, clients) across the data planes: medians over the rounds."""

    model: str
    transport: str
    clients: int
    rows: dict[str, list[Row]]
    rust_over_python: float
    """The median of the rounds' own ratios of requests/s."""
    rust_batch: float | None
    raw_items_per_s: float | None
    raw_cpu_us_per_row: float | None
    raw_batch_known: bool
    """False: the Rust server's batch unknown, raw at its best over the sizes measured."""

    def median(self, label: str, value: Callable[[Row], float | None]) -> float | None:
        values = [v for r in self.rows.get(label, []) if (v := value(r)) is not None]
        return _median(values) if values else None

    @property
    def rust_over_raw(self) -> float | None:
        rust = self.median(RUST, lambda r: r.throughput)
        if rust is None or not self.raw_items_per_s:
            return None
        return rust / self.raw_items_per_s


def cells(run: ModelRun, clients: Sequence[int]) -> list[Cell]:
    out = []
    for count in clients:
        for transport in TRANSPORTS:
            rows = {
                label: _cell(run, label, transport, count) for label in (PYTHON, RUST, UNBATCHED)
            }
            if not rows[PYTHON] and not rows[RUST]:
                continue
            ratios = []
            for measured in run.rounds:
                by = {
                    r.server: r for r in measured if (r.encoding, r.clients) == (transport, count)
                }
                if PYTHON in by and RUST in by and by[PYTHON].throughput:
                    ratios.append(by[RUST].throughput / by[PYTHON].throughput)
            batches = [r.mean_batch for r in rows[RUST] if r.mean_batch is not None]
            rust_batch = _median(batches) if batches else None
            raw_items = raw_cpu = None
            if rows[RUST] and rust_batch:
                raw_items, raw_cpu = raw_at(run.raw, rust_batch)
            elif rows[RUST]:  # the strictest: the best items/s and CPU per row measured
                raw_items = max(p.items_per_second for p in run.raw.values())
                raw_cpu = min(p.cpu_us_per_row for p in run.raw.values())
            out.append(
                Cell(
                    run.model,
                    transport,
                    count,
                    rows,
                    _median(ratios),
                    rust_batch,
                    raw_items,
                    raw_cpu,
                    rust_batch is not None,
                )
            )
    return out


def _f(value: float | None, digits: int = 0, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}{suffix}"


def _pair(cell: Cell, value: Callable[[Row], float | None], digits: int) -> str:
    return f"{_f(cell.median(PYTHON, value), digits)} / {_f(cell.median(RUST, value), digits)}"


def side_by_side(all_cells: Sequence[Cell]) -> str:
    head = (
        "| model | transport | clients | req/s Python / Rust | Rust / Python "
        "| raw items/s at Rust's batch | Rust / raw | p50 ms Python / Rust "
        "| p99 ms Python / Rust | unbatched p50 ms | mean batch Python / Rust "
        "| server CPU µs/req Python / Rust | raw CPU µs/row | other CPU % |\n"
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    lines = []
    for c in all_cells:
        mark = "" if c.raw_batch_known else " (best)"
        foreign = [r.foreign_cpu_pct for rows in c.rows.values() for r in rows]
        lines.append(
            f"| {c.model} | {NAMES[c.transport]} | {c.clients} "
            f"| {_pair(c, lambda r: r.throughput, 0)} | {_f(c.rust_over_python, 2, 'x')} "
            f"| {_f(c.raw_items_per_s)}{mark if c.raw_items_per_s else ''} "
            f"| {_f(c.rust_over_raw, 2, 'x')} "
            f"| {_pair(c, lambda r: r.p50_ms, 2)} | {_pair(c, lambda r: r.p99_ms, 2)} "
            f"| {_f(c.median(UNBATCHED, lambda r: r.p50_ms), 2)} "
            f"| {_pair(c, lambda r: r.mean_batch, 1)} "
            f"| {_pair(c, lambda r: r.server_cpu_ms_per_request * 1000, 0)} "
            f"| {_f(c.raw_cpu_us_per_row)} | {_f(_median(foreign))} |"
        )
    return head + "\n".join(lines) + "\n"


def raw_table(runs: Sequence[ModelRun]) -> str:
    head = "| model | batch | items/s | ms per batch | CPU µs per row |\n|---|--:|--:|--:|--:|\n"
    lines = [
        f"| {run.model} | {p.batch_size} | {p.items_per_second:.0f} "
        f"| {p.seconds_per_batch * 1000:.2f} | {p.cpu_us_per_row:.0f} |"
        for run in runs
        for p in run.raw.values()
    ]
    return head + "\n".join(lines) + "\n"


PROBE_REQUESTS = 64


def crossings_probe(args: argparse.Namespace) -> str:
    """GIL crossings per batch, counted exactly whether or not the server counts its
    batches: a fresh Rust server on the small MLP answers PROBE_REQUESTS requests sent one
    after another (nothing else in flight: each is a batch of one), then stops; its
    crossings less its slots' at start, per request."""
    work = mlp_workload(SMALL)
    spec = kubeinfer_spec(work.path, SMALL, args.threads, work.max_batch_size,
                          (*args.kubeinfer_args.split(), "--data-plane", RUST))  # fmt: skip
    spec = dataclasses.replace(spec, label="rust-probe")
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
        return "- probe: the Rust server logged no `gil_crossings=` at stop."
    per = (crossings - (slots or 0)) / PROBE_REQUESTS
    return (
        f"- probe ({SMALL}, a fresh Rust server, {PROBE_REQUESTS} requests one after another, "
        f"so {PROBE_REQUESTS} batches of one): {crossings} crossings, {slots} of them its "
        f"slots' at start: **{per:.3f} per batch**."
    )


def crossings_lines(runs: Sequence[ModelRun]) -> str:
    lines = []
    for run in runs:
        if run.crossings is None:
            lines.append(f"- {run.model}: the Rust server logged no `gil_crossings=` at stop.")
            continue
        slots = run.slots or 0
        if run.rust_batches:
            per = (run.crossings - slots) / run.rust_batches
            lines.append(
                f"- {run.model}: {run.crossings} GIL crossings over the Rust server's life, "
                f"{slots} of them its slots' at start, for {run.rust_batches:.0f} batches: "
                f"**{per:.3f} per batch**."
            )
        else:
            lines.append(
                f"- {run.model}: {run.crossings} GIL crossings over the Rust server's life "
                f"({slots} of them its slots' at start); per batch not known: this Rust "
                "server serves no /metrics, so its batches are not counted (branch "
                "rust-metrics), nor its mean batch above."
            )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Goal:
    goal: str
    measured: str
    met: bool | None


def goals(all_cells: Sequence[Cell], models: Sequence[str], top: int) -> list[Goal]:
    """The issue's goals for every model, over REST JSON and REST binary always and over
    the other transports where the Rust server served them: at `top` clients its share of
    the raw engine (the MLPs) and its CPU per request against the engine's per row; at 1
    client its p50 against the unbatched server's."""
    out = []
    by = {(c.model, c.transport, c.clients): c for c in all_cells}

    def wanted(model: str, transport: str, clients: int) -> Cell | None:
        cell = by.get((model, transport, clients))
        if cell is not None and cell.median(RUST, lambda r: r.throughput) is not None:
            return cell
        return None

    for model in models:
        for transport in TRANSPORTS:
            cell = wanted(model, transport, top)
            if cell is None and transport not in ("json", "binary"):
                continue
            where = f"{model}, {NAMES[transport]}, {top} clients"
            share = GOAL_OF_RAW.get(model)
            raw_goal = f"{where}: Rust ≥ {share:.0%} of raw" if share else None
            cpu_goal = (
                f"{where}: Rust server CPU per request ≤ engine's CPU per row + "
                f"{GOAL_CPU_US:.0f} µs"
            )
            if cell is None:
                out += [Goal(g, "not measured", None) for g in (raw_goal, cpu_goal) if g]
                continue
            rust = cell.median(RUST, lambda r: r.throughput) or 0.0
            at = (
                f"batch {cell.rust_batch:.1f}"
                if cell.raw_batch_known
                else "its best (Rust's batch unknown)"
            )
            if raw_goal and share and cell.rust_over_raw is not None:
                out.append(
                    Goal(
                        raw_goal,
                        f"{cell.rust_over_raw:.0%} ({rust:.0f} req/s vs raw "
                        f"{cell.raw_items_per_s:.0f} items/s at {at})",
                        cell.rust_over_raw >= share,
                    )
                )
            cpu = cell.median(RUST, lambda r: r.server_cpu_ms_per_request * 1000)
            if cpu is not None and cell.raw_cpu_us_per_row is not None:
                over = cpu - cell.raw_cpu_us_per_row
                out.append(
                    Goal(
                        cpu_goal,
                        f"{cpu:.0f} vs {cell.raw_cpu_us_per_row:.0f} µs ({over:+.0f}; raw at {at})",
                        over <= GOAL_CPU_US,
                    )
                )
        for transport in ("json", "binary"):
            goal = f"{model}, {NAMES[transport]}, 1 client: Rust p50 ≤ unbatched's"
            cell = wanted(model, transport, 1)
            base = cell.median(UNBATCHED, lambda r: r.p50_ms) if cell else None
            rust = cell.median(RUST, lambda r: r.p50_ms) if cell else None
            if rust is None or base is None:
                out.append(Goal(goal, "not measured", None))
                continue
            out.append(
                Goal(goal, f"{rust:.2f} vs {base:.2f} ms ({rust - base:+.2f})", rust <= base)
            )
    return out


def goals_table(found: Sequence[Goal]) -> str:
    mark = {True: "met", False: "**missed**", None: "not measured"}
    lines = [f"| {g.goal} | {g.measured} | {mark[g.met]} |" for g in found]
    return "| goal | measured | verdict |\n|---|---|---|\n" + "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- overload


@dataclass
class DataPlaneTree(bench_hostile.Tree):
    """This checkout, served on one data plane (`--data-plane`)."""

    data_plane: str = PYTHON


_hostile_server = bench_hostile.server


def _server_on_data_plane(
    tree: bench_hostile.Tree, model: Path, logs: Path, *flags: str
) -> ServerProcess:
    if isinstance(tree, DataPlaneTree):
        flags = (*flags, "--data-plane", tree.data_plane)
    running = _hostile_server(tree, model, logs, *flags)
    # One log per data plane (bench_hostile's is per label and model).
    running.log_path = logs / f"{tree.label}-overload.log"
    return running


def overload(args: argparse.Namespace) -> str:
    """bench_hostile's overload rounds, a tree per data plane, its server on CPU 0 and
    this process (the load generator) on CPU 1 while it runs."""
    bench_hostile.server = _server_on_data_plane  # type: ignore[assignment]
    affinity = os.sched_getaffinity(0)
    model = REPO / ".bench" / "models" / "small-mlp.onnx"
    if not model.exists():
        MODELS[SMALL](model)
    trees = [DataPlaneTree(PYTHON, data_plane=PYTHON), DataPlaneTree(RUST, data_plane=RUST)]
    try:
        if len(affinity) > 1:
            os.sched_setaffinity(0, {bench_hostile.CLIENT_CPU})
        load = os.getloadavg()[0]
        rounds = bench_hostile.overload_rounds(
            trees, model, REPO / ".bench" / "logs", args.overload_rounds, args.quick
        )
        return bench_hostile.overload_report(rounds, (load, os.getloadavg()[0]))
    finally:
        os.sched_setaffinity(0, affinity)
        bench_hostile.server = _hostile_server  # type: ignore[assignment]


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
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="ONNX Runtime intra-op threads, in every server and the raw engine",
    )
    parser.add_argument(
        "--kubeinfer-args",
        default="--execution-slots 1",
        help="extra `kubeinfer serve` flags, both data planes alike",
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


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
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
        print("overload: small MLP, 5x capacity, both data planes", flush=True)
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
    all_cells = [c for run in runs for c in cells(run, args.clients)]
    load = lambda values: " ".join(f"{v:.1f}" for v in values)  # noqa: E731
    parts = [
        f"# kubeinfer data planes side by side ({started:%Y-%m-%d %H:%M} UTC, commit "
        f"{_commit()})\n",
        f"`{' '.join(['bench_dataplane.py', *sys.argv[1:]])}` on {os.cpu_count()} CPUs ({cpu}), "
        f"perf_analyzer on the same machine; {args.rounds} round(s), {args.warmup:g} s warm-up "
        f"+ {args.duration:g} s measured per row; ONNX Runtime {args.threads} intra-op "
        f"thread(s), no spinning, in every server and the raw engine; kubeinfer "
        f"`--max-batch-size 32 {args.kubeinfer_args}` (16 and PadToBuckets for the encoder) "
        f"on both data planes. Load average (1/5/15 min) at the start: {load(load_before)}, "
        f"at the end: "
        f"{load(os.getloadavg())}. 'other CPU' is what processes other than the server and "
        "perf_analyzer used during the window (the median over the cell's rows).\n",
    ]
    for run in runs:
        served = "; ".join(
            f"{label}: {', '.join(NAMES[t] for t in ts)}"
            f"{'' if run.metrics[label] or label == UNBATCHED else ' (no /metrics)'}"
            for label, ts in run.transports.items()
        )
        parts.append(f"- {run.model} served: {served}.")
    parts += [
        "\n## Side by side (single-item requests, closed loop)\n",
        side_by_side(all_cells),
        "\nRust / Python: the median of the rounds' own ratios of requests/s. Rust / raw: "
        "the Rust server's requests/s over the raw engine's items/s at the Rust server's mean "
        "batch (interpolated between the whole sizes either side; '(best)': its batch "
        "unknown, the raw engine's best items/s and CPU per row over the sizes measured, a "
        "stricter bound). Raw CPU µs/row is at the same batch.\n",
        "\n## GIL crossings (Rust data plane)\n",
        crossings_lines(runs) + (probe + "\n" if probe else ""),
        "\n## Raw engine (ONNX Runtime in this process, at the batch sizes formed)\n",
        raw_table(runs),
        "\n## Goals (issue 41)\n",
        goals_table(goals(all_cells, [run.model for run in runs], max(args.clients))),
    ]
    notes = [n for run in runs for n in run.notes] + failures
    if notes:
        parts += ["\n## Not measured\n", "\n".join(f"- {n}" for n in notes) + "\n"]
    if overload_text:
        parts += ["\n## Overload (bench_hostile's method, small MLP)\n", overload_text + "\n"]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
