"""The server's connections: aiohttp's protocol handler with what the runtime needs to
know about each connection, a timeout for request heads, and aiohttp's own errors as
JSON.

aiohttp closes an idle keep-alive connection after `keepalive_timeout`, counted from the
connection's start or its last answer, but it has no timeout for a request head that
starts and never ends: thousands of connections that sent half a head would stay open
for good. `_Connection` records when the head of its next request started (the
connection's opening, or the first byte after an answer) and `HeadTimeouts` closes the
connections whose head has taken longer than `headerReadTimeoutSeconds`. Idle keep-alive
connections are left to aiohttp's own timeout (it should stay longer than any load
balancer's in front, so that the balancer is the one to close them).

A request aiohttp's parser refuses (a malformed request line or header, a header over the
size limits) never reaches the app: aiohttp answers it itself, in text/plain, and logs it
at ERROR with the client's bytes. `_Connection.handle_error` answers it as JSON like every
other error of the server and logs it at DEBUG.

The app's middleware marks each connection's requests (`request_started`,
`request_finished`), which the head timeout and the graceful shutdown read (`is_quiet`).

Under overload most requests are refusals, and a refusal through aiohttp costs about what
a served request costs it before the handler, plus its body read into buffers only to be
dropped. So a connection frames its requests before aiohttp's parser (`framing`): once the
head of an infer request for this model has come and nothing of the connection is still
being answered by aiohttp, the request is admitted there and then (`head_admission`; the
route takes that admission, `take_admission`), or, the queue being full, the connection
writes the refusal itself and drops the body as it comes, uncopied, as aiohttp's
lingering would have. Every other request is passed on to aiohttp whole, and a connection
that sends one outside the framed subset is aiohttp's alone from then on. An admission no
route took ends when its request is answered otherwise or its connection is lost. The
body of a refusal given here must come within `bodyReadTimeoutSeconds` of it, and a
connection idle after one is closed after aiohttp's keep-alive timeout, both by
`HeadTimeouts`' sweep.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web, web_protocol
from kubeinfer.runtime.dataplane import AdmittedRequest
from kubeinfer.runtime.http.framing import RequestFraming, RequestHead
from kubeinfer.runtime.http.head_admission import HeadAdmission

log = logging.getLogger(__name__)


RECEIVE_BUFFER_BYTES = 256 * 1024
"""What one read takes from a socket at most (asyncio's own size for a read)."""


class _Connection(web_protocol.RequestHandler, asyncio.BufferedProtocol):
    """One client connection: aiohttp's protocol handler, plus the times above, and infer
    requests admitted or refused as their heads arrive (`head_admission`), framed before
    aiohttp's parser sees them (`framing`).

    Reads go into the server's one receive buffer (the event loop reads one socket at a
    time, and each read is handled before the next): the body of a refused request is
    counted there and dropped, never copied into an object. Bytes for aiohttp are copied
    out, a request at a time."""

    def __init__(
        self,
        *args: Any,
        admission: HeadAdmission | None = None,
        receive_buffer: bytearray | None = None,
        drop_seconds: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.in_request = False
        self.head_started_at: float | None = None
        """When the head of the next request became due (the connection opened) or its
        first byte came (after an answer); None while a request is handled, and while
        idle after an answer."""
        self.receiving = False
        """Bytes of a next request have come (it is not idle)."""
        self.last_answer_at: float | None = None
        self.dropping_until: float | None = None
        """While the body of a request refused here is being dropped: when that must
        end (`bodyReadTimeoutSeconds` after the refusal, as aiohttp lingers)."""
        self.answered_here = False
        """The last answer was a refusal given here: aiohttp's idle timer is off and
        `HeadTimeouts` closes the connection once it has been idle as long."""
        self._admission = admission
        self._admitted: collections.deque[tuple[int, AdmittedRequest]] = collections.deque()
        """Admissions made as heads arrived, with the index of their request among those
        passed on (aiohttp answers them in that order)."""
        self._buffer = bytearray(RECEIVE_BUFFER_BYTES) if receive_buffer is None else receive_buffer
        self._drop_seconds = drop_seconds
        self._framing = RequestFraming(self, framed=admission is not None)
        self._passed = 0  # requests passed on to aiohttp
        self._finished = 0  # ... whose answers aiohttp has written
        self._keep_alive = True  # aiohttp's last answer keeps the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.head_started_at = time.monotonic()  # its first request's head is due

    def get_buffer(self, sizehint: int) -> bytearray:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        if not self.in_request and self.dropping_until is None:
            self.receiving = True
            if self.head_started_at is None:
                self.head_started_at = time.monotonic()
        self._framing.feed(self._buffer, nbytes)

    def data_received(self, data: bytes) -> None:
        """Bytes read the other way (a transport without buffered reads): the same. An
        empty call is aiohttp's own, to parse what its parser holds: passed on."""
        if not data:
            web_protocol.RequestHandler.data_received(self, data)
        for start in range(0, len(data), len(self._buffer)):
            part = data[start : start + len(self._buffer)]
            self._buffer[: len(part)] = part
            self.buffer_updated(len(part))

    # RequestFraming's receiver

    def pass_on(self, data: bytes) -> None:
        web_protocol.RequestHandler.data_received(self, data)

    def answer_here(self, head: RequestHead, more: bool) -> bool:
        """While nothing of this connection is still being answered by aiohttp (answers
        go out in order; a request behind another is admitted when its turn comes, so it
        holds no place meanwhile): admits an infer request for this model now, or answers
        the full queue's refusal here (keep-alive on both sides and a client reading its
        answers). Else, and for every other request, passes it on."""
        admission, transport, outcome = self._admission, self.transport, None
        if (
            admission is not None
            and self._passed == self._finished
            and transport is not None
            and not transport.is_closing()
        ):
            may_refuse = head.keep_alive and self._keep_alive and not self.writing_paused
            outcome = admission.arrive(head, may_refuse=may_refuse)
        if isinstance(outcome, bytes):
            assert transport is not None
            self._refused(transport, outcome, head.content_length, more)
            return True
        if outcome is not None:
            self._admitted.append((self._passed, outcome))
        self._passed += 1
        return False

    def _refused(
        self, transport: asyncio.Transport, refusal: bytes, body_bytes: int, more: bool
    ) -> None:
        transport.write(refusal)
        self.keep_alive(True)  # aiohttp's idle timer off: it knows nothing of this answer
        now = time.monotonic()
        self.answered_here = True
        self.last_answer_at = now
        if body_bytes:
            self.dropping_until = now + self._drop_seconds
            self.receiving, self.head_started_at = True, None  # not quiet: more is due
        else:
            self._idle_or_next(more)

    def take_admission(self) -> AdmittedRequest | None:
        """The admission made when the head of the request aiohttp is answering now
        arrived, if one was."""
        admitted = self._admitted
        if admitted and admitted[0][0] == self._finished:
            return admitted.popleft()[1]
        return None

    def _abandon_admissions(self, *, before: int | None, client_gone: bool) -> None:
        """Ends the admissions no route took: of the requests answered (index below
        `before`) or, with None, all (the connection is gone)."""
        admitted = self._admitted
        while admitted and (before is None or admitted[0][0] < before):
            admitted.popleft()[1].abandon(client_gone=client_gone)

    def dropped(self, more: bool) -> None:
        self.dropping_until = None
        self._idle_or_next(more)

    def _idle_or_next(self, more: bool) -> None:
        """A refusal given here is over, body and all: idle, or a next head begun."""
        self.receiving = more
        self.head_started_at = time.monotonic() if more else None

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        """aiohttp's, then counts the answer written (a refusal given here must not
        overtake it) and whether it keeps the connection."""
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._finished += 1
            self._keep_alive = bool(resp.keep_alive)
            self.answered_here = False
            self._abandon_admissions(before=self._finished, client_gone=False)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._abandon_admissions(before=None, client_gone=True)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse (or to a handler that
        failed), as JSON; the connection is closed after it, as aiohttp does."""
        if request.writer.output_size > 0:
            raise ConnectionError("the response has started; no error can be sent now")
        reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        text = (message or str(exc or "") or reason or "bad request").strip()
        log.debug("Refused a request aiohttp could not handle status=%d reason=%s",
                  status, text[:200])  # fmt: skip
        response = web.Response(
            body=json.dumps({"error": f"{reason}: {text[:500]}" if reason else text}).encode(),
            status=status,
            content_type="application/json",
        )
        response.force_close()
        return response


class _Server(web.Server):
    """aiohttp's low-level server, making `_Connection`s, which share one receive buffer."""

    def __init__(
        self,
        handler: Any,
        *,
        loop: asyncio.AbstractEventLoop,
        admission: HeadAdmission | None,
        drop_seconds: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, loop=loop, **kwargs)
        self._connection_loop = loop
        self._connection_options = {
            k: v for k, v in kwargs.items() if k not in ("request_factory", "handler_cancellation")
        }
        self._admission = admission
        self._drop_seconds = drop_seconds
        self._receive_buffer = bytearray(RECEIVE_BUFFER_BYTES)

    def __call__(self) -> _Connection:
        return _Connection(
            self,
            loop=self._connection_loop,
            admission=self._admission,
            receive_buffer=self._receive_buffer,
            drop_seconds=self._drop_seconds,
            **self._connection_options,
        )


class ServingRunner(web.AppRunner):
    """An AppRunner whose server makes `_Connection`s (aiohttp's `_make_server` is the
    hook its runners override). `admission`: its connections admit infer requests, or
    answer the full queue's refusals, as their heads arrive (None: all is the app's);
    `drop_seconds`: how long the body of such a refusal may take to come before the
    connection is closed."""

    def __init__(
        self,
        app: web.Application,
        *,
        admission: HeadAdmission | None = None,
        drop_seconds: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._admission = admission
        self._drop_seconds = drop_seconds
        self._connection_options = {
            k: v for k, v in kwargs.items() if k not in ("handle_signals", "shutdown_timeout")
        }

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # starts the app, as AppRunner does
        options = dict(self._connection_options)
        options.setdefault("access_log_class", web.AccessLogger)
        return _Server(
            server.request_handler,
            request_factory=server.request_factory,
            loop=asyncio.get_running_loop(),
            admission=self._admission,
            drop_seconds=self._drop_seconds,
            **options,
        )


def request_started(request: web.BaseRequest) -> None:
    connection = request.protocol
    if isinstance(connection, _Connection):
        connection.in_request = True
        connection.receiving = False
        connection.head_started_at = None


def take_admission(request: web.BaseRequest) -> AdmittedRequest | None:
    """The admission made for `request` when its head arrived (`head_admission`), if its
    connection made one; the route then admits nothing itself."""
    connection = request.protocol
    return connection.take_admission() if isinstance(connection, _Connection) else None


def request_finished(request: web.BaseRequest) -> None:
    connection = request.protocol
    if isinstance(connection, _Connection):
        connection.in_request = False
        connection.last_answer_at = time.monotonic()


def is_quiet(connection: web_protocol.RequestHandler, since: float, quiet_seconds: float) -> bool:
    """No request in progress, no byte of a next one, and nothing for `quiet_seconds`
    after `since` or its last answer: a connection that can be closed without losing
    a request (a client sending just then aside)."""
    if not isinstance(connection, _Connection):
        return True
    if connection.in_request or connection.receiving:
        return False
    last = max(since, connection.last_answer_at or since)
    return time.monotonic() - last >= quiet_seconds


class HeadTimeouts:
    """Closes connections whose request head has taken longer than `timeout_seconds`."""

    def __init__(
        self,
        server: web.Server,
        timeout_seconds: float,
        on_closed: Callable[[], None],
    ) -> None:
        self._server = server
        self._timeout = timeout_seconds
        self._on_closed = on_closed
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kubeinfer-head-timeouts")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        interval = min(1.0, self._timeout / 4)
        while True:
            await asyncio.sleep(interval)
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> int:
        """Closes the connections whose head stalled (counted, and returned), and those
        whose refused body has not come in time or that have been idle past aiohttp's
        keep-alive timeout after a refusal given by the connection (`_Connection`)."""
        closed = 0
        for connection in self._server.connections:
            if not isinstance(connection, _Connection) or connection.in_request:
                continue
            if connection.dropping_until is not None:
                if now > connection.dropping_until:
                    connection.force_close()  # as aiohttp closes after lingering
                continue
            if connection.answered_here and not connection.receiving:
                idle_since = connection.last_answer_at or now
                if now - idle_since > connection.keepalive_timeout:
                    connection.force_close()
                continue
            started = connection.head_started_at
            if started is not None and now - started > self._timeout:
                connection.head_started_at = None
                connection.force_close()
                closed += 1
                self._on_closed()
        if closed:
            log.debug("Closed connections whose request head stalled count=%d", closed)
        return closed
