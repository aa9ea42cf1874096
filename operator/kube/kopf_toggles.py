"""kopf's readiness toggles, counted: its start with thousands of objects was quadratic.

kopf runs no handler until every index has its initial listing (what `kube.cache` relies
on). It holds them back with a toggle per watched object in one `ToggleSet(all)`, made
when the object's first event arrives and dropped once its index handlers ran, while the
worker of every object already listed waits for the whole set to be on. kopf's set
(kopf 1.45, `_cogs/aiokits/aiotoggles.py`) wakes every waiter on every toggle made or
dropped, and each waiter then checks every toggle: with a thousand InferenceDeployments
and their children (some eight thousand objects) a fresh leader spent minutes of CPU on
it before its first pass, and its Lease renewals, on the same event loop, timed out
(docs/fleet.md).

`CountedToggleSet` is the same set, with the number of toggles that are on kept as they
change, so whether the set is on is known at once for `all` and `any` (kopf's only two),
and the waiters are woken only when that changes. `install` makes kopf build its sets
from it; kopf builds them when it starts, so installing before `kopf.operator` is enough.
Remove this module once kopf's own set does the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from kopf._cogs.aiokits import aiotoggles


class _Member(aiotoggles.Toggle):
    """A toggle of one `CountedToggleSet`, which it tells when it turns."""

    def __init__(
        self,
        state: bool,
        *,
        name: str | None,
        condition: asyncio.Condition,
        owner: CountedToggleSet,
    ) -> None:
        super().__init__(state, name=name, condition=condition)
        self._owner = owner

    async def turn_to(self, __state: bool) -> None:
        async with self._condition:
            if bool(__state) != self._state and self in self._owner:
                self._owner.on_count += 1 if __state else -1
            self._state = bool(__state)
            self._condition.notify_all()  # turned one by one, and rarely (peering's)


class CountedToggleSet(aiotoggles.ToggleSet):
    """kopf's `ToggleSet` with `is_on` in constant time for `all` and `any`, and its
    waiters woken only when that answer changes."""

    def __init__(self, fn: Callable[[Iterable[bool]], bool]) -> None:
        super().__init__(fn)
        self.on_count = 0
        """How many of the set's toggles are on."""

    def is_on(self) -> bool:
        if self._fn is all:
            return self.on_count == len(self._toggles)
        if self._fn is any:
            return self.on_count > 0
        return super().is_on()

    async def make_toggle(
        self, __val: bool = False, *, name: str | None = None
    ) -> aiotoggles.Toggle:
        toggle = _Member(__val, name=name, condition=self._condition, owner=self)
        async with self._condition:
            before = self.is_on()
            self._toggles.add(toggle)
            self.on_count += toggle.is_on()
            self._notify_if_changed(before)
        return toggle

    async def drop_toggle(self, toggle: aiotoggles.Toggle) -> None:
        await self.drop_toggles([toggle])

    async def drop_toggles(self, toggles: Iterable[aiotoggles.Toggle]) -> None:
        async with self._condition:
            before = self.is_on()
            for toggle in toggles:
                if toggle in self._toggles:
                    self._toggles.discard(toggle)
                    self.on_count -= toggle.is_on()
            self._notify_if_changed(before)

    def _notify_if_changed(self, before: bool) -> None:
        if self.is_on() != before:
            self._condition.notify_all()


def install() -> None:
    """Makes kopf build its toggle sets (readiness, pausing) as `CountedToggleSet`s."""
    aiotoggles.ToggleSet = CountedToggleSet  # type: ignore[misc]
