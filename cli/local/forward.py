"""127.0.0.1 ports of the host's network namespace that forward into the session's.

`kubeinfer up` runs the cluster in a network namespace of its own, so what it prints for
the user (each InferenceDeployment's endpoint, Prometheus, the API server) must be a port
of the namespace the user's shell is in. A socket belongs to the namespace its creating
thread was in, so the listening socket is made with the thread inside the host's namespace
(`netns.socket_inside`, synchronous: `setns` is per thread) and then served by asyncio
from the session's; each connection is relayed (`gateway.relay`, the bytes as they come)
to a target inside the session's namespace: a Service's ClusterIP, which kube-proxy
balances over the ready pods, or Prometheus, or the API server. A connection with no
target yet (the operator has not made the Service) is closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping

from kubeinfer.cluster import gateway, netns

Target = Callable[[], Awaitable[tuple[str, int] | None]]
"""Where a new connection goes now (host, port), or None when nowhere yet."""


def fixed(host: str, port: int) -> Target:
    async def target() -> tuple[str, int]:
        return host, port

    return target


def listening_socket(namespace: int, port: int = 0) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:`port` (0: any free one) of `namespace`."""
    sock = netns.socket_inside(namespace)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class Forwarder:
    """Listens on a 127.0.0.1 port of `listen_in` and relays each connection to
    `target()` inside `connect_in` (both namespace descriptors)."""

    def __init__(self, listen_in: int, connect_in: int, target: Target) -> None:
        self.listen_in = listen_in
        self.connect_in = connect_in
        self.target = target
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        sock = listening_socket(self.listen_in, port)
        self._server = await asyncio.start_server(self._handle, sock=sock)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = await self.target()
        try:
            upstream = await gateway.open_inside(self.connect_in, *target) if target else None
        except OSError:  # refused: the Service has no ready endpoint yet
            upstream = None
        if upstream is None:
            writer.close()
            return
        await gateway.relay(reader, writer, upstream)


def request_from(
    namespace: int,
    url: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[int, bytes]:
    """An HTTP request (POST with a body, else GET) to `url` from inside `namespace`, as
    a client there would send it: (status, body). Blocking; OSError when nothing answers."""
    parts = urllib.parse.urlsplit(url)
    sock = netns.socket_inside(namespace)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        sock.settimeout(timeout)
        sock.connect((parts.hostname or "", parts.port or 80))
        connection.sock = sock  # connected already: http.client sends on it as it is
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request("POST" if body is not None else "GET", path, body, dict(headers or {}))
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()
        sock.close()
