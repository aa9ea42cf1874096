"""Our own small HTTP load generator, for the loads Triton's perf_analyzer
(`kubeinfer.cli.tune.perf`, which drives every other load) cannot express:

- requests of several sizes in one run: `kubeinfer tune --rows 1,8,32` and traces whose
  requests differ in rows (perf_analyzer sends every request of a run with one batch
  size, `-b`);
- load that behaves at the connection level, as the hostile benchmark's does: requests
  on a connection the server then closes or resets, half-sent heads and bodies,
  `Connection: close` and Retry-After honoured, refusals counted rather than fatal
  (perf_analyzer stops at the first request not answered 200);
- open-loop traffic whose request size changes mid-run without a pause
  (bench_adaptive_batching's phases).

Closed loop (`run_closed_loop`): N clients each own one keep-alive connection and send
requests back to back for a fixed duration after a warm-up; every completion inside the
measured window is counted and its latency kept. Open loop (`run_open_loop`): requests
leave at the times of a schedule whatever the server's pace, each on an idle connection
(a new one when none is idle), and a request's latency counts from the time it was due.
Raw HTTP/1.1 over an asyncio Protocol, request bytes encoded once before the run; only
what a v2 server answers is parsed (a status line, Content-Length, a body).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


class LoadGenError(RuntimeError):
    """The server answered something the generator cannot read, or closed the connection."""


# --------------------------------------------------------------------------- request bodies


@dataclass(frozen=True)
class EncodedRequest:
    """One pre-encoded HTTP request: the exact bytes written to the socket."""

    raw: bytes
    body_bytes: int
    rows: int = 1
    """Items along the batch dimension: the completions' rows are counted by this."""


def _http_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Connection: keep-alive",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def encode_json_tensors(
    host: str, port: int, model: str, tensors: Sequence[tuple[str, str, np.ndarray]]
) -> EncodedRequest:
    """A v2 JSON request of several inputs, each `(name, v2 datatype, array)`; the arrays
    share their first (batch) dimension, which becomes the request's `rows`."""
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(array.shape),
                    "datatype": datatype,
                    "data": array.ravel().tolist(),
                }
                for name, datatype, array in tensors
            ]
        }
    ).encode()
    path = f"/v2/models/{model}/infer"
    raw = _http_request(host, port, path, body, {"Content-Type": "application/json"})
    return EncodedRequest(raw, len(body), rows=int(tensors[0][2].shape[0]))


# --------------------------------------------------------------------------- the connection


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self._head: tuple[int, dict[str, str], int] | None = None  # status, headers, end
        self._lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = LoadGenError(f"server closed the connection: {exc or 'EOF'}")
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(self._lost)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._waiter is None:
            return
        if self._head is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            try:
                self._head = _parse_head(bytes(self._buf[:end]), end + 4)
            except LoadGenError as error:
                if not self._waiter.done():
                    self._waiter.set_exception(error)
                return
        status, headers, body_start = self._head
        body_end = body_start + int(headers["content-length"])
        if len(self._buf) < body_end:
            return
        body = bytes(self._buf[body_start:body_end])
        del self._buf[:body_end]
        self._head = None
        waiter, self._waiter = self._waiter, None
        if not waiter.done():  # cancelled: the run was interrupted, nobody reads it
            waiter.set_result(Response(status, headers, body))

    def send(self, raw: bytes) -> asyncio.Future[Response]:
        if self._lost is not None:
            raise self._lost
        assert self._transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(raw)
        return self._waiter

    @property
    def usable(self) -> bool:
        """Open, and no request in flight on it."""
        return self._lost is None and self._waiter is None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def _parse_head(head: bytes, body_start: int) -> tuple[int, dict[str, str], int]:
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as error:
        raise LoadGenError(f"not an HTTP status line: {lines[0]!r}") from error
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" not in headers:
        raise LoadGenError(
            f"response without Content-Length (chunked?); the load generator needs it: {headers}"
        )
    return status, headers, body_start


async def open_connection(host: str, port: int) -> Connection:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(Connection, host, port)
    return protocol


# --------------------------------------------------------------------------- the run


