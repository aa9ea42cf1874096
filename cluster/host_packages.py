"""The node's userland from Debian: runc (the OCI runtime containerd's shim calls),
iptables (kube-proxy's rules, the portmap plugin), conntrack (kube-proxy flushes stale UDP
entries, as for DNS) and iproute2 (`ip`, to make the node's network namespace). Debian's
runc is recent enough for containerd 2; its containerd is not, so that one is built (see
`node_builds`). Installed as `debian_packages` installs them.
"""

from __future__ import annotations

from pathlib import Path

from kubeinfer.cluster import debian_packages
from kubeinfer.cluster.gobuild import say

NODE_PACKAGES = {"runc": "runc", "iptables": "iptables", "conntrack": "conntrack", "ip": "iproute2"}
"""Each program the node runs from Debian, and the package that ships it."""


def ensure_node_packages() -> dict[str, Path]:
    """The path of each of `NODE_PACKAGES`' programs, installing the missing packages with
    apt-get (as root); BuildError naming them where that cannot be done."""
    return debian_packages.ensure_programs(NODE_PACKAGES, "the node", say)
