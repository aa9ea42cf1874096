"""The host's way into a cluster's network namespace: 127.0.0.1 ports that forward into it.

`python -m kubeinfer.cluster.gateway --namespace /proc/PID/ns/net --forward PORT=HOST:PORT`
listens on 127.0.0.1:PORT in the namespace it was started in (the host's) and relays each
connection to HOST:PORT inside the cluster's namespace, a byte stream end to end (TLS to
the API server stays the client's). Nothing is added to the host's namespace but these
listening sockets, and nothing leaves the cluster's namespace but what a client asked for.
`kubeinfer cluster up` runs one for the API server; `kubeinfer up` forwards its endpoints
in-process with the same `relay`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Awaitable, Callable

from kubeinfer.cluster.netns import socket_inside

CHUNK_BYTES = 256 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def open_inside(namespace: int, host: str, port: int) -> socket.socket:
    """A TCP connection to host:port made from inside the namespace `namespace`."""
    sock = socket_inside(namespace, socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    upstream: socket.socket,
) -> None:
    """Copies both ways between a client and an upstream socket until both sides end."""
    reader, writer = await asyncio.open_connection(sock=upstream)
    try:
        await asyncio.gather(_pipe(client_reader, writer), _pipe(reader, client_writer))
    finally:
        for w in (writer, client_writer):
            with contextlib.suppress(Exception):
                w.close()


def forward_handler(
    namespace: int, host: str, port: int
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await open_inside(namespace, host, port)
        except OSError:
            writer.close()
            return
        await relay(reader, writer, upstream)

    return handle


def parse_forward(text: str) -> tuple[int, str, int]:
    """`PORT=HOST:PORT` -> (listen port, target host, target port)."""
    listen, _, target = text.partition("=")
    host, _, port = target.rpartition(":")
    if not listen.isdigit() or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"expected PORT=HOST:PORT, got {text!r}")
    return int(listen), host.strip("[]"), int(port)


async def serve(namespace_path: str, forwards: list[tuple[int, str, int]]) -> None:
    namespace = os.open(namespace_path, os.O_RDONLY | os.O_CLOEXEC)
    servers = [
        await asyncio.start_server(
            forward_handler(namespace, host, port), "127.0.0.1", listen, reuse_address=True
        )
        for listen, host, port in forwards
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kubeinfer.cluster.gateway", description=__doc__)
    parser.add_argument("--namespace", required=True, help="/proc/PID/ns/net of the cluster")
    parser.add_argument("--forward", type=parse_forward, action="append", default=[])
    args = parser.parse_args(argv)
    asyncio.run(serve(args.namespace, args.forward))


if __name__ == "__main__":
    main()
