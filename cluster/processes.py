"""Processes that outlive the command that started them, and their reliable end.

`cluster up` returns while etcd, the API server, the controllers and the node's processes
keep running; `cluster down` (maybe from another shell) must stop exactly those. Each is
started in a session of its own, and the state file records its pid with the kernel's
start time of that pid, so `down` never signals a process that merely reuses the number.
Stopping is SIGTERM to the process group, then SIGKILL after the grace period, and a wait
until the kernel has no such process left (a zombie counts as gone: it runs nothing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Started:
    """A process this package started: enough to find it again and to stop only it."""

    name: str
    pid: int
    start_ticks: int
    log: str


def start_ticks(pid: int) -> int | None:
    """The process' start time in clock ticks since boot (/proc/PID/stat field 22), or None
    when no such process runs (a zombie runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_running(process: Started) -> bool:
    return start_ticks(process.pid) == process.start_ticks


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[Started, subprocess.Popen[bytes]]:
    """Starts `argv` in a new session, its output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    ticks = start_ticks(popen.pid)
    return Started(name, popen.pid, ticks if ticks is not None else -1, str(log)), popen


def stop(processes: Sequence[Started], grace_seconds: float = 10.0) -> list[str]:
    """Stops each running process (and its process group), in reverse order of start;
    returns the names of those that needed SIGKILL."""
    killed: list[str] = []
    for process in reversed(processes):
        if not is_running(process):
            continue
        _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while is_running(process) and time.monotonic() < deadline:
            _reap(process.pid)
            time.sleep(0.05)
        if is_running(process):
            killed.append(process.name)
            _signal(process, signal.SIGKILL)
            while is_running(process):
                _reap(process.pid)
                time.sleep(0.02)
        _reap(process.pid)
    return killed


def _signal(process: Started, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)  # its session's group: whatever it started too
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(process.pid, signum)
        except ProcessLookupError:
            pass


def _reap(pid: int) -> None:
    """Collects the exit status when the process is our child (no-op otherwise)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def write_state(path: Path, processes: Sequence[Started], **extra: object) -> None:
    path.write_text(
        json.dumps({"processes": [asdict(p) for p in processes], **extra}, indent=2) + "\n"
    )


def read_state(path: Path) -> tuple[list[Started], dict[str, object]]:
    document = json.loads(path.read_text())
    processes = [Started(**item) for item in document.pop("processes")]
    return processes, document
