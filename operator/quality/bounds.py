"""One-sided confidence bounds for the quality verdict. Pure, standard library only.

- An agreement is a proportion (top-1 agreements out of samples): Wilson's score bound.
  Unlike the normal ("Wald") bound it stays inside [0, 1] and keeps its coverage when the
  agreement is close to 1, which is where a quantised engine's agreement lives, and on
  the few hundred samples a class gets in a window.
- A mean (of per-sample absolute differences) is bounded with the normal approximation
  from its sum of squares: the samples are many and each is itself an average over the
  output's elements.

Each bound is one-sided: `z` is the standard normal quantile at 1 - (the chance of a
false alarm allowed to this one test), so the lower bound is below the true value, and
the upper bound above it, each with that chance of being wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True)
class Bounds:
    """A lower and an upper one-sided bound, each at the level its `z` was made for."""

    lower: float
    upper: float


def one_sided_z(false_alarm_probability: float) -> float:
    """The standard normal quantile a one-sided bound at this error probability uses."""
    if not 0.0 < false_alarm_probability < 1.0:
        raise ValueError(f"a false-alarm probability lies in (0, 1), not {false_alarm_probability}")
    return NormalDist().inv_cdf(1.0 - false_alarm_probability)


def wilson_bounds(successes: int, trials: int, z: float) -> Bounds:
    """Wilson's score bounds on the proportion behind `successes` out of `trials`."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"{successes} successes out of {trials} trials is no proportion")
    proportion = successes / trials
    z_squared = z * z
    denominator = 1.0 + z_squared / trials
    centre = (proportion + z_squared / (2.0 * trials)) / denominator
    half_width = (
        z
        * math.sqrt(proportion * (1.0 - proportion) / trials + z_squared / (4.0 * trials**2))
        / denominator
    )
    return Bounds(max(0.0, centre - half_width), min(1.0, centre + half_width))


def mean_bounds(total: float, square_total: float, count: int, z: float) -> Bounds:
    """Normal-approximation bounds on the mean of `count` values given their sum and their
    sum of squares (the sample variance, floored at zero against rounding)."""
    if count < 2:
        raise ValueError(f"a mean's spread needs 2 values or more, not {count}")
    mean = total / count
    variance = max(0.0, (square_total - count * mean * mean) / (count - 1))
    half_width = z * math.sqrt(variance / count)
    return Bounds(mean - half_width, mean + half_width)
