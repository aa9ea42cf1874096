"""Whether an engine's slot buffers fit in the memory this process may use, asked before
the runtime allocates them, so a model too large for its pod says so at start rather than
being killed for memory while it touches its buffers (or under its first long batch).

`available_bytes` reads what is left: the cgroup's limit less its usage (a container's
`resources.limits.memory`), and the host's `MemAvailable`, whichever is smaller. Nodes
still on cgroup v1 (the project's own real node among them) show a container its memory
controller's files under `memory/`, not v2's `memory.max`: both are read, or the limit
would go unseen and the buffers be judged against the whole host. `buffers_problem` is
the decision, pure.
"""

from __future__ import annotations

from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")
LIMIT_AND_USAGE = (
    ("memory.max", "memory.current"),  # cgroup v2
    ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),  # cgroup v1
)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def available_bytes(cgroup: Path = CGROUP, meminfo: Path = MEMINFO) -> int | None:
    """Bytes this process may still allocate, or None when nothing tells."""
    found = []
    for limit_file, usage_file in LIMIT_AND_USAGE:
        limit, usage = _read_int(cgroup / limit_file), _read_int(cgroup / usage_file)
        if limit is not None and usage is not None:
            found.append(max(0, limit - usage))
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return min(found) if found else None


def buffers_problem(
    slot_bytes: int, slots: int, max_batch_size: int, available: int | None
) -> str | None:
    """Why `slots` slots of `slot_bytes` each cannot be allocated in `available` bytes,
    naming what to lower; None when they fit (or nothing tells what is available)."""
    needed = slot_bytes * slots
    if available is None or needed <= available:
        return None
    return (
        f"the engine's buffers need {needed / 2**20:.0f} MiB ({slots} execution slot(s) of "
        f"{slot_bytes / 2**20:.0f} MiB: a batch of {max_batch_size} rows of every input and "
        f"output at its largest shape), but only {available / 2**20:.0f} MiB of memory is "
        "available; lower maxBatchSize, executionSlots or the inputs' maxShape, or give "
        "the runtime more memory"
    )
