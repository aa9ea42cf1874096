"""Running the app until SIGTERM, then draining: the serving process's lifecycle.

On SIGTERM (or SIGINT) readiness turns false at once and new infer requests get 503, while
the listener stays open so that clients get that answer rather than a refused connection;
every queued and running request is answered; then the listener closes, aiohttp waits for
the responses still being written, and `serve` returns 0. All of it within
`drainGracePeriodSeconds`; a request that was accepted is never dropped before that.
Mirroring to a shadow candidate stops first, its work in flight cancelled: it is
best-effort and must not hold up the drain.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

from aiohttp import web
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.http.app import DATAPLANE, RUNNER_OPTIONS

log = logging.getLogger(__name__)


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
    runner = web.AppRunner(app, **RUNNER_OPTIONS, handle_signals=False, shutdown_timeout=grace)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.http_port, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else config.http_port
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
        dataplane = app[DATAPLANE]
        if dataplane.shadow is not None:
            await dataplane.shadow.stop()
        queued = dataplane.batcher.queued
        log.info("Started draining queued=%d grace_period_seconds=%s", queued, grace)
        drained = await dataplane.batcher.drain(grace)
        if not drained:
            log.warning("Drain grace period ran out queued=%d", dataplane.batcher.queued)
        # What is left of the grace period bounds aiohttp's wait for responses being
        # written (aiohttp has no public setter for it after construction).
        if hasattr(runner, "_shutdown_timeout"):
            runner._shutdown_timeout = max(0.1, grace - (time.monotonic() - started))
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
    log.info("Stopped serving model=%s", config.model_name)
    return 0
