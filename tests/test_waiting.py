"""The tests' one waiting helper (`tests/support/waiting.py`): `wait_for` and `eventually`
return what the check returned once it holds, count an ignored exception as not yet, and
fail after their bound naming what was awaited, with the last state a `what` function
gives; `eventually` awaits a coroutine check on the loop, and keeps the loop running
while a thread's check blocks."""

from __future__ import annotations

import asyncio
import threading

import pytest
from waiting import eventually, wait_for


def test_wait_for_returns_what_the_check_gave_once_it_holds() -> None:
    calls = iter([None, 0, "", {"found": 1}])
    assert wait_for(lambda: next(calls), within=5, every=0) == {"found": 1}


def test_an_ignored_exception_is_not_yet_and_any_other_fails_the_wait() -> None:
    attempts: list[int] = []

    def listening() -> bool:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionRefusedError
        return True

    assert wait_for(listening, within=5, every=0, ignoring=(OSError,))
    with pytest.raises(ValueError):
        wait_for(lambda: int("not a number"), within=5, ignoring=(OSError,))


def test_a_wait_that_never_holds_says_what_it_awaited_and_the_last_state_seen() -> None:
    seen: list[int] = []

    def check() -> bool:
        seen.append(len(seen))
        return False

    with pytest.raises(AssertionError, match=r"after 0\.1 s waiting for 3 replicas; saw \d+"):
        wait_for(check, within=0.1, what=lambda: f"3 replicas; saw {seen[-1]}", every=0.01)


async def test_eventually_awaits_a_coroutine_check_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    counted: list[asyncio.AbstractEventLoop] = []

    async def ready() -> int:
        counted.append(asyncio.get_running_loop())
        return len(counted) if len(counted) >= 3 else 0

    assert await eventually(ready, within=5, every=0) == 3
    assert counted == [loop] * 3


async def test_eventually_keeps_the_loop_running_while_the_check_blocks_in_a_thread() -> None:
    set_by_the_loop = threading.Event()
    # The check blocks until a task of the loop has run; on the loop itself it would block
    # the task out for its whole 2 s, and the wait would be over by then.
    task = asyncio.get_running_loop().call_soon(set_by_the_loop.set)
    assert await eventually(lambda: set_by_the_loop.wait(timeout=2), within=1, every=0)
    task.cancel()


async def test_eventually_fails_naming_what_never_came() -> None:
    with pytest.raises(AssertionError, match="waiting for the held batch running"):
        await eventually(lambda: False, within=0.05, what="the held batch running", every=0.01)
