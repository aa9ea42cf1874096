"""A loopback port for a server a test starts."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now: the kernel's pick for a socket bound to port 0 and
    closed again. Another process could take it before the test's server binds it; the
    kernel hands out ports in turn, so that is rare, and the server then fails to start
    saying so."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
