"""Reading an infer request's body: bounded in size and time, and never holding memory
after it fails.

- **Size**: a declared Content-Length over `maxRequestBytes` is refused (413) before a
  byte is read; a chunked body as soon as it passes the limit; a compressed body as soon
  as its inflated size does (inflation stops at the limit plus one byte: a gzip bomb
  costs the limit, not its inflated size; and a body that inflates to more JSON values
  than the model can take stops as soon as it has).
- **Time**: each part of the body must come within `bodyReadTimeoutSeconds` of the
  previous one, and the whole body by the request's deadline (counted from its arrival);
  otherwise 408, and the connection is closed (the rest of the body may still come).
- **Memory**: a body of `MAPPED_BODY_BYTES` or more is written into an anonymous memory
  map of its declared length (of the limit for a chunked body), which costs address
  space, not memory, until bytes arrive.
  - A body that filled its declared length is returned as a read-only view of that
    buffer, not copied out of it. The binary tensors decoded from it are views too, so
    the next copy of a request's bytes is into the batch (on a GPU, its pinned buffers).
    The map is unmapped when its last view goes.
  - A chunked body is copied out (its buffer has the limit's size).
  - A failed read's buffer is unmapped the moment reading ends, so its memory goes back
    to the OS at once. An exception raised while reading holds a reference cycle
    (exception -> traceback -> this frame -> the request -> its payload stream -> the
    exception) that only a full garbage collection breaks, and a heap buffer freed in the
    middle of the heap stays resident anyway (glibc returns only its top): 20 abandoned
    64 MiB uploads used to keep 3 GB resident.
- **A client that leaves** (the connection lost mid-body) raises `ClientGone`: counted and
  logged at DEBUG by the caller, never an ERROR with a traceback.

aiohttp would inflate compressed request bodies in its protocol parser, where a corrupt
stream becomes a plain-text 400 or a connection left waiting; the runner turns that off
(`auto_decompress=False`) and `inflate` does it here, with our errors, on a worker thread.
"""

from __future__ import annotations

import asyncio
import mmap
import zlib
from collections.abc import Callable

from aiohttp import StreamReader, web
from kubeinfer.runtime.protocol.errors import (
    ClientGone,
    InvalidRequest,
    RequestTimeout,
    RequestTooLarge,
    over_request_limit,
)
from kubeinfer.runtime.protocol.json_tensors import json_value_count

MAPPED_BODY_BYTES = 256 * 1024
"""Bodies from this size on go into a memory map; smaller ones (the common case, often
one chunk that is returned as it is) into a heap buffer, emptied on failure."""

_INFLATE_PART_BYTES = 256 * 1024

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
        raise over_request_limit(
            f"the request body ({request.content_length} bytes) is over the limit of {limit} bytes"
        )


async def read_body(
    request: web.BaseRequest,
    limit: int,
    deadline: float,
    idle_timeout_seconds: float,
    clock: Callable[[], float],
) -> bytes | memoryview:
    """The raw (possibly compressed) body, at most `limit` bytes (a read-only view where
    it filled its declared length); see the module."""
    check_declared_length(request, limit)
    declared = request.content_length
    size = declared if declared is not None else limit
    if size == 0:
        return b""
    content = request.content
    if declared is not None and content.total_bytes >= declared and content.is_eof():
        return await content.read()  # all here already (the common case): one part, no copy
    buffer: mmap.mmap | bytearray
    buffer = mmap.mmap(-1, size) if size >= MAPPED_BODY_BYTES else bytearray(size)
    filled, whole = 0, False
    try:
        while True:
            chunk = await _next_part(content, filled, deadline - clock(), idle_timeout_seconds)
            if not chunk:
                if filled == size:  # the declared length, all of it: the buffer is the body
                    whole = True
                    return memoryview(buffer).toreadonly()
                with memoryview(buffer) as view:  # one copy, of the filled part
                    return bytes(view[:filled])
            if filled + len(chunk) > size:
                raise over_request_limit(f"the request body is over the limit of {limit} bytes")
            if filled == 0 and len(chunk) == size and content.at_eof():
                return chunk  # the whole body in one part: no copy
            buffer[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
    except ConnectionError:
        raise ClientGone(
            f"the client left while sending its body ({filled} bytes had come)", "reading"
        ) from None
    except web.RequestPayloadError as error:
        if request.transport is None or request.transport.is_closing():
            raise ClientGone(
                f"the client left while sending its body ({filled} bytes had come)", "reading"
            ) from None
        raise InvalidRequest(f"the request body cannot be read: {error}") from None
    finally:  # the memory goes back now, whatever still refers to the buffer
        if whole:
            pass  # returned: it goes with its last view
        elif isinstance(buffer, mmap.mmap):
            buffer.close()
        else:
            buffer.clear()


async def _next_part(
    content: StreamReader, filled: int, remaining: float, idle_timeout_seconds: float
) -> bytes:
    """The body's next part (empty at its end), within `idle_timeout_seconds` of asking and
    the `remaining` seconds of the request's deadline (RequestTimeout past either)."""
    if remaining <= 0:
        raise RequestTimeout(
            f"the request body did not arrive by the request's deadline ({filled} bytes had come)"
        )
    try:
        if content.total_bytes > filled or content.is_eof():
            return await content.readany()  # buffered: no wait, no timer needed
        async with asyncio.timeout(min(idle_timeout_seconds, remaining)):
            return await content.readany()
    except TimeoutError:
        raise RequestTimeout(
            f"the request body stalled ({filled} bytes had come; a part must "
            f"come within {idle_timeout_seconds:g} s of the previous one, and the "
            "whole body by the request's deadline)"
        ) from None


def inflate(
    body: bytes | memoryview,
    encoding: str,
    limit: int,
    max_json_values: int | None = None,
    json_bytes: int | None = None,
) -> bytes:
    """`body` inflated, in parts of `_INFLATE_PART_BYTES`, never past `limit` bytes
    (RequestTooLarge as soon as it would be) nor past `max_json_values` values in its
    JSON (the first `json_bytes` bytes, or all of it: `json_tensors.json_value_count`),
    so a small body that inflates to millions of empty lists stops after its first part.
    A worker thread's job (zlib releases the GIL while it inflates)."""
    inflater = zlib.decompressobj(_WBITS[encoding])
    parts: list[bytes] = []
    size = values = 0
    pending = body
    try:
        while True:
            part = inflater.decompress(pending, _INFLATE_PART_BYTES)
            pending = inflater.unconsumed_tail
            if part:
                if size + len(part) > limit:
                    raise over_request_limit(
                        f"the request body inflates past the limit of {limit} bytes"
                    )
                if max_json_values is not None:
                    json_part = part if json_bytes is None else part[: max(0, json_bytes - size)]
                    values += json_value_count(json_part) - 1
                    if values > max_json_values:
                        raise RequestTooLarge(
                            f"the request body inflates to more JSON values than this "
                            f"model's inputs can take ({max_json_values}); it was not parsed"
                        )
                size += len(part)
                parts.append(part)
            if inflater.eof or not (part or pending):
                break
    except zlib.error as error:
        raise InvalidRequest(f"the {encoding} request body is corrupt: {error}") from None
    if not inflater.eof or inflater.unused_data:
        raise InvalidRequest(f"the {encoding} request body is truncated or has trailing data")
    return b"".join(parts)
