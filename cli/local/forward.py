"""A local port per InferenceDeployment that forwards to its Service's ready pods, as a
Service's cluster IP would: each connection goes to the next ready endpoint, read from
the Service's EndpointSlices (kept by the real endpointslice controller), or from the
pods the Service selects where the pods have loopback addresses that EndpointSlices
cannot list. A connection with no ready pod behind it is closed at once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable

Endpoints = Callable[[], Awaitable[list[str]]]
"""The ready `host:port` endpoints right now."""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class Forwarder:
    """Listens on 127.0.0.1:`port` (0: any free port) and forwards each connection."""

    def __init__(self, endpoints: Endpoints, port: int = 0) -> None:
        self.endpoints = endpoints
        self.requested_port = port
        self._turn = itertools.count()
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.requested_port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ready = await self.endpoints()
        if not ready:
            writer.close()
            return
        host, _, port = ready[next(self._turn) % len(ready)].rpartition(":")
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
