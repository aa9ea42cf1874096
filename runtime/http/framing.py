"""Where each request on a connection starts and ends, read before aiohttp's parser sees
the bytes (`connections`), so that a request the full queue refuses is answered, and its
body dropped unread, without aiohttp making a request of it.

Only a plain subset of HTTP/1.1 is framed here: a request line `METHOD /target HTTP/1.1`
(GET, HEAD, POST, PUT, DELETE, OPTIONS or PATCH), header lines `name: value` of visible
characters, one Host, at most one Content-Length (digits) and of each header aiohttp takes
once, no Transfer-Encoding, Expect, Upgrade or Proxy-Connection, the whole head under
`MAX_HEAD_BYTES`: no head aiohttp's parser would refuse or end elsewhere. A request
outside it (chunked, HTTP/1.0, a head aiohttp might read differently or refuse) is not
framed: from its first byte on, aiohttp's parser reads the rest of the connection, as it
read all of it before. Within the subset both parsers end a request at the same byte
(the head's blank line, then Content-Length bytes), which keeps the connection in step.

`RequestFraming` does no I/O: the connection feeds it what it reads and is called back
with the bytes to pass on to aiohttp, each framed head to answer or pass on, and the end
of a body it dropped.

Every head of a framed connection goes through `parse_head`, whoever sends it: it must stay
linear in the head's length. docs/framing-security.md records the security review of this
layer (smuggling, exhaustion, refusal paths): what was checked, found and fixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

HEAD_END = b"\r\n\r\n"

MAX_HEAD_BYTES = 8000
"""A head not ended within this many bytes is aiohttp's to read (every line of a framed
head is then under aiohttp's limits of 8190 bytes a line)."""

MAX_HEADER_LINES = 100
"""Fewer than aiohttp's limit (128), for the same reason."""

_HEAD_PATTERN = re.compile(
    rb"(GET|HEAD|POST|PUT|DELETE|OPTIONS|PATCH) (/[!-~]*) HTTP/1\.1\r\n"  # the request line
    rb"((?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t -~\x80-\xff]*\r\n){0,"
    + str(MAX_HEADER_LINES).encode()
    + rb"})\r\n"
)
_SINGLETONS = (
    b"content-length|content-location|content-range|content-type|etag|host|max-forwards|"
    b"server|user-agent"
)
"""The headers aiohttp's parser refuses twice in a request (RFC 9110's singletons, but
Transfer-Encoding, which is never framed)."""
_HEADER_OF_NOTE = re.compile(
    rb"^(" + _SINGLETONS + rb"|transfer-encoding|expect|upgrade|connection|proxy-connection|"
    rb"sec-websocket-key1):([^\r]*)\r$",
    re.IGNORECASE | re.MULTILINE,
)
"""The value is taken whole and trimmed in Python: a pattern trimming it (spaces, a lazy
value, spaces) backtracks through every split of a run of spaces inside the value, which
is quadratic in the line (see docs/framing-security.md)."""
_UNFRAMED = frozenset(
    (b"transfer-encoding", b"expect", b"upgrade", b"proxy-connection", b"sec-websocket-key1")
)
"""Headers that change where aiohttp ends the request or whether it keeps the connection
in ways not framed here (llhttp reads Proxy-Connection as Connection)."""
_OWS = b" \t"
_DIGITS = re.compile(rb"[0-9]{1,18}")


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A framed request head: what the connection needs to answer or pass it on."""

    method: bytes
    target: bytes
    """The request target as sent (path and query)."""
    content_length: int
    """The body's length in bytes (0 without a Content-Length)."""
    keep_alive: bool
    """False when the request says `Connection: close`."""

    @property
    def path(self) -> bytes:
        return self.target.partition(b"?")[0]


def parse_head(head: bytes) -> RequestHead | None:
    """The request of `head` (its bytes up to and including the blank line that ends
    it), or None when it is outside the framed subset."""
    matched = _HEAD_PATTERN.fullmatch(head) if len(head) <= MAX_HEAD_BYTES else None
    if matched is None:
        return None
    content_length: int | None = None
    keep_alive = True
    seen: set[bytes] = set()
    for header in _HEADER_OF_NOTE.finditer(matched.group(3)):
        name, value = header.group(1).lower(), header.group(2).strip(_OWS)
        if name in _UNFRAMED or name in seen:
            return None
        if name == b"connection":
            tokens = {token.strip().lower() for token in value.split(b",")}
            if b"upgrade" in tokens:
                return None
            keep_alive = keep_alive and b"close" not in tokens
            continue
        seen.add(name)
        if name == b"content-length":
            if _DIGITS.fullmatch(value) is None:
                return None
            content_length = int(value)
    if b"host" not in seen:  # HTTP/1.1 requires one, and aiohttp refuses a request without
        return None
    return RequestHead(matched.group(1), matched.group(2), content_length or 0, keep_alive)


