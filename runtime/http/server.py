"""Running the app until SIGTERM, then draining: the serving process's lifecycle.

On SIGTERM (or SIGINT), in order:

1. Readiness turns false at once, and so does admission: an infer request arriving from
   now on is answered 503 with Retry-After, and every answer from now on carries
   `Connection: close`, so keep-alive clients leave (politely) after their answer.
   Mirroring to a shadow candidate stops, its work in flight cancelled: it is
   best-effort and must not hold up the drain.
2. Every request admitted before (its body still being read, decoded, queued or running)
   is answered with its result.
3. The listener closes. The connections it had accepted and the application had not yet
   seen are accepted first, in the same step as the close, so a client whose connection
   the kernel had already completed is answered (503) rather than reset.
4. Each connection is closed as soon as it is quiet: no request in progress, no byte of
   a next one, and nothing for `_QUIET_SECONDS` (a client that was about to send gets
   its 503 rather than a closed connection). Connections busy with a request close after
   its answer.
5. The process exits as soon as the last connection is gone: within about
   `_QUIET_SECONDS` of SIGTERM when idle.

All of it within `drainGracePeriodSeconds`; what is left then is closed anyway.

The listening socket is made here (not by aiohttp's TCPSite) so that step 3 can accept
from it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import Callable

from aiohttp import web
from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.runtime.http.app import DATAPLANE, RUNNER_OPTIONS
from kubeinfer.runtime.http.connections import HeadTimeouts, ServingRunner, is_quiet
from kubeinfer.runtime.http.head_admission import HeadAdmission

log = logging.getLogger(__name__)

_QUIET_SECONDS = 0.25
_POLL_SECONDS = 0.005


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


def make_runner(app: web.Application, config: RuntimeConfig) -> ServingRunner:
    """The runner with the runtime's options. `lingering_time`: after an answer given
    before the body was read (a 503 at admission, a 408), aiohttp reads and drops the
    rest of the body for up to this long, so the connection stays in step; a body that
    does not come in that time is the stalled body of `bodyReadTimeoutSeconds`, and the
    connection is closed. The connections admit infer requests as their heads arrive, and
    answer the full queue's refusals themselves (`head_admission`), dropping those bodies
    under the same bound."""
    return ServingRunner(
        app,
        admission=HeadAdmission(app[DATAPLANE]),
        drop_seconds=config.body_read_timeout_seconds,
        **RUNNER_OPTIONS,
        lingering_time=config.body_read_timeout_seconds,
        handle_signals=False,
        shutdown_timeout=max(0.1, config.drain_grace_period_seconds),
    )


async def serve(
    app: web.Application,
    config: RuntimeConfig,
    *,
    on_started: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Serves `app` on config.host:config.http_port until SIGTERM/SIGINT (or `stop` is
    set), drains, and returns the exit code (0). `on_started` gets the bound port."""
    grace = config.drain_grace_period_seconds
    runner = make_runner(app, config)
    await runner.setup()
    sock = listening_socket(config.host, config.http_port)
    site = web.SockSite(runner, sock)
    await site.start()
    port = sock.getsockname()[1]
    dataplane = app[DATAPLANE]
    assert runner.server is not None
    heads = HeadTimeouts(
        runner.server,
        config.header_read_timeout_seconds,
        lambda: dataplane.metrics.connection_closed("header_timeout"),
    )
    heads.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info(
        "Started serving model=%s version=%s address=%s:%d",
        config.model_name, config.model_version, config.host, port,
    )  # fmt: skip
    if on_started is not None:
        on_started(port)
    try:
        await stop.wait()
        started = time.monotonic()
        deadline = started + grace
        drained = asyncio.create_task(dataplane.batcher.drain(grace))
        await asyncio.sleep(0)  # admission is off from here on
        log.info("Started draining admitted=%d grace_period_seconds=%s",
                 dataplane.batcher.admitted, grace)  # fmt: skip
        if dataplane.shadow is not None:
            await dataplane.shadow.stop()
        if not await drained:
            log.warning("Drain grace period ran out admitted=%d", dataplane.batcher.admitted)
        await _close_listener(site, sock, runner, loop)
        await _close_connections(runner.server, started, deadline)
        log.info("Drained seconds=%.3f", time.monotonic() - started)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await heads.stop()
        await runner.cleanup()
    log.info("Stopped serving model=%s", config.model_name)
    return 0


async def _close_listener(
    site: web.SockSite, sock: socket.socket, runner: web.BaseRunner, loop: asyncio.AbstractEventLoop
) -> None:
    """Stops asyncio accepting (the connections it has just accepted are handed to the
    server a loop turn later: they are let through first, since once the asyncio server
    is closed they would fail and be left unanswered), then accepts what the kernel has
    queued and closes the listener in the same step (no await in between: no connection
    can complete in the gap unseen), and hands those connections to the server."""
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


async def _close_connections(server: web.Server | None, since: float, deadline: float) -> None:
    """Closes each connection once it is quiet; returns when none is left (twice in a
    row: asyncio hands a connection it accepted to the server a few loop turns later)
    or at the deadline."""
    if server is None:
        return
    empty = 0
    while empty < 2:
        await asyncio.sleep(_POLL_SECONDS)
        remaining = server.connections
        empty = 0 if remaining else empty + 1
        if time.monotonic() >= deadline:
            log.warning("Drain grace period ran out open_connections=%d", len(remaining))
            return
        for connection in remaining:
            if is_quiet(connection, since, _QUIET_SECONDS):
                connection.force_close()  # idle: nothing to finish
