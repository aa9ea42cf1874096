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
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web, web_protocol

log = logging.getLogger(__name__)


class _Connection(web_protocol.RequestHandler):
    """One client connection (aiohttp's protocol handler, plus the times above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_request = False
        self.head_started_at: float | None = None
        """When the head of the next request became due (the connection opened) or its
        first byte came (after an answer); None while a request is handled, and while
        idle after an answer."""
        self.receiving = False
        """Bytes of a next request have come (it is not idle)."""
        self.last_answer_at: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.head_started_at = time.monotonic()  # its first request's head is due

    def data_received(self, data: bytes) -> None:
        if not self.in_request:
            self.receiving = True
            if self.head_started_at is None:
                self.head_started_at = time.monotonic()
        super().data_received(data)

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
    """aiohttp's low-level server, making `_Connection`s."""

    def __init__(self, handler: Any, *, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        super().__init__(handler, loop=loop, **kwargs)
        self._connection_loop = loop
        self._connection_options = {
            k: v for k, v in kwargs.items() if k not in ("request_factory", "handler_cancellation")
        }

    def __call__(self) -> _Connection:
        return _Connection(self, loop=self._connection_loop, **self._connection_options)


class ServingRunner(web.AppRunner):
    """An AppRunner whose server makes `_Connection`s (aiohttp's `_make_server` is the
    hook its runners override)."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
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
            **options,
        )


def request_started(request: web.BaseRequest) -> None:
    connection = request.protocol
    if isinstance(connection, _Connection):
        connection.in_request = True
        connection.receiving = False
        connection.head_started_at = None


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
        closed = 0
        for connection in self._server.connections:
            if not isinstance(connection, _Connection) or connection.in_request:
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
