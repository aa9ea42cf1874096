"""The bounds the quality verdict stands on: the binomial tails against a direct sum of
the probabilities, Clopper and Pearson's bounds against a published value, their
coverage computed exactly (never more false alarms than their level, where Wilson's
bound gives several times more), and the mean's normal bounds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubeinfer.operator.quality.bounds import (
    at_least_probability,
    at_most_probability,
    exact_bounds,
    mean_bounds,
    one_sided_z,
)


def probability(k: int, n: int, p: float) -> float:
    """P(X = k) for X ~ Binomial(n, p), directly."""
    return math.comb(n, k) * p**k * (1.0 - p) ** (n - k)


def wilson_upper(k: int, n: int, z: float) -> float:
    """Wilson's score upper bound, to show what the exact bound is chosen over."""
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    return centre + z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)


@pytest.mark.parametrize("trials", [1, 7, 100, 400])
@pytest.mark.parametrize("proportion", [0.02, 0.5, 0.93, 0.999])
def test_the_tails_are_the_sums_of_the_probabilities(trials, proportion):
    for successes in sorted({0, 1, trials // 2, max(0, trials - 2), trials}):
        below = sum(probability(j, trials, proportion) for j in range(successes + 1))
        above = sum(probability(j, trials, proportion) for j in range(successes, trials + 1))
        assert at_most_probability(successes, trials, proportion) == pytest.approx(
            below, rel=1e-9, abs=1e-200
        )
        assert at_least_probability(successes, trials, proportion) == pytest.approx(
            above, rel=1e-9, abs=1e-200
        )


def test_the_tails_at_the_ends_of_the_range():
    assert at_most_probability(5, 10, 1.0) == 0.0  # disagreements are impossible at 1
    assert at_most_probability(10, 10, 1.0) == 1.0
    assert at_most_probability(0, 10, 0.0) == 1.0
    assert at_least_probability(0, 10, 0.3) == 1.0
    assert at_least_probability(3, 10, 0.0) == 0.0


def test_the_exact_bounds_match_a_published_interval():
    # 81 of 263 at 95 % two-sided (2.5 % each side): Clopper-Pearson's 0.2527..0.3676.
    bounds = exact_bounds(81, 263, 0.025)
    assert (round(bounds.lower, 4), round(bounds.upper, 4)) == (0.2527, 0.3676)
    # All successes: the upper bound is 1 and the lower one alpha^(1/n).
    assert exact_bounds(50, 50, 0.01).upper == 1.0
    assert exact_bounds(50, 50, 0.01).lower == pytest.approx(0.01 ** (1 / 50), abs=1e-9)
    assert exact_bounds(0, 50, 0.01).lower == 0.0
    assert exact_bounds(0, 0, 0.01) == exact_bounds(0, 0, 0.5)


@pytest.mark.parametrize("trials", [100, 180, 500])
@pytest.mark.parametrize("proportion", [0.95, 0.99])
@pytest.mark.parametrize("level", [0.01, 0.01 / 45])
def test_the_exact_upper_bound_falls_below_the_truth_no_more_often_than_its_level(
    trials, proportion, level
):
    # Summed exactly over every outcome: the chance that a group truly at `proportion`
    # has an upper bound below it, i.e. a false alarm at that per-test level.
    def false_alarm(upper_bound) -> float:
        return sum(
            probability(k, trials, proportion)
            for k in range(trials + 1)
            if upper_bound(k) < proportion
        )

    exact = false_alarm(lambda k: exact_bounds(k, trials, level).upper)
    assert exact <= level
    # Wilson's bound, the first choice, does worse near 1 at these levels: the
    # reason the verdict uses the exact test.
    z = one_sided_z(level)
    if level < 0.01 or proportion > 0.98:
        assert false_alarm(lambda k: wilson_upper(k, trials, z)) > 1.3 * level


@given(
    trials=st.integers(1, 3000),
    share=st.floats(0, 1),
    level=st.sampled_from([0.2, 0.01, 1e-4]),
)
def test_the_bounds_enclose_the_observed_agreement_and_invert_the_test(trials, share, level):
    successes = round(trials * share)
    bounds = exact_bounds(successes, trials, level)
    assert 0.0 <= bounds.lower <= successes / trials <= bounds.upper <= 1.0
    # At the bound the tail has the level's probability (that is what the bound is), to
    # the bisection's precision: near a share of 1 the tail is steep in the proportion.
    if successes < trials:
        assert at_most_probability(successes, trials, bounds.upper) == pytest.approx(
            level, rel=1e-4
        )
    if successes > 0:
        assert at_least_probability(successes, trials, bounds.lower) == pytest.approx(
            level, rel=1e-4
        )


def test_the_mean_bounds_are_the_normal_ones():
    # 100 values, mean 0.02, standard deviation 0.01: half-width z * 0.001.
    count, mean, spread = 100, 0.02, 0.01
    square_total = (count - 1) * spread**2 + count * mean**2
    bounds = mean_bounds(mean * count, square_total, count, 2.0)
    assert (bounds.lower, bounds.upper) == (pytest.approx(0.018), pytest.approx(0.022))
    # Identical values: no spread (rounding below zero is floored).
    assert mean_bounds(3.0, 0.09 - 1e-18, 100, 3.0) == mean_bounds(3.0, 0.09, 100, 3.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: mean_bounds(1.0, 1.0, 1, 2.0),
        lambda: exact_bounds(3, 2, 0.01),
        lambda: exact_bounds(1, 2, 0.0),
        lambda: at_most_probability(-1, 2, 0.5),
        lambda: one_sided_z(1.0),
    ],
)
def test_impossible_inputs_are_refused(call):
    with pytest.raises(ValueError):
        call()
