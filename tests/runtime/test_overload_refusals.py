"""Refusals of a full queue, and the connections around them, on `kubeinfer serve`'s Rust
data plane in the test's process (the `serving` fixture) with the real engine behind a
gate (one execution slot held, a queue of two filled): what is running and queued is the
gate's doing, never the clock's, so these hold on a busy machine.

Covers:
- a request beyond the full queue is answered 503 with Retry-After, Server-Timing and the
  JSON error before its body is sent, counted by code and never in progress; its body,
  sent after the answer, even one that is not JSON, is read and dropped unparsed, and the
  same connection then serves a valid request;
- pipelined requests are answered in order, refusals among them;
- a head sent a byte at a time and a body in parts are read alike;
- a chunked request gets its 503 and its connection stays in step;
- a refused request whose body stops coming has its connection closed after
  bodyReadTimeoutSeconds;
- a connection that sends half a head, or nothing, and an idle keep-alive connection are
  closed after headerReadTimeoutSeconds;
- requests the HTTP parser refuses get a 400 and a closed connection, logged at DEBUG
  (a header block past the server's 64 KiB limit: 431);
- clients that leave after their head are given back their admission, leaving nothing
  admitted or in progress;
- a queue full of requests marked as able to wait (priority 3) refuses a newcomer at that
  level once it has read it, and a default-level one (the most urgent) sheds the newest
  of them (503) for its place;
- a flood of refusals over many connections does not starve the admitted requests: the
  held and queued ones are answered 200 while it goes on, and the flood's own requests
  are then admitted and answered 200 between its refusals.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from waiting import eventually

PATH = "/v2/models/tiny/infer"


def valid_body(priority: int | None = None) -> bytes:
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}
    request: dict[str, Any] = {"inputs": [tensor]}
    if priority is not None:
        request["parameters"] = {"priority": priority}
    return json.dumps(request).encode()


def head(length: int, path: str = PATH, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: t", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    return int(lines[0].split()[1]), headers, body


class Load:
    """Requests against a `Serving`, and the slot held and queue filled by the gate."""

    def __init__(self, serving: Any, gated: Any) -> None:
        self.serving, self.gated = serving, gated
        self.held: list[asyncio.Task] = []

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.serving.port)

    async def infer(self, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        reader, writer = await self.connect()
        payload = valid_body() if body is None else body
        writer.write(head(len(payload)) + payload)
        try:
            return await read_response(reader)
        finally:
            writer.close()

    def metric(self, name: str, **labels: str) -> float | None:
        """The served model's sample `name` at `labels` in a scrape (None: absent)."""
        key = tuple(sorted({"model": "tiny", "version": "1", **labels}.items()))
        return self.serving.served.metrics().get((name, key))

    async def fill(self) -> None:
        """Holds the slot with one request and queues two more at the default level, the
        most urgent: the queue is full of requests no newcomer could shed, so it refuses
        one before reading its body. (A queue of requests marked as able to wait reads a
        newcomer's body first: its `priority` may shed one.)"""
        served = self.serving.served
        self.gated.gate.clear()
        self.held.append(asyncio.create_task(self.infer()))
        await eventually(
            lambda: self.gated.running == 1, what="the slot held", every=0.002, in_thread=False
        )
        self.held += [asyncio.create_task(self.infer()) for _ in range(2)]
        await eventually(
            lambda: served.queued() == 2, what="the queue full", every=0.002, in_thread=False
        )

    async def release(self) -> list[bytes]:
        """Opens the gate; the bodies of the held and queued requests' answers (200)."""
        self.gated.gate.set()
        answers = await asyncio.gather(*self.held)
        self.held.clear()
        assert [status for status, _, _ in answers] == [200] * len(answers)
        return [body for _, _, body in answers]


@pytest.fixture
def load(serving: Any, gated: Any) -> Load:
    return Load(serving, gated)


async def test_a_full_server_refuses_before_the_body(load: Load) -> None:
    await load.fill()
    reader, writer = await load.connect()
    writer.write(head(40_000))  # no body yet: the answer cannot wait for it
    status, headers, body = await read_response(reader)
    assert status == 503, body
    assert headers["retry-after"] == "1"
    assert headers["content-type"] == "application/json"
    assert headers["server-timing"].startswith("infer;dur=")
    # Kept alive: the body is read and dropped after the answer, not waited for before it.
    assert "connection" not in headers
    assert "queue is full" in json.loads(body)["error"]
    assert load.metric("kubeinfer_requests_in_progress") == 3
    writer.close()
    expected = json.loads((await load.release())[0])["outputs"]
    status, _, body = await load.infer()  # the server goes on
    assert status == 200, body
    assert json.loads(body)["outputs"] == expected
    assert load.metric("kubeinfer_requests_total", code="503") == 1
    assert load.metric("kubeinfer_requests_total", code="400") is None
    assert load.metric("kubeinfer_requests_in_progress") == 0


