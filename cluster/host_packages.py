"""The node's userland from Debian: runc (the OCI runtime containerd's shim calls),
iptables (kube-proxy's rules, the portmap plugin), conntrack (kube-proxy flushes stale UDP
entries, as for DNS) and iproute2 (`ip`, to make the node's network namespace). Debian's
runc is recent enough for containerd 2; its containerd is not, so that one is built (see
`node_builds`). Installed with apt-get when missing and we are root; otherwise a BuildError
says which packages to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kubeinfer.cluster.gobuild import BuildError, say

NODE_PACKAGES = {"runc": "runc", "iptables": "iptables", "conntrack": "conntrack", "ip": "iproute2"}
"""Each program the node runs from Debian, and the package that ships it."""

SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
"""Where the programs are looked for: the PATH and the sbin folders a non-login root
shell may leave out of it."""


def find_programs(programs: list[str]) -> dict[str, Path]:
    """Those of `programs` found on `SEARCH_PATH`, by name."""
    found = {name: shutil.which(name, path=SEARCH_PATH) for name in programs}
    return {name: Path(path) for name, path in found.items() if path}


def ensure_node_packages() -> dict[str, Path]:
    """The path of each of `NODE_PACKAGES`' programs, installing the missing packages with
    apt-get (as root); BuildError naming them where that cannot be done."""
    found = find_programs(list(NODE_PACKAGES))
    missing = sorted({NODE_PACKAGES[name] for name in NODE_PACKAGES if name not in found})
    if not missing:
        return found
    install(missing)
    found = find_programs(list(NODE_PACKAGES))
    absent = [name for name in NODE_PACKAGES if name not in found]
    if absent:
        raise BuildError(f"installing {', '.join(missing)} left {', '.join(absent)} missing")
    return found


def install(packages: list[str]) -> None:
    """`apt-get install` of `packages`, updating the package lists once if that fails (a
    fresh machine may have none); BuildError with apt-get's message, or saying what to run
    where we are not root."""
    command = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BuildError(f"the node needs Debian's {', '.join(packages)}: "
                         f"run `{' '.join(command)}` as root")  # fmt: skip
    say(f"installing {', '.join(packages)} from Debian for the node")
    waiting = ["-o", "DPkg::Lock::Timeout=300"]  # another apt-get may hold the lock
    result = subprocess.run([*command, *waiting], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update", *waiting], capture_output=True, check=False)
        result = subprocess.run([*command, *waiting], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(
            f"`{' '.join(command)}` failed:\n{(result.stderr or result.stdout)[-2000:]}"
        )
