"""The cluster's own cgroup: made before the kubelet starts, removed after its last pod.

The kubelet (cgroupfs driver) puts every pod under its `cgroupRoot` and insists that
the root exists in every hierarchy; on cgroup v1 a new cpuset cgroup also needs the CPUs
and memory nodes it may use, which it does not inherit. One root per cluster, named after
its directory, keeps two clusters on one machine apart and lets `down` find every
process of the cluster's pods, even after a crash.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def hierarchies() -> list[Path]:
    """The mounted hierarchies: the unified one (v2), or one per controller (v1)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    return [p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink()]


def make_cgroup(name: str) -> None:
    """Makes cgroup `name` in every hierarchy (on v1's cpuset, with its parent's CPUs and
    memory nodes)."""
    relative = name.strip("/")
    for hierarchy in hierarchies():
        directory = hierarchy / relative
        directory.mkdir(exist_ok=True)
        for setting in ("cpuset.cpus", "cpuset.mems"):
            own, parent = directory / setting, hierarchy / setting
            if own.exists() and parent.exists() and not own.read_text().strip():
                own.write_text(parent.read_text())


def cgroup_directories(name: str) -> list[Path]:
    """The directory of cgroup `name` (like `/kubeinfer-abc`) in each hierarchy mounted
    (v1: one per controller; v2: the unified one)."""
    found = []
    relative = name.strip("/")
    for hierarchy in hierarchies() if CGROUP_ROOT.is_dir() else []:
        candidate = hierarchy / relative
        if candidate.is_dir():
            found.append(candidate)
    return found


def cgroup_processes(name: str) -> set[int]:
    pids: set[int] = set()
    for directory in cgroup_directories(name):
        for procs in directory.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def remove_cgroups(name: str) -> list[Path]:
    """Removes cgroup `name` and its children in every hierarchy; returns what remains."""
    remaining = []
    for directory in cgroup_directories(name):
        for child in sorted(_directories(directory), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                child.rmdir()
        if directory.exists():
            remaining.append(directory)
    return remaining


def _directories(root: Path) -> Iterator[Path]:
    """`root` and every directory under it; one removed meanwhile (by runc or the kubelet
    tearing down their own) is left out, not an error that stops the teardown."""
    yield root
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.is_dir():
            yield from _directories(entry)
