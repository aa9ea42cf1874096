"""The cluster's own network namespace: where the node, its pods and its rules live.

The machines the project runs on allow traffic only to 127.0.0.0/8 and to addresses inside
network namespaces the project itself creates, and nothing may add a route, an address or a
firewall rule to the host's namespace. So a cluster lives in a namespace of its own, as a
node would on a machine of its own: the node's bridge and address, the pods' veths, the
Service and pod ranges, kube-proxy's rules and CoreDNS are all in it, and the same ranges
and ports serve every cluster on the machine without clashing.

A namespace here is anonymous: it exists while a process is in it, so when the cluster's
last process stops it is gone with its bridge, veths, routes and rules, and a crash
leaves no named namespace behind. Two ways in:

- `enter_new_namespace()` moves the calling thread (and whatever it starts later) into a
  fresh namespace: the test workers do this before anything else, so they reach pods,
  Services and the API server as a process on the node does;
- `NamespaceHolder`: a process that does nothing but keep a namespace alive (the node's
  `pause` image does the same for a pod), for `kubeinfer cluster up`, whose cluster outlives
  the command; other processes join it with `nsenter --net=/proc/PID/ns/net`.

From outside, `connect_inside` opens a TCP connection from within a namespace: a socket
belongs to the namespace its creating thread was in when it was made, so the thread
switches in, makes the socket, and switches back (`setns` is per thread for networks).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
NODE_BRIDGE = "cni0"
NODE_ADDRESS = "10.244.0.1"
"""The node's address: its bridge's, the pods' gateway, the API server's advertised one."""
POD_SUBNET = "10.244.0.0/24"
SERVICE_SUBNET = "10.96.0.0/16"
KUBERNETES_SERVICE_ADDRESS = "10.96.0.1"
DNS_SERVICE_ADDRESS = "10.96.0.10"


class NamespaceError(RuntimeError):
    """A namespace could not be made, entered or set up; the message says which step."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise NamespaceError(f"{what}: {os.strerror(error)} (errno {error})")


def current_namespace_inode() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def setns(descriptor: int) -> None:
    """Moves the calling thread into the network namespace `descriptor` refers to."""
    _check(_libc().setns(descriptor, CLONE_NEWNET), "setns")


_made_here: set[int] = set()
"""Inodes of the namespaces this process made (`enter_new_namespace`)."""
_left: list[int] = []
"""Descriptors of the namespaces this process left, first the host's."""


def enter_new_namespace() -> int:
    """Moves the calling thread into a fresh network namespace with its loopback up, and
    returns a descriptor of the namespace it left (to reach the host again, or read it).
    Call it before any other thread starts: threads started earlier stay where they were."""
    left = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    _check(_libc().unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    subprocess.run([ip_command(), "link", "set", "lo", "up"], check=True, timeout=10)
    _made_here.add(current_namespace_inode())
    _left.append(left)
    return left


def host_namespace() -> int | None:
    """A descriptor of the namespace this process started in, once it has left it."""
    return _left[0] if _left else None


def in_host_namespace(argv: Sequence[str]) -> tuple[list[str], tuple[int, ...]]:
    """`argv` made to run in the namespace this process started in (where the package
    registries are: a namespace of the project's has no way out), and the descriptors the
    subprocess must inherit for it (`pass_fds`)."""
    host = host_namespace()
    if host is None:
        return list(argv), ()
    return [*nsenter_prefix(f"/proc/{os.getpid()}/fd/{host}"), *argv], (host,)


def check_made_here() -> None:
    """NamespaceError unless this thread is in a namespace this process made: a cluster
    never sets up its node in the host's namespace."""
    if current_namespace_inode() not in _made_here:
        raise NamespaceError(
            "this process is not in a network namespace of its own making: call "
            "netns.enter_new_namespace() first, or let the cluster make one"
        )


@contextlib.contextmanager
def entered(descriptor: int) -> Iterator[None]:
    """This thread inside the namespace `descriptor` for the block, then back."""
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(descriptor)
        try:
            yield
        finally:
            setns(back)
    finally:
        os.close(back)


def socket_inside(descriptor: int, family: int = socket.AF_INET) -> socket.socket:
    """A non-blocking TCP socket that belongs to the namespace `descriptor`."""
    with entered(descriptor):
        sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def ip_command() -> str:
    return shutil.which("ip") or "/usr/sbin/ip"


def nsenter_prefix(namespace_path: str | None) -> list[str]:
    """The argv prefix that starts a program in the namespace at `namespace_path` (a
    /proc/PID/ns/net path), or nothing when it should run in the caller's own."""
    if namespace_path is None:
        return []
    nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
    return [nsenter, f"--net={namespace_path}", "--"]


@dataclass(frozen=True)
class NodeNetwork:
    """The node's side of a namespace, set up by `set_up_node_network`."""

    namespace_path: str | None
    """/proc/PID/ns/net of the namespace's holder, or None for the caller's own."""

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*nsenter_prefix(self.namespace_path), *argv]


