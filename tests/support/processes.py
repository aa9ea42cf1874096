"""Processes a test starts: waited on until they serve, and stopped whatever happens."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

from waiting import wait_for


def stop(process: subprocess.Popen, timeout: float = 30) -> int:
    """SIGTERM, then its exit code; killed if it has not exited within `timeout` seconds
    (the wait's TimeoutExpired then goes on to the caller)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_ready(
    ready: Callable[[], bool],
    process: subprocess.Popen,
    what: str,
    within: float = 60,
    output: Callable[[], str] = lambda: "",
) -> None:
    """Polls `ready` (an OSError counts as not yet: nothing listens) while `process` runs.
    A process that exits fails the wait with the end of its `output`; one not ready within
    `within` seconds is stopped, and the wait fails."""

    def check() -> bool:
        if process.poll() is not None:
            said = output()[-2000:]
            raise AssertionError(f"{what} exited with {process.returncode}: {said}")
        return ready()

    try:
        wait_for(check, within, what=f"{what} to be ready", ignoring=(OSError,))
    except AssertionError:
        stop(process)
        raise
