"""Which answered requests are mirrored: exactly `trafficPercent` of every hundred.

A credit accumulator rather than a random draw: deterministic (a test or a low-traffic
shadow sees exactly the share it asked for, not a binomial spread around it) and without
an RNG to inject. Pure.
"""

from __future__ import annotations


class Sampler:
    """`take()` is true for exactly `percent` of any 100 consecutive calls, spread evenly;
    the very first call is taken, so a shadow starts comparing at its first request."""

    def __init__(self, percent: int) -> None:
        if not 0 <= percent <= 100:
            raise ValueError(f"percent {percent} is outside 0..100")
        self._percent = percent
        self._credit = 100 - percent

    def take(self) -> bool:
        self._credit += self._percent
        if self._credit >= 100:
            self._credit -= 100
            return True
        return False
