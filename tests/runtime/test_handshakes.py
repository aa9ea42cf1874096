"""The drain's listener filter (`runtime.http.handshakes`) on real sockets: after it, a
new connection never completes its handshake (it is not in the accept queue, and the
client is still connecting), while a connection completed before it is accepted and
carries data both ways."""

from __future__ import annotations

import select
import socket

from kubeinfer.runtime.http.handshakes import refuse_new_handshakes
from kubeinfer.runtime.http.server import listening_socket


def connecting(port: int) -> socket.socket:
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setblocking(False)
    client.connect_ex(("127.0.0.1", port))
    return client


def test_a_new_handshake_never_completes_and_a_completed_one_is_kept() -> None:
    listener = listening_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    before = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        assert refuse_new_handshakes(listener)
        after = connecting(port)
        try:
            # Loopback completes a handshake within connect itself; a second's wait is
            # the SYN's first retransmission, which the filter drops as well.
            _, writable, _ = select.select([], [after], [], 1.5)
            assert writable == [], "a handshake completed after the filter"
            select.select([listener], [], [], 5)
            accepted, _ = listener.accept()  # the one completed before: queued, kept
            with accepted:
                accepted.settimeout(10)
                before.sendall(b"ping")
                assert accepted.recv(4) == b"ping"
                accepted.sendall(b"pong")
                assert before.recv(4) == b"pong"
            listener.setblocking(False)
            try:
                listener.accept()
                raise AssertionError("a second connection was queued")
            except BlockingIOError:
                pass
        finally:
            after.close()
    finally:
        before.close()
        listener.close()
