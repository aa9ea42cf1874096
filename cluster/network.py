"""The pods' network on one machine: a pod CIDR whose every address is local.

Pods need addresses of their own (two pods listen on the same container port) that the
API server accepts in EndpointSlices, which refuse loopback addresses. Linux routes a
whole prefix to the loopback device with one local route ("AnyIP": `ip route add local
10.244.0.0/16 dev lo`), after which a process can listen on any address in it and every
process on the machine can reach it, as a node reaches its pods. Adding the route needs
CAP_NET_ADMIN; where it cannot be added, pods fall back to addresses in 127.0.0.0/8, and
since EndpointSlices cannot list those, the cluster runs without the endpointslice
controller and the node resolves Services from the pods they select.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
from dataclasses import dataclass

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
            capture_output=True, text=True, check=False, timeout=10,
        )  # fmt: skip
        why = result.stderr.strip() or f"exit {result.returncode}"
    except (OSError, subprocess.TimeoutExpired) as error:
        why = str(error)
    if _can_listen_on(probe):
        return PodNetwork(cidr, loopback=False, note=f"added a local route for {cidr} on lo")
    return PodNetwork(
        LOOPBACK_CIDR, loopback=True,
        note=f"could not route {cidr} to lo ({why}); pods use 127.x addresses, which "
        "EndpointSlices cannot list, so Services are resolved from the pods they select",
    )  # fmt: skip
