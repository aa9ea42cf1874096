"""kopf's readiness toggles, counted (`operator.kube.kopf_toggles`), on their own:

- the set means what kopf's means: with `all`, on when every toggle is on (or none is
  left), its waiters released only then; with `any`, on when one is; a toggle turned
  on or off counts, and a dropped one no longer does;
- what kopf's start does with it (a toggle per listed object, made then dropped, while
  every listed object's worker waits for the set) checks the set a number of times that
  grows with the objects, not with their square: counted, not timed;
- `install` makes kopf build its sets from it (kopf looks the class up when it starts).
"""

from __future__ import annotations

import asyncio

import pytest
from kopf._cogs.aiokits import aiotoggles
from kubeinfer.operator.kube import kopf_toggles
from kubeinfer.operator.kube.kopf_toggles import CountedToggleSet


async def test_all_is_on_only_when_every_toggle_is_and_releases_its_waiters_then() -> None:
    toggles = CountedToggleSet(all)
    assert toggles.is_on()  # no toggle: nothing holds it back, as kopf's
    first = await toggles.make_toggle(name="first")
    second = await toggles.make_toggle(True, name="second")
    assert toggles.is_off()
    waiter = asyncio.create_task(toggles.wait_for(True))
    await asyncio.sleep(0)  # not a wait: one loop turn: the waiter waits before the toggle turns
    await first.turn_to(True)
    await asyncio.wait_for(waiter, 1)
    await second.turn_to(False)
    assert toggles.is_off()
    await toggles.drop_toggle(second)
    assert toggles.is_on() and len(toggles) == 1
    await second.turn_to(True)  # dropped: no longer counted
    await second.turn_to(False)
    assert toggles.is_on()
    await toggles.drop_toggles([first, first])
    assert toggles.is_on() and len(toggles) == 0


async def test_any_is_on_while_one_toggle_is() -> None:
    toggles = CountedToggleSet(any)
    assert toggles.is_off()
    paused = await toggles.make_toggle(True, name="peering")
    assert toggles.is_on()
    waiter = asyncio.create_task(toggles.wait_for(False))
    await asyncio.sleep(0)  # not a wait: one loop turn: the waiter waits before the toggle turns
    await paused.turn_to(False)
    await asyncio.wait_for(waiter, 1)
    await paused.turn_to(True)
    await toggles.drop_toggle(paused)
    assert toggles.is_off()


class Checked(CountedToggleSet):
    """Counts how often the set's state is checked."""

    checks = 0

    def is_on(self) -> bool:
        Checked.checks += 1
        return super().is_on()


@pytest.mark.parametrize("objects", [200, 400])
async def test_a_start_with_many_objects_checks_the_set_linearly(objects: int) -> None:
    Checked.checks = 0
    indexed = Checked(all)
    blocker = await indexed.make_toggle(name="listing")
    waiters = []
    for index in range(objects):  # kopf's watcher: a toggle per object, then its worker
        toggle = await indexed.make_toggle(name=f"object {index}")
        waiters.append(asyncio.create_task(indexed.wait_for(True)))
        # not a wait: one loop turn: the worker waits before the next object comes
        await asyncio.sleep(0)
        await indexed.drop_toggle(toggle)  # its index handlers ran
    await indexed.drop_toggle(blocker)  # the listing is over
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert Checked.checks <= 8 * objects, f"{Checked.checks} checks for {objects} objects"


def test_install_makes_kopf_build_counted_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiotoggles, "ToggleSet", aiotoggles.ToggleSet)  # undone after
    kopf_toggles.install()
    assert isinstance(aiotoggles.ToggleSet(all), CountedToggleSet)
