"""Admission when an infer request's head arrives, answered by the connection: admitted
(the route takes the admission), or refused with the whole 503 written from the head.

Under overload most requests are refused, and each refusal used to cost what a served
request costs aiohttp before the handler (a request object, a task, routing, the
middleware, a response object) plus reading its body into buffers only to drop them. And
admission happened only once aiohttp had made a request and run the route, so every head
read in the same turn of the event loop saw the same free places: all of them went
through aiohttp, and all but a few were refused there, at that full cost.

`HeadAdmission.arrive` is asked by the connection (`connections`) once a framed head of
an infer request for this model is complete and no earlier request of that connection is
still being answered. It admits the request then (the route finds the admission through
`connections.take_admission`; the deadline counts from here), or, while the queue is
full, returns the whole 503 (Retry-After, the JSON error, Server-Timing) as bytes,
counted as the route would count it, and the connection drops the body as it comes
without parsing it.

Every other request (another route or model, a connection with an answer still owed,
not started, draining, the engine stuck) gets None and goes through aiohttp and the route
as before.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import quote

from kubeinfer.runtime.dataplane import AdmittedRequest, DataPlane
from kubeinfer.runtime.http.framing import RequestHead
from kubeinfer.runtime.protocol.errors import InferenceServerError, error_response_parts
from kubeinfer.runtime.protocol.v2_types import SERVER_TIMING_HEADER, format_server_timing


def infer_paths(model_name: str, model_version: str) -> frozenset[bytes]:
    """The infer route's paths for this model, as a client that quotes nothing sends them
    (a client quoting differently goes through aiohttp's router, which is as right)."""
    name, version = quote(model_name, safe=""), quote(model_version, safe="")
    return frozenset(
        (
            f"/v2/models/{name}/infer".encode(),
            f"/v2/models/{name}/versions/{version}/infer".encode(),
        )
    )


def encode_refusal(error: InferenceServerError, seconds: float) -> bytes:
    """`error`'s whole HTTP/1.1 response (`error_response_parts`, the one status mapping),
    with Server-Timing as every infer answer has it; the connection stays open."""
    return _with_timing(_refusal_parts(error), seconds)


def _refusal_parts(error: InferenceServerError) -> tuple[bytes, bytes]:
    """The status line and headers but Server-Timing and Content-Length, and the body."""
    status, body, headers = error_response_parts(error)
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return "\r\n".join(lines).encode("latin-1"), body


def _with_timing(parts: tuple[bytes, bytes], seconds: float) -> bytes:
    head, body = parts
    timing = format_server_timing(seconds).encode()
    return b"%s\r\n%s: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        head,
        _SERVER_TIMING,
        timing,
        len(body),
        body,
    )


_SERVER_TIMING = SERVER_TIMING_HEADER.encode()


class HeadAdmission:
    """Admits, or refuses, an infer request for this model when its head arrives."""

    def __init__(self, dataplane: DataPlane, clock: Callable[[], float] | None = None) -> None:
        config = dataplane.config
        self._dataplane = dataplane
        self._clock = clock or dataplane.clock
        self._paths = infer_paths(config.model_name, config.model_version)
        self._parts: dict[str, tuple[bytes, bytes]] = {}
        """Each refusal's response but its timing, by message: the full queue's is the
        same every time, so it is encoded once."""

    def arrive(self, head: RequestHead, *, may_refuse: bool) -> bytes | AdmittedRequest | None:
        """The refusal's bytes (only if `may_refuse`), the request's admission, or None
        (not an infer request for this model, or not for the connection to decide): the
        request goes through aiohttp's route."""
        if head.method != b"POST" or head.path not in self._paths:
            return None
        arrived = self._clock()
        outcome = self._dataplane.admitted_on_arrival(arrived, refuse=may_refuse)
        if not isinstance(outcome, InferenceServerError):
            return outcome
        parts = self._parts.get(outcome.message)
        if parts is None:
            if len(self._parts) >= 16:
                self._parts.clear()
            parts = self._parts[outcome.message] = _refusal_parts(outcome)
        return _with_timing(parts, self._clock() - arrived)
