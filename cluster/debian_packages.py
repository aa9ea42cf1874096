"""Programs the cluster takes from Debian (the node's runc, iptables, conntrack and
iproute2; podman and mmdebstrap for the images): found on the PATH or in the sbin folders,
and their packages installed with apt-get when missing and we are root; otherwise a
BuildError says which packages to install.

Every apt-get call waits for the dpkg lock rather than failing on it: another apt-get
(an engineer's, `make test`'s Prometheus install, unattended upgrades) may hold it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from kubeinfer.cluster.gobuild import BuildError

SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
"""Where the programs are looked for: the PATH and the sbin folders a non-login root
shell may leave out of it."""
LOCK_WAIT_SECONDS = 300
"""How long an apt-get call waits for the dpkg lock another one holds."""


def find_programs(programs: Iterable[str]) -> dict[str, Path]:
    """Those of `programs` found on `SEARCH_PATH`, by name."""
    found = {name: shutil.which(name, path=SEARCH_PATH) for name in programs}
    return {name: Path(path) for name, path in found.items() if path}


def ensure_programs(
    packages: Mapping[str, str], purpose: str, progress: Callable[[str], None]
) -> dict[str, Path]:
    """The path of each program of `packages` (a program -> the Debian package that ships
    it), installing the missing ones' packages with apt-get as root; BuildError naming them
    where that cannot be done, or naming the programs still missing after. `purpose` says
    what they are for ("the node"), in the messages."""
    found = find_programs(packages)
    missing = sorted({packages[name] for name in packages if name not in found})
    if not missing:
        return found
    install(missing, purpose, progress)
    found = find_programs(packages)
    absent = [name for name in packages if name not in found]
    if absent:
        raise BuildError(f"installing {', '.join(missing)} left {', '.join(absent)} missing")
    return found


def install(packages: list[str], purpose: str, progress: Callable[[str], None]) -> None:
    """`apt-get install` of `packages`, updating the package lists once if that fails (a
    fresh machine may have none); BuildError with apt-get's message, or saying what to run
    where we are not root."""
    command = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BuildError(f"Debian's {', '.join(packages)} needed for {purpose}: "
                         f"run `{' '.join(command)}` as root")  # fmt: skip
    progress(f"installing {', '.join(packages)} from Debian for {purpose}")
    result = _apt_get(command)
    if result.returncode != 0:
        _apt_get(["apt-get", "update"])
        result = _apt_get(command)
    if result.returncode != 0:
        raise BuildError(
            f"`{' '.join(command)}` failed:\n{(result.stderr or result.stdout)[-2000:]}"
        )


def _apt_get(argv: list[str]) -> subprocess.CompletedProcess[str]:
    waiting = ["-o", f"DPkg::Lock::Timeout={LOCK_WAIT_SECONDS}"]
    return subprocess.run([*argv, *waiting], capture_output=True, text=True, check=False)
