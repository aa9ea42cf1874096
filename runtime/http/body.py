"""Reading an infer request's body: bounded in size and time, and never holding memory
after it fails.

- **Size**: a declared Content-Length over `maxRequestBytes` is refused (413) before a
  byte is read; a chunked body as soon as it passes the limit; a compressed body as soon
  as its inflated size does (inflation stops at the limit plus one byte: a gzip bomb
  costs the limit, not its inflated size).
- **Time**: each part of the body must come within `bodyReadTimeoutSeconds` of the
  previous one, and the whole body by the request's deadline (counted from its arrival);
  otherwise 408, and the connection is closed (the rest of the body may still come).
- **Memory**: the body grows in one buffer, which is emptied the moment reading fails. An
  exception raised while reading holds a reference cycle (exception -> traceback -> this
  frame -> the request -> its payload stream -> the exception) that only a full garbage
  collection breaks; emptying the buffer returns its memory at once whatever holds it.
- **A client that leaves** (the connection lost mid-body) raises `ClientGone`: counted and
  logged at DEBUG by the caller, never an ERROR with a traceback.

aiohttp would inflate compressed request bodies in its protocol parser, where a corrupt
stream becomes a plain-text 400 or a connection left waiting; the runner turns that off
(`auto_decompress=False`) and `inflate` does it here, with our errors, on a worker thread.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

from aiohttp import web
from kubeinfer.runtime.protocol.errors import (
    ClientGone,
    InvalidRequest,
    RequestTimeout,
    RequestTooLarge,
)

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def content_encoding(request: web.BaseRequest) -> str | None:
    """The body's Content-Encoding (None: identity); raises InvalidRequest for one that
    is not supported, before the body is read."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding == "identity":
        return None
    if encoding not in _WBITS:
        raise InvalidRequest(
            f"Content-Encoding {encoding!r} is not supported (gzip, deflate or identity)"
        )
    return encoding


def check_declared_length(request: web.BaseRequest, limit: int) -> None:
    """413 for a Content-Length over the limit, before anything is read."""
    if request.content_length is not None and request.content_length > limit:
        raise RequestTooLarge(
            f"the request body ({request.content_length} bytes) is over the limit of "
            f"{limit} bytes"
        )


async def read_body(
    request: web.BaseRequest,
    limit: int,
    deadline: float,
    idle_timeout_seconds: float,
    clock: Callable[[], float],
) -> bytes:
    """The raw (possibly compressed) body, at most `limit` bytes; see the module."""
    check_declared_length(request, limit)
    buffer = bytearray()
    try:
        while True:
            remaining = deadline - clock()
            if remaining <= 0:
                raise RequestTimeout(
                    f"the request body did not arrive by the request's deadline "
                    f"({len(buffer)} bytes had come)"
                )
            try:
                async with asyncio.timeout(min(idle_timeout_seconds, remaining)):
                    chunk = await request.content.readany()
            except TimeoutError:
                raise RequestTimeout(
                    f"the request body stalled ({len(buffer)} bytes had come; a part must "
                    f"come within {idle_timeout_seconds:g} s of the previous one, and the "
                    "whole body by the request's deadline)"
                ) from None
            if not chunk:
                return bytes(buffer)
            if len(buffer) + len(chunk) > limit:
                raise RequestTooLarge(f"the request body is over the limit of {limit} bytes")
            buffer += chunk
    except ConnectionError:
        raise ClientGone(
            f"the client left while sending its body ({len(buffer)} bytes had come)", "reading"
        ) from None
    except web.RequestPayloadError as error:
        if request.transport is None or request.transport.is_closing():
            raise ClientGone(
                f"the client left while sending its body ({len(buffer)} bytes had come)",
                "reading",
            ) from None
        raise InvalidRequest(f"the request body cannot be read: {error}") from None
    finally:
        buffer.clear()  # the memory goes back now, whatever still refers to the buffer


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` inflated, never past `limit` bytes (RequestTooLarge as soon as it would be);
    a worker thread's job (zlib releases the GIL while it inflates)."""
    inflater = zlib.decompressobj(_WBITS[encoding])
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise InvalidRequest(f"the {encoding} request body is corrupt: {error}") from None
    if len(data) > limit:
        raise RequestTooLarge(f"the request body inflates past the limit of {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise InvalidRequest(f"the {encoding} request body is truncated or has trailing data")
    return data