@dataclass
class RunResult:
    clients: int
    window_s: float
    completed: int
    errors: int
    latencies_s: np.ndarray
    client_cpu_s: float
    error_samples: list[str] = field(default_factory=list)
    completed_rows: int = 0
    """Rows (items along the batch dimension) of the completions counted in `completed`."""

    @property
    def throughput(self) -> float:
        return self.completed / self.window_s

    def percentile_ms(self, q: float) -> float:
        if not len(self.latencies_s):
            return float("nan")
        return float(np.percentile(self.latencies_s, q) * 1000)

    @property
    def client_cpu_us_per_request(self) -> float:
        done = self.completed + self.errors
        return self.client_cpu_s / done * 1e6 if done else float("nan")


class _Tally:
    """What a run counts inside its window: latencies of answered requests, their rows,
    and errors (a few of them kept as samples)."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.rows = 0
        self.errors = 0
        self.error_samples: list[str] = []

    def error(self, counted: bool, sample: str) -> None:
        if counted:
            self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(sample)

    def result(self, clients: int, window_s: float, cpu_s: float) -> RunResult:
        return RunResult(
            clients=clients,
            window_s=window_s,
            completed=len(self.latencies),
            errors=self.errors,
            latencies_s=np.asarray(self.latencies),
            client_cpu_s=cpu_s,
            error_samples=self.error_samples,
            completed_rows=self.rows,
        )


async def _window_hooks(
    window_start: float,
    window_end: float,
    on_window_start: Callable[[], object] | None,
    on_window_end: Callable[[], object] | None,
) -> float:
    """Runs the hooks at the window's edges (in a thread, so a blocking metrics scrape
    does not stall the clients' loop); returns the generator's CPU seconds in the window."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, window_start - time.perf_counter()))
    cpu0 = time.process_time()
    if on_window_start is not None:
        await loop.run_in_executor(None, on_window_start)
    await asyncio.sleep(max(0.0, window_end - time.perf_counter()))
    cpu1 = time.process_time()
    if on_window_end is not None:
        await loop.run_in_executor(None, on_window_end)
    return cpu1 - cpu0


async def run_closed_loop(
    host: str,
    port: int,
    requests: Sequence[EncodedRequest],
    clients: int,
    warmup_s: float,
    duration_s: float,
    on_window_start: Callable[[], object] | None = None,
    on_window_end: Callable[[], object] | None = None,
) -> RunResult:
    """Drives `clients` closed-loop clients for `warmup_s + duration_s`; only completions
    inside the last `duration_s` count. Client `i` sends `requests[i]`, then the next one,
    cycling through them. The optional hooks run at the window's edges."""
    conns = [await open_connection(host, port) for _ in range(clients)]
    start = time.perf_counter()
    window_start = start + warmup_s
    window_end = window_start + duration_s
    tally = _Tally()
    raws = [r.raw for r in requests]
    rows = [r.rows for r in requests]

    async def client(index: int, conn: Connection) -> None:
        i = index
        n = len(raws)
        perf = time.perf_counter
        record = tally.latencies.append
        while True:
            t0 = perf()
            if t0 >= window_end:
                return
            response = await conn.send(raws[i % n])
            t1 = perf()
            sent_rows = rows[i % n]
            i += 1
            in_window = window_start <= t1 < window_end
            if response.status != 200:
                tally.error(in_window, f"{response.status}: {response.body[:200]!r}")
                continue
            if in_window:
                record(t1 - t0)
                tally.rows += sent_rows

    try:
        hook_task = asyncio.ensure_future(
            _window_hooks(window_start, window_end, on_window_start, on_window_end)
        )
        await asyncio.gather(*(client(i, c) for i, c in enumerate(conns)))
        cpu_s = await hook_task
    finally:
        for conn in conns:
            conn.close()
    return tally.result(clients, duration_s, cpu_s)


