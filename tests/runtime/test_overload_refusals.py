"""Refusals of a full queue answered by the connection itself (`runtime.http.head_admission`,
`runtime.http.connections`), on the serving runner and sockets `serve` uses, in process,
with the real engine behind a gate (one execution slot held, a queue of two filled).

Covers:
- a request beyond the full queue is answered 503 with Retry-After, Server-Timing and the
  JSON error before its body is sent, counted by code and never in progress, and the app
  never sees it (no request object, no middleware); its body, even one that is not JSON,
  is dropped unparsed and the same connection then serves a valid request;
- pipelined requests are answered in order: a refusal never overtakes the answer to an
  earlier request of its connection (it then goes through the app, which refuses it);
- a head sent a byte at a time and a body in parts are framed alike;
- a chunked request (outside the framed subset) gets its 503 from the route, and its
  connection stays in step;
- a refused request whose body stops coming has its connection closed after
  bodyReadTimeoutSeconds, as aiohttp's lingering did; a connection idle after a refusal
  answered here is closed after aiohttp's keep-alive timeout, one answered by aiohttp is
  left to aiohttp's own timer;
- an infer request is admitted as its head arrives when nothing of its connection is owed,
  else in its turn; an admission no route took (the request answered before it, or its
  client gone) is given back, leaving nothing admitted or in progress;
- a flood of refusals over many connections does not starve the admitted requests: the
  held and queued ones are answered 200 while it goes on, and the flood's own requests
  are then admitted and answered 200 between its refusals.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from kubeinfer.runtime.http.app import DATAPLANE, create_app
from kubeinfer.runtime.http.connections import HeadTimeouts
from kubeinfer.runtime.http.server import listening_socket, make_runner
from prometheus_client import generate_latest

PATH = "/v2/models/tiny/infer"


def valid_body() -> bytes:
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}
    return json.dumps({"inputs": [tensor]}).encode()


def head(length: int, path: str = PATH, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: t", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return int(lines[0].split()[1]), headers, body


@dataclass
class Serving:
    port: int
    app: web.Application
    runner: web.AppRunner
    heads: HeadTimeouts
    gated: object
    seen: list[str] = field(default_factory=list)
    """The paths of the requests the app saw, in order."""
    held: list[asyncio.Task] = field(default_factory=list)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def infer(self, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        reader, writer = await self.connect()
        payload = valid_body() if body is None else body
        writer.write(head(len(payload)) + payload)
        try:
            return await asyncio.wait_for(read_response(reader), 15)
        finally:
            writer.close()

    def metric(self, text: str) -> bool:
        return text in generate_latest(self.app[DATAPLANE].metrics.registry).decode()

    async def fill(self) -> None:
        """Holds the slot with one request and queues two more: the queue is full."""
        batcher = self.app[DATAPLANE].batcher
        self.gated.gate.clear()  # type: ignore[attr-defined]
        self.held.append(asyncio.create_task(self.infer()))
        await wait_for(lambda: self.gated.running == 1)  # type: ignore[attr-defined]
        self.held += [asyncio.create_task(self.infer()) for _ in range(2)]
        await wait_for(lambda: batcher.queued == 2)

    async def release(self) -> list[bytes]:
        """Opens the gate; the bodies of the held and queued requests' answers (200)."""
        self.gated.gate.set()  # type: ignore[attr-defined]
        answers = await asyncio.gather(*self.held)
        self.held.clear()
        assert [status for status, _, _ in answers] == [200] * len(answers)
        return [body for _, _, body in answers]


