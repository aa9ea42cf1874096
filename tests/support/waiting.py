"""Waiting on a condition instead of sleeping: a test that waits for what it needs holds
on a busy machine, where a sleep that was long enough on an idle one is not.

`wait_for` polls in the calling thread; `eventually` is its asyncio twin, for tests whose
event loop must keep running (an in-process operator or server) while they wait. Both
return what the check returned, so a test can wait for an object and use it; both fail
naming what never came. The bounds are generous on purpose: they only decide how long a
broken test takes to fail, never whether a working one passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T],
    within: float = 30.0,
    what: str = "",
    every: float = 0.05,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Calls `check` until it returns something truthy, and returns that. An exception in
    `ignoring` counts as not yet (a server that does not listen yet: OSError). Fails after
    `within` seconds, saying `what` was awaited."""
    deadline = time.monotonic() + within
    while True:
        try:
            result = check()
        except ignoring:
            result = None  # type: ignore[assignment]
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what or check}")
        time.sleep(every)


async def eventually(
    check: Callable[[], T],
    within: float = 30.0,
    what: str = "",
    every: float = 0.05,
    in_thread: bool = True,
) -> T:
    """`wait_for` without blocking the event loop. `check` runs in a worker thread (it may
    block: a call to the API server), or with `in_thread=False` on the loop itself, for a
    check of the loop's own state that must still hold when the test goes on."""
    deadline = time.monotonic() + within
    while True:
        result = await asyncio.to_thread(check) if in_thread else check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what or check}")
        await asyncio.sleep(every)
