"""bench_dataplane's servers: what a running one serves (transports, /metrics), its answers
checked against ONNX Runtime's, one closed-loop run of perf_analyzer against it (with the
server's CPU and counters read around the measured windows), and the GIL crossings this
commit's (Rust) server logs when it stops."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_serving import Snapshot, snapshot
from dataplane_report import NAMES, UNBATCHED
from dataplane_workloads import Workload
from kubeinfer.cli.tune import perf
from report import Row
from servers import HOST, REPO, KubeinferSpec, ServerFailed, ServerProcess, ServerSpec, http_get


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
        f"  {row.server:>11} {work.model:>16} {NAMES[transport]:>11} {clients:>3} clients: "
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
    """The crossings this commit's (Rust) server logged at stop, and its execution slots."""
    text = log.read_text(errors="replace") if log.exists() else ""
    crossings = re.findall(r"gil_crossings=(\d+)", text)
    slots = re.findall(r"execution_slots=(\d+)", text)
    return (int(crossings[-1]) if crossings else None, int(slots[-1]) if slots else None)
