"""The pods' network on one machine, until the node moves into a network namespace of its
own: addresses in 127.0.0.0/8.

The machines the project runs on allow traffic only to 127.0.0.0/8 and to addresses inside
network namespaces the project itself creates, and nothing may add a route, an address or a
firewall rule to the host's network namespace. So pods get loopback addresses; since
EndpointSlices cannot list those, the cluster runs without the endpointslice controller and
the node resolves Services from the pods they select.

Several clusters may run on one machine at once (a test session beside `kubeinfer up`):
each node agent claims a /24 of the network of its own, held by an exclusive lock on a
file per subnet for as long as the agent lives (the kernel drops the lock with the
process), so no two clusters hand out the same pod address.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

LOOPBACK_CIDR = "127.0.0.0/8"


@dataclass(frozen=True)
class PodNetwork:
    cidr: str
    loopback: bool
    note: str = ""


def ensure_pod_network() -> PodNetwork:
    """The pods' addresses: loopback ones, which need nothing added to the host."""
    return PodNetwork(LOOPBACK_CIDR, loopback=True)


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
