"""The shadow verdict as a table: thresholds, minSamples, maxDurationSeconds, the
aggregates read and `now` in; Pending, Passed or Failed with a reason out. Then a property:
whatever the aggregates, a verdict never passes on fewer than minSamples or on missing
data, and never stays Pending past the deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubeinfer.operator.api.v1alpha1.enums import ShadowVerdict
from kubeinfer.operator.api.v1alpha1.inference_deployment import ShadowSpec
from kubeinfer.operator.rollout.aggregates import ShadowAggregates
from kubeinfer.operator.rollout.verdict import Reasons, judge, latency_regression_percent

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SHADOW = ShadowSpec.model_validate(
    {
        "minSamples": 100,
        "maxDurationSeconds": 600,
        "thresholds": {
            "maxAbsoluteOutputDifference": 0.05,
            "minTop1Agreement": 0.99,
            "maxP99LatencyRegressionPercent": 10,
        },
    }
)
GOOD = ShadowAggregates(
    compared=100,
    max_abs_difference=0.01,
    top1_rows=100,
    top1_agreements=100,
    primary_p99_seconds=0.010,
    candidate_p99_seconds=0.0105,
)
PASSED, FAILED, PENDING = ShadowVerdict.PASSED, ShadowVerdict.FAILED, ShadowVerdict.PENDING


def with_(**changes) -> ShadowAggregates:
    return ShadowAggregates(**{**GOOD.__dict__, **changes})


@pytest.mark.parametrize(
    ("aggregates", "seconds", "outcome", "reason"),
    [
        # Enough samples, every threshold met.
        (GOOD, 60, PASSED, Reasons.THRESHOLDS_MET),
        # A classification-free model: top-1 does not apply, the rest decides.
        (with_(top1_rows=0, top1_agreements=0), 60, PASSED, Reasons.THRESHOLDS_MET),
        # The candidate is faster: a negative regression passes.
        (with_(candidate_p99_seconds=0.005), 60, PASSED, Reasons.THRESHOLDS_MET),
        # Exactly at the limits passes (limits are inclusive).
        (
            with_(max_abs_difference=0.05, top1_agreements=99, candidate_p99_seconds=0.011),
            60,
            PASSED,
            Reasons.THRESHOLDS_MET,
        ),
        # Too few samples yet: wait, whatever the figures so far.
        (with_(compared=99, top1_agreements=50), 60, PENDING, Reasons.RUNNING),
        # The largest difference can only grow: broken before minSamples fails at once.
        (with_(compared=3, max_abs_difference=0.5), 1, FAILED, Reasons.DIFFERENCE_TOO_LARGE),
        # One request of another shape or datatype fails it at once, whatever the rest.
        (with_(compared=1, mismatches=1), 1, FAILED, Reasons.OUTPUT_MISMATCH),
        # Ratios and percentiles are judged at minSamples.
        (with_(top1_agreements=98), 60, FAILED, Reasons.TOP1_TOO_LOW),
        (with_(candidate_p99_seconds=0.0111), 60, FAILED, Reasons.LATENCY_REGRESSION),
        # The deadline without minSamples fails (rolled back, never promoted).
        (with_(compared=99), 600, FAILED, Reasons.INSUFFICIENT_SAMPLES),
        (with_(compared=0, max_abs_difference=None), 601, FAILED, Reasons.INSUFFICIENT_SAMPLES),
        # Latencies missing at minSamples: wait, and fail at the deadline.
        (with_(candidate_p99_seconds=None), 60, PENDING, Reasons.NO_LATENCY),
        (with_(candidate_p99_seconds=None), 600, FAILED, Reasons.NO_LATENCY),
        # Metrics that cannot be read: wait; at the deadline, fail.
        (None, 60, PENDING, Reasons.METRICS_UNAVAILABLE),
        (None, 600, FAILED, Reasons.INSUFFICIENT_SAMPLES),
    ],
)
def test_the_verdict_table(aggregates, seconds, outcome, reason):
    verdict = judge(SHADOW, aggregates, T0, T0 + timedelta(seconds=seconds))
    assert (verdict.outcome, verdict.reason) == (outcome, reason), verdict.message


def test_the_message_carries_the_figures_against_the_thresholds():
    verdict = judge(SHADOW, with_(top1_agreements=97), T0, T0 + timedelta(seconds=5))
    assert "0.9700" in verdict.message and "minTop1Agreement 0.99" in verdict.message
    assert "100 compared" in verdict.message


def test_latency_regression_is_relative_to_serving():
    assert latency_regression_percent(with_(candidate_p99_seconds=0.012)) == pytest.approx(20)
    assert latency_regression_percent(with_(primary_p99_seconds=None)) is None


aggregates_strategy = st.builds(
    ShadowAggregates,
    compared=st.integers(0, 300),
    mismatches=st.integers(0, 2),
    max_abs_difference=st.none() | st.floats(0, 1),
    top1_rows=st.integers(0, 300),
    top1_agreements=st.integers(0, 300),
    primary_p99_seconds=st.none() | st.floats(0.0001, 1),
    candidate_p99_seconds=st.none() | st.floats(0.0001, 1),
).filter(lambda a: a.top1_agreements <= a.top1_rows)


@given(aggregates=st.none() | aggregates_strategy, seconds=st.integers(0, 2000))
def test_no_verdict_passes_on_too_little_evidence_or_waits_past_the_deadline(aggregates, seconds):
    verdict = judge(SHADOW, aggregates, T0, T0 + timedelta(seconds=seconds))
    if verdict.outcome == PASSED:
        assert aggregates is not None and aggregates.compared >= SHADOW.min_samples
        assert not aggregates.mismatches
        assert (aggregates.max_abs_difference or 0) <= 0.05
    if seconds >= SHADOW.max_duration_seconds:
        assert verdict.outcome != PENDING
