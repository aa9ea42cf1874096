"""`processes.start_ticks`, the kernel's start time of a pid that tells a process from a
later one reusing its number (a zombie or a missing pid has none; a name holding spaces
and parentheses does not confuse the parse): what `cluster down` relies on to stop only
the processes `up` started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kubeinfer.cluster.processes import Started, is_running, start_ticks
from waiting import wait_for


def test_start_ticks_of_a_running_process_is_stable_and_after_boot() -> None:
    mine = start_ticks(os.getpid())
    assert isinstance(mine, int) and mine > 0
    assert start_ticks(os.getpid()) == mine
    fields = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    assert mine == int(fields[19])  # field 22 of proc(5), counted from after the name


def test_start_ticks_of_no_such_process_is_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid names nothing now
    assert start_ticks(child.pid) is None


def state_of(pid: int) -> str:
    """The process's state letter (field 3 of proc(5)'s stat)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_zombie_has_no_start_ticks() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_for(lambda: state_of(child.pid) == "Z", what="the child to exit (a zombie)")
        assert start_ticks(child.pid) is None
        assert not is_running(Started("child", child.pid, 1, "/dev/null"))
    finally:
        child.wait()


def test_a_name_with_spaces_and_parentheses_is_parsed_past() -> None:
    # The process renames itself (prctl PR_SET_NAME) to a name that would split a
    # naive parse of /proc/PID/stat in the wrong place.
    script = (
        "import ctypes, sys, time\n"
        "ctypes.CDLL(None).prctl(15, b'a) (b) Z c', 0, 0, 0)\n"
        "print('renamed', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "renamed\n"
        assert Path(f"/proc/{child.pid}/comm").read_text().strip() == "a) (b) Z c"
        ticks = start_ticks(child.pid)
        mine = start_ticks(os.getpid())
        assert ticks is not None and mine is not None and ticks >= mine
        assert is_running(Started("child", child.pid, ticks, "/dev/null"))
        # The same pid with another start time is another process.
        assert not is_running(Started("child", child.pid, ticks - 1, "/dev/null"))
    finally:
        child.kill()
        child.wait()