class _IdleConnections:
    """The open loop's connections: a request takes an idle one, or opens a new one when
    none is idle (arrivals do not wait for the server), and hands it back unless the
    answer said `Connection: close`. `opened` counts every connection the run opened."""

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port
        self._idle: list[Connection] = []
        self.opened = 0

    async def take(self) -> Connection:
        """An idle connection, or a new one (OSError when the server refuses it)."""
        while self._idle and not self._idle[-1].usable:
            self._idle.pop().close()
        if self._idle:
            return self._idle.pop()
        conn = await open_connection(self._host, self._port)
        self.opened += 1
        return conn

    def give_back(self, conn: Connection, response: Response) -> None:
        if response.headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            self._idle.append(conn)

    def close(self) -> None:
        for conn in self._idle:
            conn.close()


async def _send_when_due(
    pool: _IdleConnections, tally: _Tally, request: EncodedRequest, due: float, counted: bool
) -> None:
    """One open-loop request, sent now although it was due at `due`: its latency counts
    from then, so the server's queue is charged to it. Every failure is tallied, none
    raised, as one request's failure must not stop the run."""
    try:
        conn = await pool.take()
    except OSError as error:
        tally.error(counted, f"cannot connect: {error}")
        return
    try:
        response = await conn.send(request.raw)
    except LoadGenError as error:
        conn.close()
        tally.error(counted, str(error))
        return
    except asyncio.CancelledError:
        conn.close()  # its answer would arrive on a connection nobody reads
        raise
    finished = time.perf_counter()
    pool.give_back(conn, response)
    if response.status != 200:
        tally.error(counted, f"{response.status}: {response.body[:200]!r}")
    elif counted:
        tally.latencies.append(finished - due)
        tally.rows += request.rows


async def _cancel_the_unanswered(
    in_flight: dict[asyncio.Task[None], float],
    drain_timeout_s: float,
    tally: _Tally,
    counted: Callable[[float], bool],
) -> None:
    """Gives the requests still in flight after the window `drain_timeout_s` to answer,
    then cancels the rest and counts each as an error: a request that never came back
    must weigh against the setting, not vanish from its figures."""
    if in_flight:
        await asyncio.wait(list(in_flight), timeout=drain_timeout_s)
    for task, due in list(in_flight.items()):
        task.cancel()
        tally.error(counted(due), f"no answer within {drain_timeout_s:g} s after the window")


async def run_open_loop(
    host: str,
    port: int,
    requests: Sequence[EncodedRequest],
    schedule: Sequence[tuple[float, int]],
    warmup_s: float,
    duration_s: float,
    drain_timeout_s: float = 10.0,
    max_outstanding: int = 4096,
    on_window_start: Callable[[], object] | None = None,
    on_window_end: Callable[[], object] | None = None,
) -> RunResult:
    """Sends `requests[index]` at each `(offset_s, index)` of `schedule` (offsets from the
    run's start, ascending) until `warmup_s + duration_s`; only requests due inside the
    last `duration_s` count, with their latency from when they were due. Requests still
    unanswered `drain_timeout_s` after the window count as errors, and so does an arrival
    that finds `max_outstanding` requests in flight (the server is hopelessly behind).
    `clients` in the result is the most connections the run opened."""
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    window_start = start + warmup_s
    window_end = window_start + duration_s
    tally = _Tally()
    pool = _IdleConnections(host, port)
    in_flight: dict[asyncio.Task[None], float] = {}

    def counted(due: float) -> bool:
        return window_start <= due < window_end

    hook_task = asyncio.ensure_future(
        _window_hooks(window_start, window_end, on_window_start, on_window_end)
    )
    try:
        for offset_s, index in schedule:
            due = start + offset_s
            if due >= window_end:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(in_flight) >= max_outstanding:
                tally.error(
                    counted(due),
                    f"{max_outstanding} requests were in flight: the server is far behind",
                )
                continue
            task = loop.create_task(_send_when_due(pool, tally, requests[index], due, counted(due)))
            in_flight[task] = due
            task.add_done_callback(in_flight.pop)
        cpu_s = await hook_task
        await _cancel_the_unanswered(in_flight, drain_timeout_s, tally, counted)
    finally:
        hook_task.cancel()
        pool.close()
    return tally.result(pool.opened, duration_s, cpu_s)
