"""A pod's process, started by the node agent: the program of a known image, in this
Python, with the pod's own network address.

In a pod, a server that listens on 0.0.0.0 listens on the pod's address only; here every
pod shares the node's loopback, so two pods listening on the same container port would
collide. Each pod gets its own loopback address (127.X.Y.Z, all routed to `lo` by Linux),
and this entry point makes a wildcard bind mean that address, as a pod's network
namespace would, before it runs the program. The program is a console script of this
environment (`kubeinfer`), called in-process with the container's argv.

Usage: python -m kubeinfer.cluster.node.pod_entry POD_IP PROGRAM [ARG...]
"""

from __future__ import annotations

import socket
import sys
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import _socket  # socket.socket's base, where typeshed declares bind()

    from _typeshed import ReadableBuffer

WILDCARDS = {"", "0.0.0.0"}
IPV6_WILDCARDS = {"", "::"}


def bind_to_pod_address(pod_ip: str) -> None:
    original = socket.socket.bind

    def bind(self: _socket.socket, address: tuple[Any, ...] | str | ReadableBuffer) -> None:
        if self.family == socket.AF_INET and isinstance(address, tuple):
            host, port = address[0], address[1]
            if host in WILDCARDS:
                address = (pod_ip, port)
        elif (
            self.family == socket.AF_INET6
            and isinstance(address, tuple)
            and address[0] in ("", "::")
        ):
            # The pod has one IPv4 address; an IPv6 wildcard would be the node's.
            raise OSError(99, "Cannot assign requested address (the pod has no IPv6 address)")
        original(self, address)

    socket.socket.bind = bind  # type: ignore[method-assign]  # a deliberate monkeypatch


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: python -m kubeinfer.cluster.node.pod_entry POD_IP PROGRAM [ARG...]")
    pod_ip, program, *args = sys.argv[1:]
    bind_to_pod_address(pod_ip)
    scripts = [e for e in entry_points(group="console_scripts") if e.name == program]
    if not scripts:
        sys.stderr.write(f'exec: "{program}": executable file not found in $PATH\n')
        sys.exit(127)
    (script,) = scripts
    sys.argv = [program, *args]
    sys.exit(script.load()())


if __name__ == "__main__":
    main()
