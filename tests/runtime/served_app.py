"""The HTTP app over a data plane assembled as `kubeinfer serve` assembles it
(`serving.assemble`), for tests that run the app under aiohttp's test server or runner
rather than `serving.serve_transports`: the data plane is started and closed with the app,
where `serve_transports` would start and close it."""

from __future__ import annotations

from aiohttp import web
from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.runtime.engines.base import Engine
from kubeinfer.runtime.http.app import create_app
from kubeinfer.runtime.serving import assemble


def app_of(config: RuntimeConfig, engine: Engine) -> web.Application:
    """`create_app` over `assemble(config, engine)`, its data plane started on the app's
    startup and closed on its cleanup (the engine stays the caller's)."""
    dataplane = assemble(config, engine)
    app = create_app(dataplane)

    async def start(_: web.Application) -> None:
        await dataplane.start()

    async def close(_: web.Application) -> None:
        await dataplane.close()

    app.on_startup.append(start)
    app.on_cleanup.append(close)
    return app
