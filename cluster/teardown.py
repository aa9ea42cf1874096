"""What stopping a node must undo beyond its own processes: containers, mounts, cgroups.

A kubelet or containerd that stops leaves its pods running: each container is a child of
its runc shim, which is nobody's child. So `cluster down` ends them where they live: every
process in the cluster's cgroup root (the kubelet puts each pod there) gets SIGTERM, then
SIGKILL after the grace period, and the shims serving the cluster's containerd go too.
Then every mount under the cluster's directory (secret and token volumes, container root
filesystems, the pods' network namespaces) is unmounted, deepest first, and the cgroup
root is removed from each hierarchy, leaves first. Each step reads the kernel's own view
(/proc, /sys/fs/cgroup), so it also cleans after a cluster that crashed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path

from kubeinfer.cluster.cgroups import cgroup_processes, remove_cgroups

MNT_DETACH = 2


def processes_naming(text: str) -> set[int]:
    """Processes whose command line holds `text` as one argument (a shim's `-address`)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if text in (entry / "cmdline").read_bytes().decode(errors="replace").split("\0"):
                pids.add(int(entry.name))
    return pids


def is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def end_processes(pids: set[int], grace_seconds: float) -> set[int]:
    """SIGTERM, then SIGKILL after the grace period; returns those that needed SIGKILL."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while any(is_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = {p for p in pids if is_alive(p)}
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(is_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return killed


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or under `directory`, deepest first (from /proc/self/mountinfo,
    whose octal escapes are undone)."""
    prefix = str(directory.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def unmount_all(directory: Path) -> list[str]:
    """Unmounts everything under `directory`; returns what could not be unmounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(3):  # a mount may hide another at the same point
        for point in mounts_under(directory):
            if libc.umount2(point.encode(), 0) != 0:
                libc.umount2(point.encode(), MNT_DETACH)
    return mounts_under(directory)


def tear_down_node(
    directories: list[Path], cgroup_root: str, containerd_socket: Path, grace_seconds: float
) -> list[str]:
    """Ends the cluster's containers and shims, unmounts what is under `directories`,
    removes the cgroup root; returns what was left behind (empty when all is gone)."""
    end_processes(cgroup_processes(cgroup_root), grace_seconds)
    end_processes(processes_naming(str(containerd_socket)), 2.0)
    left = [f"mount {p}" for folder in directories for p in unmount_all(folder)]
    left += [f"cgroup {p}" for p in remove_cgroups(cgroup_root)]
    return left
