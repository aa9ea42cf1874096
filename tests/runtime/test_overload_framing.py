"""The framing of requests before aiohttp's parser (`runtime.http.framing`) and the bytes
of the refusal a connection answers itself (`runtime.http.head_admission`), as tables.

Covers: which heads are framed (and where their request ends), and that every head outside
the plain subset (chunked, HTTP/1.0, two or odd Content-Lengths, folded or bare-LF lines,
Expect, Upgrade, a head too long or with too many lines) is left to aiohttp; how
`RequestFraming` splits a connection's reads (pipelined requests, heads and bodies across
reads, a head outside the subset or too long: everything passed on from its first byte),
and, for any cuts of the reads (hypothesis), that exactly the requests not answered here
are passed on, in order, and every answered one's body is dropped; that the refusal is
a well-formed HTTP/1.1 503 with Retry-After, Server-Timing and the JSON error, read back by
the standard library's client; and which targets are this model's infer route.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import itertools
import json

import pytest
from aiohttp.http_parser import HttpRequestParser
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeinfer.runtime.http.framing import MAX_HEAD_BYTES, RequestFraming, RequestHead, parse_head
from kubeinfer.runtime.http.head_admission import encode_refusal, infer_paths
from kubeinfer.runtime.protocol.errors import Overloaded

INFER = b"POST /v2/models/m/infer HTTP/1.1\r\n"


def head(*lines: str, request_line: bytes = INFER) -> bytes:
    return request_line + b"".join(line.encode("latin-1") + b"\r\n" for line in lines) + b"\r\n"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            head("Host: x", "Content-Length: 340123", "Content-Type: application/json"),
            RequestHead(b"POST", b"/v2/models/m/infer", 340123, True),
        ),
        (head("Host: x"), RequestHead(b"POST", b"/v2/models/m/infer", 0, True)),
        (
            head("Host: x", request_line=b"GET /v2/health/ready?verbose=1 HTTP/1.1\r\n"),
            RequestHead(b"GET", b"/v2/health/ready?verbose=1", 0, True),
        ),
        (
            head("Connection: keep-alive, Close", "content-length:  12  ", "HOST: x"),
            RequestHead(b"POST", b"/v2/models/m/infer", 12, False),
        ),
        (
            head("Inference-Header-Content-Length: 120", "Content-Length: 0007", "Host:"),
            RequestHead(b"POST", b"/v2/models/m/infer", 7, True),
        ),
        (
            head("Host: x", "Accept: a", "Accept: b", "Connection: keep-alive", "Connection: x"),
            RequestHead(b"POST", b"/v2/models/m/infer", 0, True),
        ),
    ],
)
def test_plain_heads_are_framed(raw: bytes, expected: RequestHead) -> None:
    assert parse_head(raw) == expected


@pytest.mark.parametrize(
    ("why", "raw"),
    [
        ("no Host", head("Content-Length: 5")),
        ("two Hosts", head("Host: x", "Host: y")),
        ("two Content-Types", head("Host: x", "Content-Type: a", "content-type: b")),
        ("two User-Agents", head("Host: x", "User-Agent: a", "User-Agent: a")),
        ("a WebSocket key", head("Host: x", "Sec-WebSocket-Key1: 1")),
        ("chunked", head("Transfer-Encoding: chunked")),
        ("both lengths", head("Content-Length: 5", "Transfer-Encoding: chunked")),
        ("two lengths", head("Content-Length: 5", "Content-Length: 5")),
        ("a signed length", head("Content-Length: +5")),
        ("a length in hex", head("Content-Length: 0x10")),
        ("an empty length", head("Content-Length: ")),
        ("a length past 18 digits", head("Content-Length: 1234567890123456789")),
        ("HTTP/1.0", head(request_line=b"POST /v2/models/m/infer HTTP/1.0\r\n")),
        ("an absolute target", head(request_line=b"POST http://x/v2 HTTP/1.1\r\n")),
        ("a lower-case method", head(request_line=b"post /v2/models/m/infer HTTP/1.1\r\n")),
        ("a space in the target", head(request_line=b"POST /v2/a b HTTP/1.1\r\n")),
        ("a folded line", head("Host: x", " continued")),
        ("a line without a colon", head("Host x")),
        ("a space before the colon", head("Host : x")),
        ("a control byte in a value", head("Host: x\x01y")),
        ("a bare LF", INFER + b"Host: x\nContent-Length: 1\r\n\r\n"),
        ("Expect", head("Expect: 100-continue", "Content-Length: 5")),
        ("Upgrade", head("Upgrade: websocket")),
        ("Connection: upgrade", head("Connection: Upgrade")),
        ("not ended", INFER + b"Host: x\r\n"),
        ("too long", head(f"X-Pad: {'a' * MAX_HEAD_BYTES}")),
        ("too many lines", head(*(f"X-{n}: y" for n in range(101)))),
        ("not a request line", head(request_line=b"\r\nPOST /v2/models/m/infer HTTP/1.1\r\n")),
    ],
)
def test_heads_outside_the_subset_are_left_to_aiohttp(why: str, raw: bytes) -> None:
    assert parse_head(raw) is None, why


def test_the_path_leaves_the_query_out() -> None:
    parsed = parse_head(head("Host: x", request_line=b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\n"))
    assert parsed is not None and parsed.path == b"/v2/models/m/infer"


def test_the_refusal_is_a_503_with_retry_after_and_the_json_error() -> None:
    error = Overloaded("the queue is full (8 requests); retry later")

    class Wire:
        def makefile(self, mode: str) -> io.BytesIO:
            return io.BytesIO(encode_refusal(error, 0.000123))

    response = http.client.HTTPResponse(Wire())  # type: ignore[arg-type]
    response.begin()
    assert response.status == 503 and response.reason == "Service Unavailable"
    assert response.getheader("Retry-After") == "1"
    assert response.getheader("Content-Type") == "application/json"
    assert response.getheader("Server-Timing") == "infer;dur=0.123"
    assert not response.will_close  # the connection stays open
    assert json.loads(response.read()) == {"error": error.message}


def test_infer_paths_are_the_model_s_two_routes() -> None:
    assert infer_paths("resnet", "2") == {
        b"/v2/models/resnet/infer",
        b"/v2/models/resnet/versions/2/infer",
    }
    assert b"/v2/models/a%2Fb/infer" in infer_paths("a/b", "1")


# --------------------------------------------------------------------------- RequestFraming


class Recorder:
    """A FramingReceiver answering here the heads whose target is in `refused`."""

    def __init__(self, refused: tuple[bytes, ...] = (b"/refuse",)) -> None:
        self.refused = refused
        self.passed = b""
        self.events: list[tuple] = []

    def pass_on(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        self.passed += data
        self.events.append(("pass", len(data)))

    def answer_here(self, head: RequestHead, more: bool) -> bool:
        answered = head.path in self.refused
        self.events.append(("answered" if answered else "head", head.target, more))
        return answered

    def dropped(self, more: bool) -> None:
        self.events.append(("dropped", more))


def request(target: str, body: bytes = b"", *extra: str) -> bytes:
    lines = [f"POST {target} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def feed(framing: RequestFraming, stream: bytes, cuts: list[int]) -> None:
    """`stream` as reads cut at `cuts`, each through one reused buffer (as the server's)."""
    buffer = bytearray(len(stream) + 16)
    edges = [0, *sorted(set(cuts)), len(stream)]
    for start, end in itertools.pairwise(edges):
        if end > start:
            buffer[: end - start] = stream[start:end]
            buffer[end - start :] = b"\xee" * (len(buffer) - (end - start))  # stale bytes
            framing.feed(buffer, end - start)


def test_one_read_of_pipelined_requests() -> None:
    refused = request("/refuse", b"x" * 50)
    served = request("/serve", b"y" * 20)
    receiver = Recorder()
    feed(RequestFraming(receiver), refused + served + refused, [])
    assert receiver.passed == served  # head and body in one copy
    assert receiver.events == [
        ("answered", b"/refuse", True),
        ("dropped", True),
        ("head", b"/serve", True),
        ("pass", len(served)),
        ("answered", b"/refuse", True),  # its body follows in the read
        ("dropped", False),
    ]


def test_a_body_across_reads_is_passed_in_parts_and_the_next_head_framed() -> None:
    served = request("/serve", b"y" * 1000)
    receiver = Recorder()
    feed(RequestFraming(receiver), served + request("/refuse"), [100, 600])
    assert receiver.passed == served
    assert receiver.events[-1] == ("answered", b"/refuse", False)


def test_a_head_outside_the_subset_passes_everything_from_its_first_byte() -> None:
    chunked = b"POST /refuse HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    stream = request("/serve", b"ab") + chunked + request("/refuse", b"zz")
    receiver = Recorder()
    framing = RequestFraming(receiver)
    feed(framing, stream, [10, len(stream) - 3])
    assert receiver.passed == stream
    assert not framing.framed
    assert [e[0] for e in receiver.events if e[0] != "pass"] == ["head"]


def test_a_head_that_does_not_end_in_time_is_passed_on() -> None:
    stream = b"POST /refuse HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_HEAD_BYTES + 100)
    receiver = Recorder()
    framing = RequestFraming(receiver)
    feed(framing, stream, [3000, 6000])
    assert receiver.passed == stream and not framing.framed


def test_unframed_connections_pass_every_byte_as_read() -> None:
    receiver = Recorder()
    stream = request("/refuse", b"q" * 10) * 3
    feed(RequestFraming(receiver, framed=False), stream, [7, 40])
    assert receiver.passed == stream
    assert [e[0] for e in receiver.events] == ["pass"] * 3


requests_strategy = st.lists(
    st.tuples(st.sampled_from(["/refuse", "/serve", "/refuse?q=1"]), st.binary(max_size=300)),
    min_size=1,
    max_size=6,
)


@given(requests=requests_strategy, data=st.data())
@settings(max_examples=300, deadline=None)
def test_however_the_reads_fall_every_byte_is_passed_or_dropped_once(requests, data) -> None:
    """Invariant: the bytes passed on are exactly the requests not answered here, in
    order, and every answered request's body is dropped, whatever the reads' sizes."""
    stream = b"".join(request(target, body) for target, body in requests)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    receiver = Recorder()
    feed(RequestFraming(receiver), stream, cuts)
    expected = b"".join(request(t, b) for t, b in requests if not t.startswith("/refuse"))
    assert receiver.passed == expected
    heads = [e for e in receiver.events if e[0] in ("answered", "head")]
    assert [e[1] for e in heads] == [t.encode() for t, _ in requests]
    answered_with_body = sum(1 for t, b in requests if t.startswith("/refuse") and b)
    assert sum(1 for e in receiver.events if e[0] == "dropped") == answered_with_body


# --------------------------------------------------------------------------- against aiohttp

header_names = st.sampled_from(
    ["Host", "host", "Content-Length", "Content-Type", "User-Agent", "Connection", "Accept",
     "X-Trace", "Transfer-Encoding", "Expect", "Upgrade", "Server", "ETag", "X\xe9"]
)  # fmt: skip
header_values = st.one_of(
    st.sampled_from(["", "x", "12", "007", "close", "keep-alive", "chunked", "a b", " pad "]),
    st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=6),
)