class FramingReceiver(Protocol):
    """What `RequestFraming` calls back (the connection)."""

    def pass_on(self, data: bytes) -> None:
        """Bytes for aiohttp's parser, in order: whole framed heads with their bodies,
        or everything from a head outside the subset on."""

    def answer_here(self, head: RequestHead, more: bool) -> bool:
        """A framed head, before any of it is passed on: True when the receiver has
        answered it (its body, if any, is then dropped), False to pass it on. `more`:
        bytes after it came in the same read."""

    def dropped(self, more: bool) -> None:
        """The body of a request answered here has ended."""


_HEAD, _BODY, _DROP, _PASS_ALL = "head", "body", "drop", "pass all"


class RequestFraming:
    """Splits one connection's bytes into requests (see the module): reading a head,
    passing its body on, dropping the body of a request answered here, or passing
    everything on once a head outside the subset came (or when `framed` is False)."""

    def __init__(self, receiver: FramingReceiver, *, framed: bool = True) -> None:
        self._receiver = receiver
        self._state = _HEAD if framed else _PASS_ALL
        self._head = b""  # a head begun in an earlier read
        self._body_left = 0

    @property
    def framed(self) -> bool:
        """Heads are still read here (none outside the subset came)."""
        return self._state != _PASS_ALL

    def feed(self, buffer: bytearray, nbytes: int) -> None:
        """Takes the first `nbytes` of `buffer` (what one read brought)."""
        view, position, receiver = memoryview(buffer), 0, self._receiver
        while position < nbytes:
            state = self._state
            if state == _PASS_ALL:
                receiver.pass_on(bytes(view[position:nbytes]))
                return
            if state != _HEAD:
                taken = min(self._body_left, nbytes - position)
                if state == _BODY:
                    receiver.pass_on(bytes(view[position : position + taken]))
                position += taken
                self._body_left -= taken
                if not self._body_left:
                    self._state = _HEAD
                    if state == _DROP:
                        receiver.dropped(position < nbytes)
                continue
            begun = len(self._head)
            head, after = self._take_head(buffer, view, position, nbytes)
            if head is None:
                return  # the head goes on in the next read, or all is passed on now
            parsed = parse_head(head)
            if parsed is None:  # outside the subset: aiohttp reads from this head on
                # The head with the rest of this read in one call, as aiohttp would have
                # had them: a body error it finds before dispatching the request (a bad
                # chunk size) it answers with 400, one after dispatch it leaves to the
                # body read timeout.
                self._state = _PASS_ALL
                receiver.pass_on(head + bytes(view[after:nbytes]))
                return
            if receiver.answer_here(parsed, after < nbytes):
                position = after
                self._body_left = parsed.content_length
                if self._body_left:
                    self._state = _DROP
                continue
            taken = min(parsed.content_length, nbytes - after)
            if begun:  # the head began in an earlier read
                receiver.pass_on(head + bytes(view[after : after + taken]))
            else:  # head and body as they lie in the buffer: one copy
                receiver.pass_on(bytes(view[position : after + taken]))
            position = after + taken
            self._body_left = parsed.content_length - taken
            if self._body_left:
                self._state = _BODY

    def _take_head(
        self, buffer: bytearray, view: memoryview, position: int, nbytes: int
    ) -> tuple[bytes | None, int]:
        """The head that starts at `position` (or began in an earlier read) and the
        position after it, when it ends in this read; else None (the head is kept for
        the next read or, past MAX_HEAD_BYTES, passed on with the rest of the read)."""
        begun = self._head
        stop = min(nbytes, position + MAX_HEAD_BYTES - len(begun))
        if begun:  # look for its end across the seam too
            data = begun + bytes(view[position:stop])
            end = data.find(HEAD_END, max(0, len(begun) - len(HEAD_END) + 1))
            if end >= 0:
                self._head = b""
                end += len(HEAD_END)
                return data[:end], position + end - len(begun)
            self._head = data
        else:
            end = buffer.find(HEAD_END, position, stop)
            if end >= 0:
                end += len(HEAD_END)
                return bytes(view[position:end]), end
            self._head = bytes(view[position:stop])
        if len(self._head) >= MAX_HEAD_BYTES:  # aiohttp's, under its own limits
            self._state = _PASS_ALL
            head, self._head = self._head, b""
            self._receiver.pass_on(head + bytes(view[stop:nbytes]))
        return None, nbytes
