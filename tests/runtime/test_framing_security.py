"""The framing's defences as an attacker probes them (`runtime.http.framing`), on the pure
functions: the findings of its security review (see the module's docstring) and the
properties that keep it in step with aiohttp's parser.

Covers:
- a head built to make the header-of-note pattern backtrack (a singleton header's value
  of many spaces between two letters) is parsed in linear time, as a plain head is;
- `Proxy-Connection`, which aiohttp's parser reads as `Connection`, leaves the head to
  aiohttp, so a client asking it to close is never kept open by a refusal given here;
- for any head the framing frames (hypothesis, with the headers that steer llhttp's
  framing and the whitespace around their values), aiohttp's C parser ends the request
  at the same byte (the next request read whole after the declared body), reads the same
  keep-alive, and sees neither chunked nor an upgrade;
- a refused request declaring a body of 10**17 bytes is dropped as it comes: none of it
  is passed on and the framing holds no more than a head's worth of it in memory.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc

import pytest
from aiohttp.http_parser import HttpRequestParser
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kubeinfer.runtime.http.framing import (
    MAX_HEAD_BYTES,
    RequestFraming,
    RequestHead,
    parse_head,
)


def fastest_parse_seconds(raw: bytes) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        parse_head(raw)
        best = min(best, time.perf_counter() - started)
    return best


@pytest.mark.parametrize("name", ["Host", "Content-Type", "Connection", "Content-Length"])
def test_a_head_built_to_backtrack_is_parsed_in_linear_time(name: str) -> None:
    """A value `x<spaces>y` made the trimming pattern try every split of the spaces: about
    30 ms of the event loop for one 8 KB head (a thousand times a plain head's cost),
    so 200 KB/s of pipelined heads from one client stalled every connection."""
    pad = MAX_HEAD_BYTES - 100
    request_line = b"GET /v2/health/live HTTP/1.1\r\n"
    crafted = request_line + f"{name}: x".encode() + b" " * pad + b"y\r\n\r\n"
    plain = request_line + b"Host: x\r\nX-Pad: " + b"a" * pad + b"\r\n\r\n"
    assert len(crafted) <= MAX_HEAD_BYTES
    # A plain head of this size takes some 30 microseconds; the crafted one took 30 ms.
    assert fastest_parse_seconds(crafted) < 50 * fastest_parse_seconds(plain) + 0.001


def test_values_of_note_are_still_trimmed_of_spaces_and_tabs() -> None:
    raw = (
        b"POST /p HTTP/1.1\r\nHost: \t x y \t\r\n"
        b"Content-Length:\t 12 \t\r\nConnection: a ,close\r\n\r\n"
    )
    assert parse_head(raw) == RequestHead(b"POST", b"/p", 12, False)


@pytest.mark.parametrize(
    "line", ["Proxy-Connection: close", "proxy-connection: keep-alive", "PROXY-CONNECTION:"]
)
def test_proxy_connection_is_left_to_aiohttp(line: str) -> None:
    """aiohttp's parser (llhttp) reads Proxy-Connection as Connection: a refusal given
    here to `Proxy-Connection: close` kept open a connection aiohttp would have closed."""
    raw = f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n{line}\r\n\r\n".encode()
    assert parse_head(raw) is None


# --------------------------------------------------------------------------- against aiohttp


class _Protocol:
    def pause_reading(self) -> None: ...
    def resume_reading(self, **_: object) -> None: ...


async def _aiohttp_reads(data: bytes) -> list:
    parser = HttpRequestParser(_Protocol(), asyncio.get_running_loop(), 2**16)  # type: ignore[arg-type]
    messages, upgraded, _ = parser.feed_data(data)
    assert not upgraded
    return [message for message, _ in messages]


NEXT_REQUEST = b"GET /next HTTP/1.1\r\nHost: n\r\n\r\n"

steering_names = st.sampled_from(
    ["Host", "Content-Length", "content-length", "Transfer-Encoding", "Connection",
     "Proxy-Connection", "Keep-Alive", "Upgrade", "Expect", "TE", "Trailer", "X-A"]
)  # fmt: skip
steering_values = st.one_of(
    st.sampled_from(
        ["", "0", "7", "007", "close", "keep-alive", "Close, x", "upgrade", "chunked",
         "gzip, chunked", "100-continue", "x"]
    ),
    st.text(st.sampled_from(" \t0123456789,xc"), max_size=8),
)  # fmt: skip
separators = st.sampled_from([":", ": ", ":\t", ":  ", " :"])


@given(
    method=st.sampled_from(["POST", "GET", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"]),
    headers=st.lists(st.tuples(steering_names, separators, steering_values), max_size=5),
)
@example(method="POST", headers=[("Host", ": ", "x"), ("Proxy-Connection", ": ", "close")])
@settings(max_examples=500, deadline=None)
def test_a_framed_request_ends_where_aiohttp_ends_it(method, headers) -> None:
    """Whatever parse_head frames, aiohttp's parser ends at the same byte (the request
    after the declared body is read whole), with the same keep-alive: a refusal given
    here and its dropped body leave the connection where aiohttp would have it."""
    raw = (
        f"{method} /v2/models/m/infer HTTP/1.1\r\n".encode()
        + b"".join(f"{n}{s}{v}\r\n".encode() for n, s, v in headers)
        + b"\r\n"
    )
    framed = parse_head(raw)
    if framed is None:
        return
    stream = raw + b"N" * framed.content_length + (NEXT_REQUEST if framed.keep_alive else b"")
    messages = asyncio.run(_aiohttp_reads(stream))
    first = messages[0]
    assert not first.chunked and not first.upgrade
    assert first.should_close == (not framed.keep_alive)
    assert int(first.headers.get("Content-Length", "0")) == framed.content_length
    if framed.keep_alive:
        assert [m.path for m in messages] == ["/v2/models/m/infer", "/next"]
    else:
        assert len(messages) == 1


# --------------------------------------------------------------------------- dropping


class _Refusing:
    def __init__(self) -> None:
        self.passed = 0
        self.dropped_bodies = 0

    def pass_on(self, data: bytes) -> None:
        self.passed += len(data)

    def answer_here(self, head: RequestHead, more: bool) -> bool:
        return True

    def dropped(self, more: bool) -> None:
        self.dropped_bodies += 1


def test_a_huge_declared_body_is_dropped_without_being_held() -> None:
    receiver = _Refusing()
    framing = RequestFraming(receiver)
    buffer = bytearray(
        b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 1" + b"0" * 17 + b"\r\n\r\n"
    )
    framing.feed(buffer, len(buffer))
    read = bytearray(b"\x00" * (256 * 1024))
    tracemalloc.start()
    try:
        for _ in range(256):  # 64 MiB of body
            framing.feed(read, len(read))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert receiver.passed == 0 and receiver.dropped_bodies == 0  # still dropping
    assert peak < 2 * MAX_HEAD_BYTES