@given(
    method=st.sampled_from(["POST", "GET", "PUT", "POSTX", "post"]),
    target=st.sampled_from(["/v2/models/m/infer", "/v2/x?a=<b>", "/a\x7fb", "*", "/é"]),
    headers=st.lists(st.tuples(header_names, header_values), max_size=6),
)
@settings(max_examples=400, deadline=None)
def test_every_framed_head_is_one_aiohttp_reads_the_same(method, target, headers) -> None:
    """Whatever parse_head frames, aiohttp's parser (the C one the server runs) takes
    without an error, as the same method, target and body length: the framing never
    answers or admits a request aiohttp would have refused, and both end it alike."""
    raw = (
        f"{method} {target} HTTP/1.1\r\n".encode("latin-1")
        + b"".join(f"{name}: {value}\r\n".encode("latin-1") for name, value in headers)
        + b"\r\n"
    )
    framed = parse_head(raw)
    if framed is None:
        return

    class Protocol:
        def pause_reading(self) -> None: ...
        def resume_reading(self, **_: object) -> None: ...

    async def read() -> list:
        loop = asyncio.get_running_loop()
        parser = HttpRequestParser(Protocol(), loop, 2**16)  # type: ignore[arg-type]
        messages, _, _ = parser.feed_data(raw)
        return messages

    messages = asyncio.run(read())
    assert len(messages) == 1
    message = messages[0][0]
    assert (message.method.encode(), message.path.encode("latin-1")) == (
        framed.method,
        framed.target,
    )
    assert int(message.headers.get("Content-Length", "0")) == framed.content_length
