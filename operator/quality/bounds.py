"""One-sided confidence bounds and tests for the quality verdict. Pure, standard library.

- An agreement is a proportion (top-1 agreements out of samples): it is tested exactly,
  with the binomial distribution's own tails, and bounded by Clopper and Pearson's exact
  bounds (the same test, inverted). Wilson's score bound was the first choice, but near an
  agreement of 1 and at the small per-test levels a correction across many groups leaves,
  which is exactly where a quantised engine's per-class test lives, it falls below the
  true agreement several times more often than its level says: the binomial's long lower
  tail there is not the normal's. The exact bound never does (it is conservative).
- A mean (of per-sample absolute differences) is bounded with the normal approximation
  from its sum of squares: the samples are many and each is itself an average over the
  output's elements.

Each bound is one-sided at the error probability given: the lower bound is above the
true value, or the upper bound below it, with at most that probability.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

_BISECTION_STEPS = 40
"""Halvings of [0, 1] for a bound: finer than any agreement a window can tell apart. The
verdict's decisions use the tails themselves; the bounds are for people to read."""


@dataclass(frozen=True)
class Bounds:
    """A lower and an upper one-sided bound, each at the error probability it was made for."""

    lower: float
    upper: float


def one_sided_z(false_alarm_probability: float) -> float:
    """The standard normal quantile a one-sided bound at this error probability uses."""
    _check_probability(false_alarm_probability)
    return NormalDist().inv_cdf(1.0 - false_alarm_probability)


def at_most_probability(successes: int, trials: int, proportion: float) -> float:
    """P(X <= successes) for X ~ Binomial(trials, proportion): how likely so few successes
    (or fewer) are if the true proportion is `proportion`."""
    _check_counts(successes, trials)
    if successes >= trials or proportion <= 0.0:
        return 1.0
    if proportion >= 1.0:
        return 0.0
    return _regularized_incomplete_beta(trials - successes, successes + 1, 1.0 - proportion)


def at_least_probability(successes: int, trials: int, proportion: float) -> float:
    """P(X >= successes) for X ~ Binomial(trials, proportion)."""
    _check_counts(successes, trials)
    if successes <= 0 or proportion >= 1.0:
        return 1.0
    if proportion <= 0.0:
        return 0.0
    return _regularized_incomplete_beta(successes, trials - successes + 1, proportion)


@lru_cache(maxsize=4096)
def exact_bounds(successes: int, trials: int, false_alarm_probability: float) -> Bounds:
    """Clopper and Pearson's one-sided bounds on the proportion behind `successes` out of
    `trials`: the upper bound is the proportion under which so few successes have exactly
    that probability (the lower bound likewise for so many). Cached: a pure function
    called on the same baseline every evaluation."""
    _check_counts(successes, trials)
    _check_probability(false_alarm_probability)
    if trials == 0:
        return Bounds(0.0, 1.0)
    lower = 0.0
    if successes > 0:
        lower = _bisect_increasing(
            lambda p: at_least_probability(successes, trials, p), false_alarm_probability
        )
    upper = 1.0
    if successes < trials:
        upper = _bisect_increasing(
            lambda p: -at_most_probability(successes, trials, p), -false_alarm_probability
        )
    return Bounds(lower, upper)


def mean_bounds(total: float, square_total: float, count: int, z: float) -> Bounds:
    """Normal-approximation bounds on the mean of `count` values given their sum and their
    sum of squares (the sample variance, floored at zero against rounding)."""
    if count < 2:
        raise ValueError(f"a mean's spread needs 2 values or more, not {count}")
    mean = total / count
    variance = max(0.0, (square_total - count * mean * mean) / (count - 1))
    half_width = z * math.sqrt(variance / count)
    return Bounds(mean - half_width, mean + half_width)


def _check_counts(successes: int, trials: int) -> None:
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"{successes} successes out of {trials} trials is no proportion")


def _check_probability(probability: float) -> None:
    if not 0.0 < probability < 1.0:
        raise ValueError(f"a false-alarm probability lies in (0, 1), not {probability}")


def _bisect_increasing(function: Callable[[float], float], target: float) -> float:
    """The p in [0, 1] where an increasing `function` reaches `target`."""
    low, high = 0.0, 1.0
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2.0
        if function(middle) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


def _regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), by its continued fraction (Lentz's method), on the side of x where the
    fraction converges quickly."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300

    def nonzero(value: float) -> float:
        return value if abs(value) > tiny else tiny

    c = 1.0
    d = 1.0 / nonzero(1.0 - (a + b) * x / (a + 1.0))
    result = d
    for m in range(1, 100_000):
        even = m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m))
        d = 1.0 / nonzero(1.0 + even * d)
        c = nonzero(1.0 + even / c)
        result *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))
        d = 1.0 / nonzero(1.0 + odd * d)
        c = nonzero(1.0 + odd / c)
        step = d * c
        result *= step
        if abs(step - 1.0) < 1e-15:
            break
    return result
