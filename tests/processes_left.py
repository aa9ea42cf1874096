"""Which processes are still running for a directory: the check that `kubeinfer down`,
Ctrl-C and the demo leave nothing behind."""

from __future__ import annotations

import os
from pathlib import Path


def processes_mentioning(directory: Path) -> list[str]:
    """Live processes whose command line names `directory` (zombies run nothing)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(directory) in command and state != "Z" and int(entry.name) != os.getpid():
            found.append(f"{entry.name}: {command[:120]}")
    return found
