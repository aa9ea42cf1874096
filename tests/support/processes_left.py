"""Which processes are still running for a directory: the check that `kubeinfer down`,
Ctrl-C, the demo and every test (`tests/conftest.py`, at the end of the session, failed
tests included) leave nothing behind."""

from __future__ import annotations

import os
import re
from pathlib import Path


def pids_left(directory: Path) -> dict[int, str]:
    """Live processes (zombies run nothing) whose command line names `directory`, or whose
    working directory is inside it: their ids and command lines."""
    named = re.compile(re.escape(str(directory)) + r"(?=/|\s|$)")  # not /tmp/a1 for /tmp/a
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        inside = cwd == str(directory) or cwd.startswith(f"{directory}/")
        if (named.search(command) or inside) and state != "Z":
            found[int(entry.name)] = command
    return found


def processes_mentioning(directory: Path) -> list[str]:
    """`pids_left`, as lines `pid: command`."""
    return [f"{pid}: {command[:120]}" for pid, command in pids_left(directory).items()]