@pytest.mark.parametrize("parts", [1, 50], ids=["whole", "in-parts"])
async def test_a_body_sent_after_its_refusal_is_dropped_and_the_connection_stays_in_step(
    load: Load, parts: int
) -> None:
    await load.fill()
    reader, writer = await load.connect()
    garbage = b"this is not JSON \x00\xff" * 4000
    writer.write(head(len(garbage)))
    assert (await read_response(reader))[0] == 503
    await send_slowly(writer, garbage, -(-len(garbage) // parts))  # no longer needed
    expected = json.loads((await load.release())[0])["outputs"]
    writer.write(head(len(valid_body())) + valid_body())  # the same connection, in step
    status, _, body = await read_response(reader)
    assert status == 200, body
    assert json.loads(body)["outputs"] == expected
    assert load.metric("kubeinfer_requests_total", code="400") is None
    writer.close()


async def test_pipelined_requests_are_answered_in_order(load: Load) -> None:
    await load.fill()
    reader, writer = await load.connect()
    payload = b"x" * 1000
    writer.write(head(len(payload)) + payload + head(0) + get("/v2/health/live"))
    statuses = [(await read_response(reader))[0] for _ in range(3)]
    assert statuses == [503, 503, 200]
    writer.write(get("/v2/health/live") + head(len(payload)) + payload + get("/v2/health/ready"))
    statuses = [(await read_response(reader))[0] for _ in range(3)]
    assert statuses == [200, 503, 200]
    await load.release()
    body = valid_body()
    writer.write(head(len(body)) + body + get("/v2/health/live") + head(len(body)) + body)
    statuses = [(await read_response(reader))[0] for _ in range(3)]
    assert statuses == [200, 200, 200]
    writer.close()


async def send_slowly(writer: asyncio.StreamWriter, data: bytes, part: int) -> None:
    for start in range(0, len(data), part):
        writer.write(data[start : start + part])
        await writer.drain()
        await asyncio.sleep(0.0005)  # not a wait: a client this slow is the test


async def test_a_head_a_byte_at_a_time_and_a_body_in_parts(load: Load) -> None:
    await load.fill()
    reader, writer = await load.connect()
    payload = valid_body()
    await send_slowly(writer, head(len(payload)), 1)
    status, headers, body = await read_response(reader)
    assert status == 503 and headers["retry-after"] == "1", body
    writer.close()
    await load.release()
    reader, writer = await load.connect()
    await send_slowly(writer, head(len(payload)), 1)
    await send_slowly(writer, payload, 50)
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_a_chunked_request_is_refused_and_stays_in_step(load: Load) -> None:
    await load.fill()
    reader, writer = await load.connect()
    chunked = (
        f"POST {PATH} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n"
    ).encode()
    writer.write(chunked)
    status, headers, _ = await read_response(reader)
    assert status == 503 and headers["retry-after"] == "1"
    await load.release()
    writer.write(head(len(valid_body())) + valid_body())
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_a_refused_body_that_stalls_closes_its_connection(load: Load) -> None:
    await load.fill()
    reader, writer = await load.connect()
    writer.write(head(1000) + b"x" * 10)
    status, headers, _ = await read_response(reader)
    assert status == 503 and "connection" not in headers  # answered before its body
    assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the server
    await load.release()
    writer.close()


async def test_stalled_heads_and_idle_connections_close_after_the_head_timeout(
    start_serving, gated: Any
) -> None:
    serving = await start_serving(header_read_timeout_seconds=0.3)
    load = Load(serving, gated)
    idle_reader, idle = await load.connect()
    idle.write(get("/v2/health/live"))
    assert (await read_response(idle_reader))[0] == 200
    stalled = []
    for index in range(20):
        reader, writer = await load.connect()
        if index % 2:  # half a head; or nothing at all
            writer.write(f"POST {PATH} HTTP/1.1\r\nHost: x\r\n".encode())
        stalled.append((reader, writer))
    for reader, writer in [*stalled, (idle_reader, idle)]:
        assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the server
        writer.close()
    assert (await load.infer())[0] == 200  # and the server goes on


HEADER_BLOCK_LIMIT = 64 * 1024
"""The Rust server's limit on a request's line and headers together (431 past it)."""


def long_header(size: int) -> bytes:
    """A GET of the liveness route whose head is `size` bytes long."""
    start = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Long: "
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


async def test_a_header_block_within_the_limit_is_taken(load: Load) -> None:
    reader, writer = await load.connect()
    writer.write(long_header(HEADER_BLOCK_LIMIT - 1024))
    assert (await read_response(reader))[0] == 200
    writer.close()


@pytest.mark.parametrize(
    ("raw", "refused"),
    [
        pytest.param(b"GARBAGE /\x01 HTTP/1.1\r\n\r\n", 400, id="request-line"),
        pytest.param(
            long_header(HEADER_BLOCK_LIMIT + 4096), 431, id="header-block-past-the-limit"
        ),
        pytest.param(long_header(2 * HEADER_BLOCK_LIMIT), 431, id="header-block-twice-the-limit"),
        pytest.param(
            b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
            b"\r\n\r\nzz\r\n", 400, id="chunk-size",
        ),
    ],
)  # fmt: skip
async def test_what_the_parser_refuses_is_a_4xx_never_logged_as_a_warning(
    load: Load, raw: bytes, refused: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Only that nothing is logged at WARNING or above is checked: the Rust server's log
    # levels are cached at each logger's first record (pyo3_log), so a test cannot turn
    # its DEBUG records on.
    reader, writer = await load.connect()
    writer.write(raw)
    status, _, body = await read_response(reader)
    assert status == refused, body
    assert await asyncio.wait_for(reader.read(), 30) == b""  # and closed
    writer.close()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert (await load.infer())[0] == 200  # and the server goes on


async def test_admissions_of_clients_that_leave_are_given_back(load: Load) -> None:
    body = valid_body()
    for pause in (0.0, 0.01, 0.0, 0.01):  # gone before its route ran, or while it reads
        writers = []
        for _ in range(20):
            _, writer = await load.connect()
            writer.write(head(len(body)) + body[:10])
            writers.append(writer)
        await asyncio.sleep(pause)  # not a wait: how long the clients stay before leaving
        for writer in writers:
            writer.transport.abort()  # a reset: the rest of the body never comes
    await eventually(
        lambda: load.metric("kubeinfer_requests_in_progress") == 0,
        what="no request in progress",
        every=0.002,
        in_thread=False,
    )
    await load.fill()  # every place given back: a slot's and the queue's are all taken again
    await load.release()
    status, _, answer = await load.infer()
    assert status == 200, answer


async def test_a_more_urgent_request_sheds_the_newest_less_urgent_one(load: Load) -> None:
    """A queue full of requests marked as able to wait (priority 3 of 3) reads a
    newcomer's body: at their level it is refused; at the default level (1, the most
    urgent) it takes the place of the newest queued request, which is answered 503."""
    served = load.serving.served
    load.gated.gate.clear()
    load.held.append(asyncio.create_task(load.infer()))
    await eventually(lambda: load.gated.running == 1, what="the slot held", every=0.002)
    older = asyncio.create_task(load.infer(valid_body(priority=3)))
    await eventually(lambda: served.queued() == 1, what="one queued", every=0.002)
    newest = asyncio.create_task(load.infer(valid_body(priority=3)))
    await eventually(lambda: served.queued() == 2, what="the queue full", every=0.002)
    status, _, body = await load.infer(valid_body(priority=3))  # nothing it may shed
    assert status == 503 and "queue is full" in json.loads(body)["error"], body
    urgent = asyncio.create_task(load.infer())
    status, headers, body = await asyncio.wait_for(newest, 10)
    assert status == 503 and headers["retry-after"] == "1", body
    await eventually(lambda: served.queued() == 2, what="the urgent one queued", every=0.002)
    load.held += [older, urgent]
    await load.release()


async def test_a_flood_of_refusals_does_not_starve_admitted_requests(load: Load) -> None:
    await load.fill()
    flooding = True
    statuses: dict[int, int] = {}

    async def flood() -> None:
        reader, writer = await load.connect()
        while flooding:  # a valid request, sent again as soon as answered
            writer.write(head(len(valid_body())) + valid_body())
            status, _, _ = await read_response(reader)
            statuses[status] = statuses.get(status, 0) + 1
        writer.close()

    flooders = [asyncio.create_task(flood()) for _ in range(16)]
    await eventually(
        lambda: statuses.get(503, 0) >= 200, what="200 refusals", every=0.002, in_thread=False
    )
    assert set(statuses) == {503}  # the queue is full: all refused
    await load.release()  # the held and queued requests complete under the flood
    await eventually(
        lambda: statuses.get(200, 0) >= 20, what="20 answers", every=0.002, in_thread=False
    )  # and more get in
    flooding = False
    await asyncio.gather(*flooders)
    assert set(statuses) == {200, 503}