def set_up_node_network(network: NodeNetwork) -> None:
    """Inside the namespace: loopback up, the node's bridge with its address (the kubelet
    checks its node IP is an interface's before the bridge plugin would make it), a route
    for the Service range, forwarding, and bridged traffic through iptables, so a pod
    reaching a Service that answers from the same bridge gets its reply through the NAT."""
    steps = [
        [ip_command(), "link", "set", "lo", "up"],
        [ip_command(), "link", "add", NODE_BRIDGE, "type", "bridge"],
        [ip_command(), "addr", "add", f"{NODE_ADDRESS}/24", "dev", NODE_BRIDGE],
        [ip_command(), "link", "set", NODE_BRIDGE, "up"],
        # Services have no interface: a route lets the node's own connections to a
        # ClusterIP pass the routing lookup, before kube-proxy's rules rewrite them.
        [ip_command(), "route", "add", SERVICE_SUBNET, "dev", NODE_BRIDGE, "src", NODE_ADDRESS],
    ]
    for argv in steps:
        result = subprocess.run(
            network.command(argv), capture_output=True, text=True, timeout=10, check=False
        )
        if result.returncode != 0 and "File exists" not in result.stderr:
            raise NamespaceError(f"{' '.join(argv)}: {result.stderr.strip()}")
    # /proc/sys/net is the namespace's own: written from inside it.
    for key, value in (("net.ipv4.ip_forward", "1"), ("net.bridge.bridge-nf-call-iptables", "1")):
        path = "/proc/sys/" + key.replace(".", "/")
        argv = ["sh", "-c", 'echo "$1" > "$2"', "sysctl", value, path]
        result = subprocess.run(
            network.command(argv), capture_output=True, text=True, timeout=10, check=False
        )
        if result.returncode != 0:
            raise NamespaceError(f"setting {key} in the node's namespace: {result.stderr}")


def holder_argv(pause: Path) -> list[str]:
    """A process whose only work is to keep a fresh network namespace alive."""
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    return [unshare, "--net", "--", str(pause)]


def namespace_of(pid: int) -> str:
    return f"/proc/{pid}/ns/net"


def wait_for_own_namespace(pid: int, timeout_seconds: float = 10.0) -> str:
    """The namespace path of the holder `pid` once it has left the caller's namespace:
    until `unshare` has run in it, /proc/PID/ns/net is still the caller's, and joining it
    would set the node up in the host's namespace. NamespaceError if it never leaves."""
    path = namespace_of(pid)
    ours = current_namespace_inode()
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            if os.stat(path).st_ino != ours:
                return path
        except OSError as error:
            raise NamespaceError(f"the namespace holder {pid} exited: {error}") from None
        if time.monotonic() > deadline:
            raise NamespaceError(f"the namespace holder {pid} never left this namespace")
        time.sleep(0.01)
