"""The runtime under hostile load (issue 10), measured in one run: overload at five times
capacity, a gzip amplification body, abandoned uploads, SIGTERM under load, and stalled
connections, each against real `kubeinfer serve` processes on loopback.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/bench_hostile.py [--quick] [--baseline REV]
        [--rounds N] [--overload-only | --refusal-cost]

`--baseline REV` also runs every scenario against the runtime of an earlier commit (say
c80431e, the last one served through the Python data plane): a detached `git worktree`
of it at `.bench/baseline-<rev>`, made once and reused, or a checkout's directory given
instead (`checkout_site.baseline_checkout`), served by this venv's Python with a folder
linking to its packages first on PYTHONPATH, with the same commands (and
`--data-plane python` where that runtime has both planes), so the table has both sides
from the same machine and run.

The server runs on CPU 0 alone (`taskset`), one ONNX Runtime thread, one execution slot;
this process, the load generator, runs on CPU 1. The model is the overhead-bound demo MLP
([batch, 512] -> 3x1024 -> [batch, 128]); overload requests carry 32 rows (a full batch:
JSON ~340 KB, binary ~66 KB), as in the issue.

- **Overload** (issue 20, item 5), first, in `--rounds` rounds (3) in which the trees take
  turns: for each tree and encoding a fresh server, whose capacity is measured first (the
  throughput of 8 closed-loop clients: the queue never fills); then an open loop sends
  requests at 5x that rate, each on an idle keep-alive connection (a new one when none is
  idle). Goodput is the 200s per second answered within the request's deadline (the
  default timeout: the requests set none), given as a share of that capacity; beside it
  the p99 of the 503s (goal: >= 80 % and < 10 ms), and the share of its core the server
  used in each phase (a core shared with other work shows there). Each request is one
  full batch, served in 1 / capacity; the queue's delay budget is the time a full queue
  takes to serve: `--max-queue-size` (8) / capacity. `--overload-only` stops there.
- **Refusal cost** (`--refusal-cost`, alone): the CPU time of the server's request
  threads (the Rust data plane's `dataplane-http` threads, and the main thread, the
  Python data plane's event loop: /proc's schedstat, in nanoseconds; never the engine's
  slot threads, one of which spins) per refused request, for 32-row bodies of the
  overload's sizes, JSON and binary, valid requests of a spin model as wide as the MLP
  (`build_wide_spin_model`: refused for want of room, not for their shape or size). A
  request that spins its loop for longer than the run holds the one execution slot and
  another the one queue place (`--max-queue-size 1`), so every request sent is refused;
  8 keep-alive clients send them in a closed loop. A figure of CPU time, not of
  throughput: the share of its core the server gets on a shared machine moves it far
  less than it moves goodput. The trees take turns in each of `--rounds` rounds.
- **Amplification**: a 64 KiB gzip body that inflates to 64 MiB of empty JSON lists, at
  the default body limit and at the old default of 64 MiB; the time to the answer, the
  growth of the server's peak resident memory (VmHWM, reset before), and the slowest
  liveness probe sent every 5 ms meanwhile. The same probe runs during a full-batch JSON
  request.
- **Large requests**: the slowest liveness probe during the largest requests of a model
  with image-sized inputs (131072 FP32 per row, 4 rows: 10 MiB of JSON, 2 MiB binary).
- **Abandoned uploads**: 20 clients each send 60 MiB of a declared 64 MiB and reset the
  connection, three times (limit raised to 64 MiB so that the bodies are read); resident
  memory before, at its peak, and after.
- **SIGTERM**: 64 keep-alive clients, then 32 clients with a connection per request,
  sending 1-row JSON requests in a closed loop (honouring Connection: close and
  Retry-After); SIGTERM after 2 s. A request without an answer is one whose bytes went out
  on an open connection that then closed or reset before its response. Also an upload
  half sent at SIGTERM, and the exit time of an idle server.
- **Stalled connections**: 3,000 connections that send half a request head and stop;
  how many are still open after the header timeout (10 s) plus 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from checkout_site import baseline_checkout, data_plane_flags, imports_from, package_links
from kubeinfer.cli.demo.mlp_models import build_mlp, build_small_mlp
from kubeinfer.cli.tune.load import Connection as _Connection
from kubeinfer.cli.tune.load import EncodedRequest, LoadGenError, open_connection, run_closed_loop
from kubeinfer.contract.runtime_config import BatchingPolicy
from servers import HOST, REPO, ServerProcess, ServerSpec, free_port, http_get

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # the spin model
from onnx_models import build_spin_model
from waiting import wait_for

MIB = 1024 * 1024
MODEL = "small"
SERVER_CPU, CLIENT_CPU = 0, 1


# --------------------------------------------------------------------------- servers


@dataclass
class Tree:
    """Which kubeinfer the servers run: this checkout, or a baseline source tree (the
    folder put first on PYTHONPATH), and the `kubeinfer serve` flags that pick its data
    plane."""

    label: str
    pythonpath: str | None = None
    flags: tuple[str, ...] = ()

    @property
    def current(self) -> bool:
        return self.pythonpath is None

    @property
    def cli_module(self) -> str:
        """The command line's module: kubeinfer.cli, or kubeinfer.operator.cli in a
        baseline from before the command line moved above both planes."""
        if self.pythonpath and not (Path(self.pythonpath) / "kubeinfer" / "cli").exists():
            return "kubeinfer.operator.cli"
        return "kubeinfer.cli"


def trees(baseline: str | None, scratch: Path) -> list[Tree]:
    """This checkout (on the Rust data plane) and, given `baseline` (a revision or a
    checkout's directory), that runtime (on its Python data plane, `checkout_site`)."""
    out = [Tree("this checkout", None, data_plane_flags(REPO, "rust"))]
    if baseline:
        checkout = baseline_checkout(baseline)
        site = package_links(checkout, scratch)
        print(imports_from(site, checkout), flush=True)
        name = checkout.name.removeprefix("baseline-")
        out.append(Tree(f"baseline {name}", str(site), data_plane_flags(checkout, "python")))
    return out


def server(tree: Tree, model: Path, logs: Path, *flags: str) -> ServerProcess:
    port = free_port()
    command = [
        "taskset", "-c", str(SERVER_CPU), sys.executable, "-m", tree.cli_module,
        "serve", "--onnx", str(model), "--model-name", MODEL, "--host", HOST,
        "--port", str(port), "--intra-op-threads", "1", "--execution-slots", "1",
        "--max-batch-size", "32", *tree.flags, *flags,
    ]  # fmt: skip
    env = {"PYTHONPATH": tree.pythonpath} if tree.pythonpath else {}
    label = re.sub(r"[^a-z0-9]+", "-", tree.label.lower()).strip("-")  # a log per tree
    return ServerProcess(ServerSpec(label, command, port, MODEL, env=env), logs)


def memory_kib(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def metric(port: int, name: str) -> float:
    _, body = http_get(f"http://{HOST}:{port}/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def request_head(port: int, length: int, headers: dict[str, str] | None = None) -> bytes:
    lines = [
        f"POST /v2/models/{MODEL}/infer HTTP/1.1",
        f"Host: {HOST}:{port}",
        f"Content-Length: {length}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def raw_request(port: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    return request_head(port, len(body), headers) + body


def infer_body(rows: int, binary: bool, seed: int = 0) -> tuple[bytes, dict[str, str]]:
    x = np.random.default_rng(seed).standard_normal((rows, 512)).astype(np.float32)
    if not binary:
        tensor = {"name": "input", "datatype": "FP32", "shape": [rows, 512],
                  "data": x.ravel().tolist()}  # fmt: skip
        return json.dumps({"inputs": [tensor]}).encode(), {"Content-Type": "application/json"}
    header = json.dumps({
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [rows, 512],
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


# --------------------------------------------------------------------------- overload


@dataclass
class OpenLoopResult:
    seconds: float
    latencies: dict[int, list[float]] = field(default_factory=dict)
    failures: int = 0
    sent: int = 0
    failure_kinds: dict[str, int] = field(default_factory=dict)

    def per_second(self, status: int) -> float:
        return len(self.latencies.get(status, [])) / self.seconds

    def within(self, status: int, seconds: float) -> float:
        """Answers of `status` per second that came within `seconds` of being sent."""
        return sum(1 for t in self.latencies.get(status, []) if t <= seconds) / self.seconds


async def open_loop(
    port: int,
    raw: bytes,
    rate: float,
    warmup: float,
    seconds: float,
    on_window: Callable[[], None] | None = None,
):
    """Sends `raw` at `rate` per second for warmup + seconds; counts what answered inside
    the measured window (`on_window` is called at its start and its end)."""
    idle: list[_Connection] = []
    result = OpenLoopResult(seconds)
    start = time.perf_counter()
    window = (start + warmup, start + warmup + seconds)
    tasks: set[asyncio.Task[None]] = set()

    async def edges() -> None:
        for edge in window:
            await asyncio.sleep(max(0.0, edge - time.perf_counter()))
            if on_window is not None:
                on_window()

    marks = asyncio.create_task(edges())

    async def one() -> None:
        sent = time.perf_counter()
        measured = window[0] <= sent < window[1]
        result.sent += measured
        try:
            conn = idle.pop() if idle else await open_connection(HOST, port)
            response = await conn.send(raw)
        except (LoadGenError, OSError) as error:
            if measured:
                result.failures += 1
                kind = f"{type(error).__name__}: {error}"[:80]
                result.failure_kinds[kind] = result.failure_kinds.get(kind, 0) + 1
            return
        done = time.perf_counter()
        if measured:
            result.latencies.setdefault(response.status, []).append(done - sent)
        if response.headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            idle.append(conn)

    sent = 0
    while True:
        due = start + sent / rate
        if due >= window[1]:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    await asyncio.wait(tasks, timeout=30) if tasks else None
    await marks
    for conn in idle:
        conn.close()
    return result


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuShare:
    """The share of one CPU a process used between consecutive `mark`s."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.marks: list[tuple[float, float]] = []

    def mark(self) -> None:
        self.marks.append((time.perf_counter(), cpu_seconds(self.pid)))

    def share(self) -> float:
        (wall0, cpu0), (wall1, cpu1) = self.marks[-2:]
        return (cpu1 - cpu0) / (wall1 - wall0)


OVERLOAD_FACTOR = 5
DEADLINE_SECONDS = BatchingPolicy().default_timeout_milliseconds / 1000
"""A 200 counts as goodput when it came within the request's deadline (the server's
default timeout: the requests set none)."""


def overload(tree: Tree, model: Path, logs: Path, binary: bool, quick: bool) -> dict:
    """Capacity first (8 closed-loop clients, the queue never full), then an open loop at
    OVERLOAD_FACTOR times it on the same server: goodput (200s within the deadline per
    second) as a share of that capacity, and the 503s' p99."""
    body, headers = infer_body(32, binary)
    with server(tree, model, logs, "--max-queue-size", "8") as running:
        port = running.spec.port
        assert running.process is not None
        cpu = CpuShare(running.process.pid)
        raw = raw_request(port, body, headers)
        compute = (metric(port, "kubeinfer_compute_duration_seconds_sum"),
                   metric(port, "kubeinfer_compute_duration_seconds_count"))  # fmt: skip
        capacity_run = asyncio.run(run_closed_loop(
            HOST, port, [EncodedRequest(raw, len(body))], 8, 1.0 if quick else 2.0,
            2.0 if quick else 5.0, on_window_start=cpu.mark, on_window_end=cpu.mark,
        ))  # fmt: skip
        capacity_cpu = cpu.share()
        batch_seconds = (metric(port, "kubeinfer_compute_duration_seconds_sum") - compute[0]) / (
            max(1.0, metric(port, "kubeinfer_compute_duration_seconds_count") - compute[1])
        )
        capacity = capacity_run.throughput
        rate = OVERLOAD_FACTOR * capacity
        client = CpuShare(os.getpid())

        def mark() -> None:
            cpu.mark()
            client.mark()

        result = asyncio.run(open_loop(port, raw, rate, 1.0, 3.0 if quick else 8.0, mark))
        overload_cpu = cpu.share()
    service = 1 / capacity if capacity else float("nan")  # one request: one full batch
    goodput = result.within(200, DEADLINE_SECONDS)
    return {
        "capacity": capacity,
        "offered": result.sent / result.seconds,
        "goodput": goodput,
        "goodput_ratio": goodput / capacity if capacity else 0.0,
        "capacity_cpu": capacity_cpu,
        "overload_cpu": overload_cpu,
        "client_cpu": client.share(),
        "refusal_cpu_us": refusal_cpu_us(
            capacity, capacity_cpu, result.per_second(200), overload_cpu, result.per_second(503)
        ),
        "goodput_ratio_per_cpu": (goodput / overload_cpu) / (capacity / capacity_cpu)
        if capacity and overload_cpu and capacity_cpu
        else 0.0,
        "refused": result.per_second(503),
        "other": {s: len(v) for s, v in result.latencies.items() if s not in (200, 503)},
        "failures": result.failures,
        "failure_kinds": result.failure_kinds,
        "p99_503_ms": percentile_ms(result.latencies.get(503, []), 99),
        "p99_200_ms": percentile_ms(result.latencies.get(200, []), 99),
        "batch_ms": batch_seconds * 1000,
        "service_ms": service * 1000,
        "bound_ms": (2 * 8 * service + service) * 1000,
    }


def refusal_cpu_us(
    capacity: float, capacity_cpu: float, served: float, overload_cpu: float, refused: float
) -> float:
    """The server's CPU per refusal, derived: what it used under overload less what its
    200s cost at the capacity phase's CPU per request, over the refusals."""
    if not (capacity and refused):
        return float("nan")
    return (overload_cpu - served * capacity_cpu / capacity) / refused * 1e6


def overload_rounds(trees: list[Tree], model: Path, logs: Path, rounds: int, quick: bool):
    """`overload` for every tree and encoding, `rounds` times, the trees interleaved
    within each round (the machine's noise falls on both sides alike)."""
    out: dict[str, dict[str, list[dict]]] = {t.label: {"json": [], "binary": []} for t in trees}
    for round_ in range(rounds):
        for encoding in ("json", "binary"):
            order = trees if round_ % 2 == 0 else trees[::-1]
            for tree in order:
                figures = overload(tree, model, logs, encoding == "binary", quick)
                out[tree.label][encoding].append(figures)
                print(f"round {round_ + 1} {tree.label} {encoding}", _brief(figures), flush=True)
    return out


def _brief(figures: dict) -> str:
    return (
        f"capacity {figures['capacity']:.0f}/s offered {figures['offered']:.0f}/s goodput "
        f"{figures['goodput']:.0f}/s ({figures['goodput_ratio']:.0%}) 503 p99 "
        f"{figures['p99_503_ms']:.1f} ms 200 p99 {figures['p99_200_ms']:.0f} ms "
        f"other {figures['other']} failed {figures['failures']} {figures['failure_kinds']}; "
        "server CPU "
        f"{figures['capacity_cpu']:.0%} / {figures['overload_cpu']:.0%}, per CPU-second "
        f"{figures['goodput_ratio_per_cpu']:.0%}; load generator CPU {figures['client_cpu']:.0%}"
        f"; CPU per refusal {figures['refusal_cpu_us']:.0f} us"
    )


# --------------------------------------------------------------------------- refusal cost

SPIN_WIDTH = 512
"""The wide spin model's `x` and `y` columns: the overload's rows' width, so that its
32-row requests are the overload's sizes (JSON ~340 KB, binary ~66 KB)."""


def build_wide_spin_model(path: Path) -> Path:
    """tests/support's spin model with `x` and `y` [batch, SPIN_WIDTH] and `ids`
    [batch, 1] (its loop runs max(ids) times; `x + ids` broadcasts): a 32-row request
    is valid, so a server refuses it for want of room, not for its shape or size."""
    import onnx

    narrow = onnx.load(build_spin_model(path.with_name(f"narrow-{path.name}")))
    widths = {"x": SPIN_WIDTH, "ids": 1, "y": SPIN_WIDTH}
    for value in (*narrow.graph.input, *narrow.graph.output):
        value.type.tensor_type.shape.dim[1].dim_value = widths[value.name]
    onnx.checker.check_model(narrow)
    path.write_bytes(narrow.SerializeToString(deterministic=True))
    return path


def spin_body(rows: int, binary: bool, trips: int = 0) -> tuple[bytes, dict[str, str]]:
    """A request of the wide spin model: `rows` rows of zeros, its loop run `trips` times."""
    x = np.zeros((rows, SPIN_WIDTH), np.float32)
    ids = np.full((rows, 1), trips, np.int32)
    tensors = [("x", "FP32", x), ("ids", "INT32", ids)]
    if not binary:
        inputs = [{"name": n, "datatype": d, "shape": list(a.shape), "data": a.ravel().tolist()}
                  for n, d, a in tensors]  # fmt: skip
        return json.dumps({"inputs": inputs}).encode(), {"Content-Type": "application/json"}
    header = json.dumps({
        "inputs": [{"name": n, "datatype": d, "shape": list(a.shape),
                    "parameters": {"binary_data_size": a.nbytes}} for n, d, a in tensors],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    data = header + b"".join(a.tobytes() for _, _, a in tensors)
    return data, {"Inference-Header-Content-Length": str(len(header))}


SPIN_FOREVER = json.dumps({
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, SPIN_WIDTH],
                "data": [0.0] * SPIN_WIDTH},
               {"name": "ids", "datatype": "INT32", "shape": [1, 1], "data": [2_000_000_000]}],
    "parameters": {"timeout": 3_000_000_000},  # microseconds: far past the run
}).encode()  # fmt: skip
"""A request that holds the wide spin model's slot for about half an hour."""


REQUEST_THREADS = ("dataplane-http",)
"""The names (/proc's comm) of the Rust data plane's request threads (its tokio runtime's)."""


def request_threads_cpu_ns(pid: int) -> int:
    """CPU time of the process's request threads, in nanoseconds: the main thread (the
    Python data plane's event loop; the Rust one's waits for a signal) and every thread
    named in REQUEST_THREADS (never the engine's slot threads)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            if task.name == str(pid) or name.startswith(REQUEST_THREADS):
                total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue
    return total


async def refused_in_a_loop(port: int, raw: bytes, count: int, clients: int) -> dict[int, int]:
    """`count` requests over `clients` keep-alive connections, each sent once the last is
    answered: the answers' statuses, counted."""
    statuses: dict[int, int] = {}

    async def client(n: int) -> None:
        conn = await open_connection(HOST, port)
        try:
            for _ in range(n):
                status = (await conn.send(raw)).status
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            conn.close()

    await asyncio.gather(*(client(count // clients) for _ in range(clients)))
    return statuses


def refusal_cost(tree: Tree, spin_model: Path, logs: Path, binary: bool, count: int) -> float:
    """Microseconds of the server's request threads per refused request (see the module)."""
    body, headers = spin_body(32, binary)
    with server(tree, spin_model, logs, "--max-queue-size", "1") as running:
        port, process = running.spec.port, running.process
        assert process is not None
        holders = [socket.create_connection((HOST, port)) for _ in range(2)]
        try:
            holders[0].sendall(raw_request(port, SPIN_FOREVER))
            wait_for(lambda: metric(port, "kubeinfer_inflight_batches") == 1, within=60,
                     what="the spinning batch running", every=0.01)  # fmt: skip
            holders[1].sendall(raw_request(port, SPIN_FOREVER))
            wait_for(lambda: metric(port, "kubeinfer_queue_depth") == 1, within=60,
                     what="the second request queued", every=0.01)  # fmt: skip
            raw = raw_request(port, body, headers)
            before = request_threads_cpu_ns(process.pid)
            statuses = asyncio.run(refused_in_a_loop(port, raw, count, 8))
            spent = request_threads_cpu_ns(process.pid) - before
        finally:
            for holder in holders:
                holder.close()
            os.killpg(process.pid, signal.SIGKILL)  # the spin never ends: nothing to drain
            process.wait()
    assert set(statuses) == {503}, statuses
    return spent / sum(statuses.values()) / 1000


def refusal_cost_report(trees: list[Tree], scratch: Path, rounds: int, quick: bool) -> str:
    """`refusal_cost` per tree and encoding in interleaved rounds: a table of medians and
    ranges, and each round's ratio to the first tree's."""
    spin_model = build_wide_spin_model(scratch / "spin.onnx")
    count = 800 if quick else 4000
    runs: dict[tuple[str, str], list[float]] = {}
    for round_ in range(rounds):
        for encoding in ("json", "binary"):
            for tree in trees if round_ % 2 == 0 else trees[::-1]:
                us = refusal_cost(tree, spin_model, scratch / "logs", encoding == "binary", count)
                runs.setdefault((tree.label, encoding), []).append(us)
                print(f"round {round_ + 1} {tree.label} {encoding}: {us:.1f} us", flush=True)
    lines = [
        "### CPU per refused request: the server's request threads, 32-row requests",
        "",
        f"{count} refusals per run over 8 keep-alive clients; load average (1 min) "
        f"{os.getloadavg()[0]:.2f} at the end. Median of {rounds} rounds, range in brackets.",
        "",
        "| encoding | tree | us per refusal | ratio to the first tree's, per round |",
        "|---|---|--:|---|",
    ]
    for encoding in ("json", "binary"):
        first = runs[(trees[0].label, encoding)]
        for tree in trees:
            mine = sorted(runs[(tree.label, encoding)])
            ratios = [a / b for a, b in zip(runs[(tree.label, encoding)], first, strict=True)]
            lines.append(
                f"| {encoding} | {tree.label} | {mine[len(mine) // 2]:.0f} "
                f"[{mine[0]:.0f}-{mine[-1]:.0f}] | {' '.join(f'{r:.2f}' for r in ratios)} |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- amplification


async def probe_liveness(port: int, stop: asyncio.Event) -> float:
    """The slowest /v2/health/live answer while `stop` is unset, probing every 5 ms."""
    conn = await open_connection(HOST, port)
    raw = f"GET /v2/health/live HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()
    slowest = 0.0
    try:
        while not stop.is_set():
            sent = time.perf_counter()
            await conn.send(raw)
            slowest = max(slowest, time.perf_counter() - sent)
            await asyncio.sleep(0.005)
    finally:
        conn.close()
    return slowest


async def timed_with_probe(port: int, raw: bytes) -> tuple[int, float, float, bytes]:
    stop = asyncio.Event()
    probe = asyncio.create_task(probe_liveness(port, stop))
    await asyncio.sleep(0.05)
    conn = await open_connection(HOST, port)
    sent = time.perf_counter()
    try:
        response = await conn.send(raw)
    finally:
        conn.close()
    seconds = time.perf_counter() - sent
    await asyncio.sleep(0.02)
    stop.set()
    return response.status, seconds, await probe, response.body


def amplification(tree: Tree, model: Path, logs: Path, limit: int | None) -> dict:
    document = b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 512], "data": ['
    document += b"[]," * (64 * MIB // 3 - 40) + b"[]]}]}"
    bomb = gzip.compress(document, 9)
    flags = ("--max-request-bytes", str(limit)) if limit else ()
    with server(tree, model, logs, *flags) as running:
        port, pid = running.spec.port, running.process.pid  # type: ignore[union-attr]
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        before = memory_kib(pid, "VmRSS")
        status, seconds, probe, answer = asyncio.run(
            timed_with_probe(port, raw_request(port, bomb, {"Content-Encoding": "gzip"}))
        )
        growth = (memory_kib(pid, "VmHWM") - before) / 1024
        valid, headers = infer_body(32, binary=False)
        _, valid_seconds, valid_probe, _ = asyncio.run(
            timed_with_probe(port, raw_request(port, valid, headers))
        )
    return {
        "bomb_bytes": len(bomb), "inflated_bytes": len(document), "status": status,
        "ms": seconds * 1000, "growth_mb": growth, "probe_ms": probe * 1000,
        "answer": answer[:100].decode(errors="replace"),
        "valid_ms": valid_seconds * 1000, "valid_probe_ms": valid_probe * 1000,
    }  # fmt: skip


def large_requests(tree: Tree, big_model: Path, logs: Path) -> dict:
    """The slowest liveness probe during the largest requests a model with image-sized
    inputs (131072 FP32 per row) takes at 4 rows: 10 MiB of JSON, 2 MiB binary."""
    out = {}
    with server(tree, big_model, logs) as running:
        port = running.spec.port
        x = np.random.default_rng(1).standard_normal((4, 131072)).astype(np.float32)
        tensor = {"name": "input", "datatype": "FP32", "shape": [4, 131072]}
        document = json.dumps({"inputs": [{**tensor, "data": x.ravel().tolist()}]}).encode()
        binary = {**tensor, "parameters": {"binary_data_size": x.nbytes}}
        header = json.dumps({"inputs": [binary]}).encode()
        for label, body, headers in (
            ("json", document, {}),
            ("binary", header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}),
        ):
            runs = [asyncio.run(timed_with_probe(port, raw_request(port, body, headers)))
                    for _ in range(3)]  # fmt: skip
            out[label] = {"mib": len(body) / MIB, "statuses": sorted({r[0] for r in runs}),
                          "ms": max(r[1] for r in runs) * 1000,
                          "probe_ms": max(r[2] for r in runs) * 1000}  # fmt: skip
    return out


# --------------------------------------------------------------------------- aborted uploads


def abandoned_uploads(tree: Tree, model: Path, logs: Path) -> dict:
    with server(tree, model, logs, "--max-request-bytes", str(64 * MIB)) as running:
        port, pid = running.spec.port, running.process.pid  # type: ignore[union-attr]
        start = memory_kib(pid, "VmRSS")
        peak = start
        chunk = b"0" * MIB
        for _ in range(3):
            sockets = [socket.create_connection((HOST, port)) for _ in range(20)]
            for sock in sockets:
                sock.sendall(request_head(port, 64 * MIB))
            for _ in range(60):
                for sock in sockets:
                    sock.sendall(chunk)
                peak = max(peak, memory_kib(pid, "VmRSS"))
            for sock in sockets:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01" + b"\x00" * 7)
                sock.close()
            time.sleep(1.0)
            peak = max(peak, memory_kib(pid, "VmRSS"))
        time.sleep(1.0)
        end = memory_kib(pid, "VmRSS")
    log = running.log_path.read_text(errors="replace")
    return {"start_mb": start / 1024, "peak_mb": peak / 1024, "end_mb": end / 1024,
            "errors_logged": log.count(" ERROR ")}  # fmt: skip


# --------------------------------------------------------------------------- SIGTERM


@dataclass
class DrainCount:
    answered: dict[int, int] = field(default_factory=dict)
    unanswered: int = 0
    refused: int = 0


async def drain_clients(
    port: int,
    raw: bytes,
    clients: int,
    per_request: bool,
    signal_after: float,
    terminate: Callable[[], None],
) -> DrainCount:
    count = DrainCount()
    stop_at = time.perf_counter() + signal_after + 60

    async def client() -> None:
        conn: _Connection | None = None
        while time.perf_counter() < stop_at:
            if conn is None:
                try:
                    conn = await open_connection(HOST, port)
                except OSError:
                    count.refused += 1
                    return
            try:
                response = await conn.send(raw)
            except (LoadGenError, OSError):
                count.unanswered += 1
                conn.close()
                return
            count.answered[response.status] = count.answered.get(response.status, 0) + 1
            if per_request or response.headers.get("connection", "").lower() == "close":
                conn.close()
                conn = None
            if response.status == 503:
                await asyncio.sleep(float(response.headers.get("retry-after", "1")))

    async def signaller() -> None:
        await asyncio.sleep(signal_after)
        terminate()

    await asyncio.gather(signaller(), *(client() for _ in range(clients)))
    return count


def sigterm(tree: Tree, model: Path, logs: Path) -> dict:
    body, headers = infer_body(1, binary=False)
    results: dict = {}
    for label, clients, per_request in (("keep-alive", 64, False), ("per-request", 32, True)):
        with server(tree, model, logs, "--drain-grace-period-seconds", "30") as running:
            process = running.process
            assert process is not None
            port = running.spec.port
            exit_seconds: list[float] = []

            def terminate(process=process, exit_seconds=exit_seconds) -> None:
                def watch() -> None:
                    signalled = time.monotonic()
                    process.wait(60)
                    exit_seconds.append(time.monotonic() - signalled)

                process.send_signal(signal.SIGTERM)
                threading.Thread(target=watch, daemon=True).start()

            count = asyncio.run(drain_clients(port, raw_request(port, body, headers), clients,
                                              per_request, 2.0, terminate))  # fmt: skip
            process.wait(60)
            time.sleep(0.1)
            exited = exit_seconds[0] if exit_seconds else float("nan")
            results[label] = {"answered": count.answered, "unanswered": count.unanswered,
                              "exit_s": exited}  # fmt: skip
    with server(tree, model, logs, "--drain-grace-period-seconds", "30") as running:
        process, port = running.process, running.spec.port
        assert process is not None
        raw = raw_request(port, body, headers)
        with socket.create_connection((HOST, port), timeout=40) as sock:
            sock.sendall(raw[:-200])
            time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            sock.sendall(raw[-200:])
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except OSError:
                pass
        results["upload"] = answer.split(b"\r\n", 1)[0].decode(errors="replace") or "no answer"
        process.wait(60)
    with server(tree, model, logs, "--drain-grace-period-seconds", "30") as running:
        process = running.process
        assert process is not None
        idle = socket.create_connection((HOST, running.spec.port))
        signalled_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        results["idle_exit_s"] = time.monotonic() - signalled_at
        idle.close()
    return results


# --------------------------------------------------------------------------- stalled


def stalled(tree: Tree, model: Path, logs: Path) -> dict:
    with server(tree, model, logs) as running:
        port = running.spec.port
        half = f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\n".encode()
        sockets = []
        for _ in range(3000):
            sock = socket.create_connection((HOST, port))
            sock.sendall(half)
            sockets.append(sock)
        time.sleep(15)
        still_open = 0
        for sock in sockets:
            sock.setblocking(False)
            try:
                still_open += sock.recv(1) != b""
            except BlockingIOError:
                still_open += 1
            except OSError:
                pass
            sock.close()
    return {"open_after_15s": still_open}


# --------------------------------------------------------------------------- report


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


CLEAN_CPU_SHARE = 0.95
"""A round in which the server used at least this share of its core in both phases had
the core to itself: the machine's other work took too little of it to matter."""


def overload_report(rounds: dict[str, dict[str, list[dict]]], load: tuple[float, float]) -> str:
    """The overload tables: per tree and encoding, the median of the rounds and their
    range, against the goals (goodput >= 80 % of capacity, 503 p99 < 10 ms); once over
    all rounds, once over those in which the server had its core to itself."""
    lines = [
        f"### Overload: {OVERLOAD_FACTOR}x capacity, open loop, 32-row requests",
        "",
        f"Load average (1 min) before / after: {load[0]:.2f} / {load[1]:.2f}. Median of "
        "the rounds, range in brackets; the trees take turns within each round. Server "
        "CPU: the share of its core the server used while capacity was measured / under "
        "overload (below 100 %: idle, or the core taken by something else); goodput share "
        "per CPU-second: the same share with each phase's throughput divided by that CPU "
        "share, what it would be were the core the server's alone; CPU per refusal: the "
        "server's CPU under overload less its 200s at the capacity phase's CPU per "
        "request, per 503.",
    ]
    for title, keep in (
        ("All rounds", lambda r: True),
        (
            f"Rounds in which the server used at least {CLEAN_CPU_SHARE:.0%} of its core in "
            "both phases",
            lambda r: min(r["capacity_cpu"], r["overload_cpu"]) >= CLEAN_CPU_SHARE,
        ),
    ):
        lines += ["", f"{title}:", "", *_overload_rows(rounds, keep)]
    return "\n".join(lines)


def _overload_rows(rounds: dict[str, dict[str, list[dict]]], keep: Callable[[dict], bool]):
    yield (
        "| encoding | tree | rounds | capacity | offered | goodput (share of capacity) | "
        "503 p99 | 200 p99 | other / failed | server CPU | goodput share per CPU-second | "
        "CPU per refusal | verdict |"
    )
    yield "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"
    for encoding in ("json", "binary"):
        for label, by_encoding in rounds.items():
            runs = [r for r in by_encoding[encoding] if keep(r)]
            if not runs:
                yield f"| {encoding} | {label} | 0 | | | | | | | | | | |"
                continue

            def spread(key: str, runs: list[dict] = runs) -> tuple[float, float, float]:
                values = [r[key] for r in runs]
                return float(np.median(values)), min(values), max(values)

            capacity, offered = spread("capacity")[0], spread("offered")[0]
            share, share_low, share_high = spread("goodput_ratio")
            p99, p99_low, p99_high = spread("p99_503_ms")
            others = sum(sum(r["other"].values()) for r in runs)
            failed = sum(r["failures"] for r in runs)
            yield (
                f"| {encoding} | {label} | {len(runs)} | {capacity:.0f}/s | {offered:.0f}/s | "
                f"{spread('goodput')[0]:.0f}/s ({share:.0%} [{share_low:.0%}-{share_high:.0%}]) | "
                f"{p99:.1f} ms [{p99_low:.1f}-{p99_high:.1f}] | "
                f"{spread('p99_200_ms')[0]:.0f} ms | {others} / {failed} | "
                f"{spread('capacity_cpu')[0]:.0%} / {spread('overload_cpu')[0]:.0%} | "
                f"{spread('goodput_ratio_per_cpu')[0]:.0%} | "
                f"{spread('refusal_cpu_us')[0]:.0f} us | "
                f"{verdict(share >= 0.8 and p99 < 10)} |"
            )


def report(results: dict[str, dict]) -> str:
    lines: list[str] = []
    for label, r in results.items():
        lines += ["", f"### {label}", "", "| scenario | issue (before) | goal | measured |"]
        lines[-1] += " verdict |"
        lines.append("|---|---|---|---|---|")
        for key, what in (("amplification", "default limit"), ("amplification-64mib",
                                                                "limit 64 MiB")):  # fmt: skip
            a = r[key]
            lines.append(
                f"| 64 KiB gzip -> 64 MiB of [] ({what}) | 126 MB -> 2.4 GB, 9 s stall | "
                f"refused < 100 ms, < 50 MB growth | {a['status']} in {a['ms']:.0f} ms, "
                f"peak +{a['growth_mb']:.0f} MB | "
                f"{verdict(a['status'] == 413 and a['ms'] < 100 and a['growth_mb'] < 50)} |"
            )
            lines.append(
                f"| liveness probe during it / during a 32-row JSON request | probes failed "
                f"| < 50 ms | {a['probe_ms']:.1f} ms / {a['valid_probe_ms']:.1f} ms | "
                f"{verdict(max(a['probe_ms'], a['valid_probe_ms']) < 50)} |"
            )
        for encoding, g in r["large"].items():
            lines.append(
                f"| liveness probe during a {g['mib']:.0f} MiB {encoding} request (4 rows of "
                f"131072 FP32) | - | < 50 ms | {g['probe_ms']:.1f} ms (request {g['ms']:.0f} ms, "
                f"{g['statuses']}) | {verdict(g['probe_ms'] < 50)} |"
            )
        u = r["uploads"]
        lines.append(
            f"| 20 x 60 of 64 MiB abandoned, x3: RSS | 357 -> 3,477 MB | within 100 MB of "
            f"start | {u['start_mb']:.0f} -> peak {u['peak_mb']:.0f} -> {u['end_mb']:.0f} MB; "
            f"{u['errors_logged']} ERROR lines | "
            f"{verdict(u['end_mb'] - u['start_mb'] < 100)} |"
        )
        s = r["sigterm"]
        for mode, before in (("keep-alive", "64 reset"), ("per-request", "25-43 hung")):
            d = s[mode]
            lines.append(
                f"| SIGTERM, {mode} clients | {before} | 0 without an answer | "
                f"{d['unanswered']} without an answer, {d['answered']}, exit in "
                f"{d['exit_s']:.2f} s | {verdict(d['unanswered'] == 0)} |"
            )
        lines.append(
            f"| SIGTERM, upload in progress | no answer | its result | {s['upload']} | "
            f"{verdict(' 200 ' in s['upload'] + ' ')} |"
        )
        lines.append(
            f"| SIGTERM, idle | - | exit within 1 s | {s['idle_exit_s']:.2f} s | "
            f"{verdict(s['idle_exit_s'] < 1)} |"
        )
        t = r["stalled"]
        lines.append(
            f"| 3,000 stalled heads | all open after 90 s | closed by the header timeout | "
            f"{t['open_after_15s']} open after 15 s | {verdict(t['open_after_15s'] == 0)} |"
        )
    return "\n".join(lines)


def run_tree(tree: Tree, model: Path, big_model: Path, logs: Path, quick: bool) -> dict:
    out: dict = {}
    out["amplification"] = amplification(tree, model, logs, None)
    out["amplification-64mib"] = amplification(tree, model, logs, 64 * MIB)
    print("amplification", out["amplification"], out["amplification-64mib"], flush=True)
    out["large"] = large_requests(tree, big_model, logs)
    print("large", out["large"], flush=True)
    out["uploads"] = abandoned_uploads(tree, model, logs)
    print("uploads", out["uploads"], flush=True)
    out["sigterm"] = sigterm(tree, model, logs)
    print("sigterm", out["sigterm"], flush=True)
    out["stalled"] = stalled(tree, model, logs)
    print("stalled", out["stalled"], flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter overload windows")
    parser.add_argument(
        "--baseline", metavar="REV", help="an earlier commit (or a checkout's directory)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="overload rounds (default 3)")
    parser.add_argument("--overload-only", action="store_true", help="only the overload")
    parser.add_argument(
        "--refusal-cost", action="store_true", help="only the CPU per refused request"
    )
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CPU})
    scratch = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    try:
        model = build_small_mlp(scratch / "small.onnx")
        compared = trees(args.baseline, scratch)
        logs = scratch / "logs"
        if args.refusal_cost:
            print(refusal_cost_report(compared, scratch, args.rounds, args.quick))
            return 0
        load_before = os.getloadavg()[0]
        rounds = overload_rounds(compared, model, logs, args.rounds, args.quick)
        text = overload_report(rounds, (load_before, os.getloadavg()[0]))
        if not args.overload_only:
            big_model = build_mlp(scratch / "big.onnx", 131072, (8,), 8)
            results = {t.label: run_tree(t, model, big_model, logs, args.quick) for t in compared}
            text += "\n\n" + report(results)
        print(text)
        out = REPO / ".bench" / "hostile.md"
        out.parent.mkdir(exist_ok=True)
        out.write_text(text + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
