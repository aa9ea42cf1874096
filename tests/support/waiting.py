"""Waiting on a condition instead of sleeping: a test that waits for what it needs holds
on a busy machine, where a sleep that was long enough on an idle one is not.

`wait_for` polls in the calling thread; `eventually` is its asyncio twin, for tests whose
event loop must keep running (an in-process operator or server) while they wait, and for
checks that are coroutines. Both
return what the check returned, so a test can wait for an object and use it; both fail
naming what never came (`what`: a text, or a function giving one when the wait fails, to
say the last state seen). The bounds are generous on purpose: they only decide how long a
broken test takes to fail, never whether a working one passes.

They are the tests' only polling helpers: a sleep elsewhere in the tests is the thing
under test and says `# not a wait: why` (`tests/test_architecture.py` checks both).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
What = str | Callable[[], str]
"""What is awaited, said when the wait fails: a text, or a function that gives one then."""


def wait_for(
    check: Callable[[], T],
    within: float = 30.0,
    what: What = "",
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
            raise AssertionError(_timed_out(within, what, check))
        time.sleep(every)


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    within: float = 30.0,
    what: What = "",
    every: float = 0.05,
    in_thread: bool = True,
) -> T:
    """`wait_for` without blocking the event loop. `check` runs in a worker thread (it may
    block: a call to the API server), or with `in_thread=False` on the loop itself, for a
    check of the loop's own state that must still hold when the test goes on. A `check`
    that is a coroutine function is awaited on the loop (it reads through async clients)."""
    deadline = time.monotonic() + within
    while True:
        if inspect.iscoroutinefunction(check) or not in_thread:
            result = check()
        else:
            result = await asyncio.to_thread(check)
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(_timed_out(within, what, check))
        await asyncio.sleep(every)


def _timed_out(within: float, what: What, check: Callable[[], object]) -> str:
    said = what() if callable(what) else what
    return f"timed out after {within:g} s waiting for {said or check}"
