"""The pods' network on one machine: a pod CIDR whose every address is local.

Pods need addresses of their own (two pods listen on the same container port) that the
API server accepts in EndpointSlices, which refuse loopback addresses. Linux routes a
whole prefix to the loopback device with one local route ("AnyIP": `ip route add local
10.244.0.0/16 dev lo`), after which a process can listen on any address in it and every
process on the machine can reach it, as a node reaches its pods. Adding the route needs
CAP_NET_ADMIN; where it cannot be added, pods fall back to addresses in 127.0.0.0/8, and
since EndpointSlices cannot list those, the cluster runs without the endpointslice
controller and the node resolves Services from the pods they select.

Several clusters may run on one machine at once (a test session beside `kubeinfer up`):
each node agent claims a /24 of the network of its own, held by an exclusive lock on a
file per subnet for as long as the agent lives (the kernel drops the lock with the
process), so no two clusters hand out the same pod address.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

POD_CIDR = "10.244.0.0/16"
LOOPBACK_CIDR = "127.0.0.0/8"


@dataclass(frozen=True)
class PodNetwork:
    cidr: str
    loopback: bool
    note: str = ""


def _can_listen_on(address: str) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, 0))
            return True
        except OSError:
            return False


def ensure_pod_network(cidr: str = POD_CIDR) -> PodNetwork:
    """The pod CIDR with its local route (added when missing and allowed), else loopback."""
    probe = str(ipaddress.ip_network(cidr)[1])
    if _can_listen_on(probe):
        return PodNetwork(cidr, loopback=False)
    ip = shutil.which("ip") or "/usr/sbin/ip"
    try:
        result = subprocess.run(
            [ip, "route", "add", "local", cidr, "dev", "lo"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        why = result.stderr.strip() or f"exit {result.returncode}"
    except (OSError, subprocess.TimeoutExpired) as error:
        why = str(error)
    if _can_listen_on(probe):
        return PodNetwork(cidr, loopback=False, note=f"added a local route for {cidr} on lo")
    return PodNetwork(
        LOOPBACK_CIDR,
        loopback=True,
        note=f"could not route {cidr} to lo ({why}); pods use 127.x addresses, which "
        "EndpointSlices cannot list, so Services are resolved from the pods they select",
    )


SUBNET_PREFIX = 24
LOCK_DIRECTORY = Path(tempfile.gettempdir()) / "kubeinfer-pod-subnets"


@dataclass
class SubnetClaim:
    """A /24 of the pod network this process holds; `release` (or exit) frees it."""

    cidr: str
    descriptor: int

    def release(self) -> None:
        os.close(self.descriptor)


def claim_subnet(network: str, lock_directory: Path = LOCK_DIRECTORY) -> SubnetClaim:
    """The first /24 of `network` no other live process holds (127.0.0.0/24, the node's
    own loopback, is never handed out)."""
    lock_directory.mkdir(parents=True, exist_ok=True)
    for subnet in ipaddress.ip_network(network).subnets(new_prefix=SUBNET_PREFIX):
        if subnet == ipaddress.ip_network("127.0.0.0/24"):
            continue
        path = lock_directory / f"{subnet.network_address}.lock"
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            continue
        return SubnetClaim(str(subnet), descriptor)
    raise RuntimeError(f"every /{SUBNET_PREFIX} of {network} is held by another node agent")