async def wait_for(condition, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the server never got there"
        await asyncio.sleep(0.002)


@pytest.fixture
async def serving(gated, one_slot_queue_of_two) -> AsyncIterator[Serving]:
    config = one_slot_queue_of_two
    app = create_app(config, gated)
    seen: list[str] = []

    @web.middleware
    async def record(request: web.Request, handler):
        seen.append(request.path)
        if "X-Answer-Here" in request.headers:  # answered before the route, as aiohttp may
            return web.Response(status=202, text="answered before the route")
        return await handler(request)

    app.middlewares.append(record)
    runner = make_runner(app, config)
    await runner.setup()
    sock = listening_socket("127.0.0.1", 0)
    await web.SockSite(runner, sock).start()
    assert runner.server is not None
    heads = HeadTimeouts(runner.server, config.header_read_timeout_seconds, lambda: None)
    heads.start()
    try:
        yield Serving(sock.getsockname()[1], app, runner, heads, gated, seen)
    finally:
        gated.gate.set()
        await heads.stop()
        await runner.cleanup()


async def test_a_refusal_comes_before_the_body_which_is_dropped_unparsed(serving) -> None:
    await serving.fill()
    reader, writer = await serving.connect()
    garbage = b"this is not JSON \x00\xff" * 4000
    writer.write(head(len(garbage)))  # no body yet
    status, headers, body = await read_response(reader)
    assert status == 503, body
    assert headers["retry-after"] == "1"
    assert headers["content-type"] == "application/json"
    assert headers["server-timing"].startswith("infer;dur=")
    assert "queue is full" in json.loads(body)["error"]
    assert serving.seen == [PATH] * 3  # the held and queued ones only
    assert serving.metric('kubeinfer_requests_in_progress{model="tiny",version="1"} 3.0')
    writer.write(garbage)  # the body the server no longer needs: dropped, never parsed
    expected = json.loads((await serving.release())[0])["outputs"]
    writer.write(head(len(valid_body())) + valid_body())  # the same connection, in step
    status, _, body = await read_response(reader)
    assert status == 200, body
    assert json.loads(body)["outputs"] == expected
    assert serving.metric('kubeinfer_requests_total{code="503",model="tiny",version="1"} 1.0')
    assert serving.metric('kubeinfer_requests_total{code="400",model="tiny",version="1"}') is False
    assert serving.metric('kubeinfer_requests_in_progress{model="tiny",version="1"} 0.0')
    writer.close()


async def test_pipelined_requests_are_answered_in_order(serving) -> None:
    await serving.fill()
    reader, writer = await serving.connect()
    payload = b"x" * 1000
    writer.write(head(len(payload)) + payload + head(0) + get("/v2/health/live"))
    statuses = [(await read_response(reader))[0] for _ in range(3)]
    assert statuses == [503, 503, 200]
    assert serving.seen == [PATH] * 3 + ["/v2/health/live"]  # both refused here
    # An answer still owed by aiohttp comes first: the refusal behind it goes through
    # the app, which refuses it in turn.
    writer.write(get("/v2/health/live") + head(len(payload)) + payload + get("/v2/health/ready"))
    statuses = [(await read_response(reader))[0] for _ in range(3)]
    assert statuses == [200, 503, 200]
    assert serving.seen[-3:] == ["/v2/health/live", PATH, "/v2/health/ready"]
    await serving.release()
    writer.close()


async def test_a_head_a_byte_at_a_time_and_a_body_in_parts(serving) -> None:
    await serving.fill()
    reader, writer = await serving.connect()
    payload = valid_body()
    for byte in head(len(payload)):
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(0.0005)
    status, _, _ = await read_response(reader)
    assert status == 503
    for start in range(0, len(payload), 50):
        writer.write(payload[start : start + 50])
        await writer.drain()
        await asyncio.sleep(0.0005)
    await serving.release()
    writer.write(head(len(payload)) + payload)
    assert (await read_response(reader))[0] == 200
    assert serving.seen == [PATH] * 4
    writer.close()


async def test_a_chunked_request_is_refused_by_the_route_and_stays_in_step(serving) -> None:
    await serving.fill()
    reader, writer = await serving.connect()
    chunked = (
        f"POST {PATH} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n"
    ).encode()
    writer.write(chunked)
    status, headers, _ = await read_response(reader)
    assert status == 503 and headers["retry-after"] == "1"
    assert serving.seen == [PATH] * 4  # through the app
    await serving.release()
    writer.write(head(len(valid_body())) + valid_body())
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_a_refused_body_that_stalls_closes_its_connection(serving) -> None:
    await serving.fill()
    reader, writer = await serving.connect()
    writer.write(head(1000) + b"x" * 10)
    assert (await read_response(reader))[0] == 503
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
    assert time.monotonic() - started >= 0.25  # after bodyReadTimeoutSeconds (0.3 s)
    await serving.release()
    writer.close()


async def test_idle_after_a_refusal_closes_after_the_keep_alive_timeout(serving) -> None:
    await serving.fill()
    refused_reader, refused = await serving.connect()
    refused.write(head(0))
    assert (await read_response(refused_reader))[0] == 503
    await serving.release()
    served_reader, served = await serving.connect()
    served.write(get("/v2/health/live"))
    assert (await read_response(served_reader))[0] == 200
    await asyncio.sleep(0.01)
    timeout = serving.app[DATAPLANE] and 3630  # aiohttp's default keep-alive timeout
    serving.heads.sweep(time.monotonic() + timeout / 2)
    await asyncio.sleep(0.01)
    assert not refused.is_closing() and not refused_reader.at_eof()
    serving.heads.sweep(time.monotonic() + timeout + 1)
    assert await asyncio.wait_for(refused_reader.read(), 5) == b""
    served.write(get("/v2/health/live"))  # aiohttp's own timer decides for this one
    assert (await read_response(served_reader))[0] == 200
    for writer in (refused, served):
        writer.close()


async def test_a_flood_of_refusals_does_not_starve_admitted_requests(serving) -> None:
    await serving.fill()
    flooding = True
    statuses: dict[int, int] = {}

    async def flood() -> None:
        reader, writer = await serving.connect()
        while flooding:  # a valid request, sent again as soon as answered
            writer.write(head(len(valid_body())) + valid_body())
            status, _, _ = await read_response(reader)
            statuses[status] = statuses.get(status, 0) + 1
        writer.close()

    flooders = [asyncio.create_task(flood()) for _ in range(16)]
    await wait_for(lambda: statuses.get(503, 0) >= 200)
    assert set(statuses) == {503}  # the queue is full: all refused
    await serving.release()  # the held and queued requests complete under the flood
    await wait_for(lambda: statuses.get(200, 0) >= 20, seconds=15)  # and more get in
    flooding = False
    await asyncio.gather(*flooders)
    assert set(statuses) == {200, 503}


async def test_pipelined_requests_with_room_are_admitted_in_their_turn(serving) -> None:
    batcher = serving.app[DATAPLANE].batcher
    reader, writer = await serving.connect()
    body = valid_body()
    writer.write(head(len(body)) + body + get("/v2/health/live") + head(len(body)) + body)
    statuses = [(await read_response(reader))[0] for _ in range(3)]
    assert statuses == [200, 200, 200]
    writer.write(head(len(body), PATH, "X-Answer-Here: 1") + body)  # admitted, never routed
    assert (await read_response(reader))[0] == 202
    assert batcher.admitted == 0
    assert serving.metric('kubeinfer_requests_in_progress{model="tiny",version="1"} 0.0')
    writer.close()


async def test_admissions_of_clients_that_leave_are_given_back(serving) -> None:
    batcher = serving.app[DATAPLANE].batcher
    body = valid_body()
    for pause in (0.0, 0.01, 0.0, 0.01):  # gone before its route ran, or while it reads
        writers = []
        for _ in range(20):
            _, writer = await serving.connect()
            writer.write(head(len(body)) + body[:10])  # admitted as the head arrives
            writers.append(writer)
        await asyncio.sleep(pause)
        for writer in writers:
            writer.transport.abort()  # a reset: the rest of the body never comes
    await wait_for(lambda: batcher.admitted == 0)
    assert serving.metric('kubeinfer_requests_in_progress{model="tiny",version="1"} 0.0')
    status, _, answer = await serving.infer()
    assert status == 200, answer


class Transport(asyncio.Transport):
    """Where a connection made by hand writes (no socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None: ...

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


async def test_an_admission_whose_client_left_before_its_route_ran_is_given_back(
    serving,
) -> None:
    """The head read and the connection lost in one turn of the event loop: aiohttp never
    starts the route, and the admission made at the head is given back."""
    batcher = serving.app[DATAPLANE].batcher
    connection = serving.runner.server()  # a connection as the listener makes them
    connection.connection_made(Transport())
    data = head(len(valid_body())) + valid_body()[:10]
    connection.get_buffer(-1)[: len(data)] = data
    connection.buffer_updated(len(data))
    assert batcher.admitted == 1
    connection.connection_lost(ConnectionResetError("reset"))
    assert batcher.admitted == 0
    assert serving.metric('kubeinfer_requests_in_progress{model="tiny",version="1"} 0.0')
    assert serving.metric(
        'kubeinfer_requests_cancelled_total{model="tiny",stage="reading",version="1"} 1.0'
    )
