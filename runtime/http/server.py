"""The HTTP server's lifecycle (`HttpServer`), on aiohttp's own runner and request
handling (no hook into its protocol); `serving.serve_transports` runs it beside the gRPC
server over one data plane, until SIGTERM, then drains.

What aiohttp's options do here (`make_runner`):
- `keepalive_timeout` is `headerReadTimeoutSeconds`: a connection that has not delivered
  a complete request head this long after it opened or after its last answer is closed,
  whether it sent half a head or nothing (aiohttp arms the same timer for both).
- `lingering_time` is `bodyReadTimeoutSeconds`: after an answer given before the body was
  read (a 503 at admission, a 413), aiohttp reads and drops the rest of the body for up to
  this long, so the keep-alive connection stays in step; a body that does not come in
  that time closes the connection.
- A request aiohttp's parser refuses is answered by aiohttp itself (400, text/plain, the
  connection closed) and logged at DEBUG, not at ERROR with the client's bytes.

On SIGTERM (or SIGINT), in order (the data plane's steps first, `DataPlane.drain`):

1. Readiness turns false at once, and so does admission: an infer request arriving from
   now on is answered 503 with Retry-After, and every answer from now on carries
   `Connection: close`, so keep-alive clients leave after their answer. Mirroring to a
   shadow candidate stops, its work in flight cancelled.
2. Every request admitted before (its body still being read, decoded, queued or running)
   is answered with its result.
3. The listener closes. It first stops taking new handshakes (`handshakes`), then the
   connections the kernel had completed and the application had not yet seen are
   accepted, in the same step as the close, so such a client is answered (503) rather
   than reset.
4. After `_QUIET_SECONDS` (the requests of those connections arrive and are answered),
   aiohttp's graceful shutdown: each connection closes after the request it is handling,
   idle ones at once.

All of it within `drainGracePeriodSeconds`; what is left then is closed anyway.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.runtime.http.app import RUNNER_OPTIONS
from kubeinfer.runtime.http.handshakes import refuse_new_handshakes

log = logging.getLogger(__name__)

_QUIET_SECONDS = 0.25
_POLL_SECONDS = 0.005


class _ParserRefusalsAtDebug(logging.LoggerAdapter):
    """aiohttp's server logger (its `logger` option), but a request its parser refused
    (the client's error, already answered 400) is logged at DEBUG: at ERROR, with the
    client's bytes and a traceback, any port scanner would fill the log."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            log.debug("Refused a request the HTTP parser could not read status=%d reason=%s",
                      exc_info.code, str(exc_info.message)[:200])  # fmt: skip
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening, non-blocking TCP socket (SO_REUSEADDR, as aiohttp sets it)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def make_runner(app: web.Application, config: RuntimeConfig) -> web.AppRunner:
    """aiohttp's runner with the runtime's options (see the module)."""
    return web.AppRunner(
        app,
        **RUNNER_OPTIONS,
        keepalive_timeout=config.header_read_timeout_seconds,
        lingering_time=config.body_read_timeout_seconds,
        logger=_ParserRefusalsAtDebug(logging.getLogger("aiohttp.server"), {}),
        handle_signals=False,
        shutdown_timeout=max(0.1, config.drain_grace_period_seconds),
    )


class HttpServer:
    """The app served on config.host:config.http_port: `start()`, then on SIGTERM, once
    the data plane has drained, `close(deadline)` (see the module), then `cleanup()`."""

    def __init__(self, app: web.Application, config: RuntimeConfig) -> None:
        self._app, self._config = app, config
        self._runner = make_runner(app, config)
        self._site: web.SockSite | None = None
        self._sock: socket.socket | None = None

    async def start(self) -> int:
        """Listens and serves; returns the bound port. Raises OSError when the address
        cannot be listened on."""
        config = self._config
        await self._runner.setup()
        self._sock = sock = listening_socket(config.host, config.http_port)
        self._site = web.SockSite(self._runner, sock)
        await self._site.start()
        port = int(sock.getsockname()[1])
        log.info(
            "Started serving model=%s version=%s address=%s:%d",
            config.model_name, config.model_version, config.host, port,
        )  # fmt: skip
        return port

    async def close(self, deadline: float) -> None:
        """Closes the listener (answering the connections the kernel had accepted), then
        each connection after the request it is handling, by `deadline` (monotonic)."""
        assert self._site is not None and self._sock is not None
        loop = asyncio.get_running_loop()
        await _close_listener(self._site, self._sock, self._runner, loop)
        await _close_connections(self._runner.server, deadline)

    async def cleanup(self) -> None:
        """Releases what `start` made (whatever is still open is closed)."""
        await self._runner.cleanup()


async def _close_listener(
    site: web.SockSite, sock: socket.socket, runner: web.BaseRunner, loop: asyncio.AbstractEventLoop
) -> None:
    """Stops asyncio accepting (the connections it has just accepted are handed to the
    server a loop turn later: they are let through first, since once the asyncio server
    is closed they would fail and be left unanswered), then accepts what the kernel has
    queued and closes the listener (new handshakes refused first, so none completes in
    the gap unseen), and hands those connections to the server."""
    refuse_new_handshakes(sock)  # the handshakes under way complete in the sleep below
    loop.remove_reader(sock.fileno())
    await asyncio.sleep(_POLL_SECONDS)
    accepted = []
    while True:
        try:
            connection, _ = sock.accept()
        except OSError:  # BlockingIOError: nothing more queued
            break
        accepted.append(connection)
    await site.stop()  # closes the listening socket before it returns to the loop
    assert runner.server is not None
    for connection in accepted:
        connection.setblocking(False)
        await loop.connect_accepted_socket(runner.server, connection)


async def _close_connections(server: web.Server | None, deadline: float) -> None:
    """Lets the last connections' requests arrive (`_QUIET_SECONDS`), then aiohttp's
    graceful shutdown: each connection closes after the request it is handling (within
    the deadline), idle ones at once."""
    if server is None:
        return
    await asyncio.sleep(min(_QUIET_SECONDS, max(0.0, deadline - time.monotonic())))
    server.pre_shutdown()
    await server.shutdown(max(0.0, deadline - time.monotonic()))
