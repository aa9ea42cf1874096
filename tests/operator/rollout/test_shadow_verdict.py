"""The shadow verdict as a table: thresholds, minSamples, maxDurationSeconds, the
aggregates read and `now` in; Pending, Passed or Failed with a reason out. Then a property:
whatever the aggregates, a verdict never passes on fewer than minSamples or on missing
data, and never stays Pending past the deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.api.v1alpha1.enums import ShadowVerdict
from kubeinfer.operator.api.v1alpha1.inference_deployment import ShadowSpec
from kubeinfer.operator.rollout.verdict import (
    judge,
    latency_regression_percent,
    summary,
)
from kubeinfer.operator.state.shadow_readings import ShadowAggregates

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
    serving_p99_seconds=0.010,
    candidate_p99_seconds=0.0105,
)
PASSED, FAILED, PENDING = ShadowVerdict.PASSED, ShadowVerdict.FAILED, ShadowVerdict.PENDING


def with_(**changes) -> ShadowAggregates:
    return ShadowAggregates(**{**GOOD.__dict__, **changes})


@pytest.mark.parametrize(
    ("aggregates", "seconds", "outcome", "reason"),
    [
        # Enough samples, every threshold met.
        (GOOD, 60, PASSED, Reason.THRESHOLDS_MET),
        # A classification-free model: top-1 does not apply, the rest decides.
        (with_(top1_rows=0, top1_agreements=0), 60, PASSED, Reason.THRESHOLDS_MET),
        # The candidate is faster: a negative regression passes.
        (with_(candidate_p99_seconds=0.005), 60, PASSED, Reason.THRESHOLDS_MET),
        # Exactly at the limits passes (limits are inclusive).
        (
            with_(max_abs_difference=0.05, top1_agreements=99, candidate_p99_seconds=0.011),
            60,
            PASSED,
            Reason.THRESHOLDS_MET,
        ),
        # Too few samples yet: wait, whatever the figures so far.
        (with_(compared=99, top1_agreements=50), 60, PENDING, Reason.SHADOW_RUNNING),
        # The largest difference can only grow: broken before minSamples fails at once.
        (with_(compared=3, max_abs_difference=0.5), 1, FAILED, Reason.DIFFERENCE_TOO_LARGE),
        # One request of another shape or datatype fails it at once, whatever the rest.
        (with_(compared=1, mismatches=1), 1, FAILED, Reason.OUTPUT_MISMATCH),
        # Ratios and percentiles are judged at minSamples.
        (with_(top1_agreements=98), 60, FAILED, Reason.TOP1_AGREEMENT_TOO_LOW),
        (with_(candidate_p99_seconds=0.0111), 60, FAILED, Reason.LATENCY_REGRESSION),
        # The deadline without minSamples fails (rolled back, never promoted).
        (with_(compared=99), 600, FAILED, Reason.INSUFFICIENT_SAMPLES),
        (with_(compared=0, max_abs_difference=None), 601, FAILED, Reason.INSUFFICIENT_SAMPLES),
        # Latencies missing at minSamples: wait, and fail at the deadline.
        (with_(candidate_p99_seconds=None), 60, PENDING, Reason.LATENCY_NOT_MEASURED),
        (with_(candidate_p99_seconds=None), 600, FAILED, Reason.LATENCY_NOT_MEASURED),
        # Metrics that cannot be read: wait; at the deadline, fail.
        (None, 60, PENDING, Reason.METRICS_UNAVAILABLE),
        (None, 600, FAILED, Reason.INSUFFICIENT_SAMPLES),
    ],
)
def test_the_verdict_table(aggregates, seconds, outcome, reason):
    verdict = judge(SHADOW, aggregates, T0, T0 + timedelta(seconds=seconds))
    assert (verdict.outcome, verdict.reason) == (outcome, reason), verdict.message


@pytest.mark.parametrize(
    ("aggregates", "seconds", "fragments"),
    [
        # Each message names the measured figure next to the threshold or setting it broke
        # (by its CRD name), so `kubectl describe` says why without reading metrics.
        (with_(top1_agreements=97), 5, ["0.9700", "minTop1Agreement 0.99", "100 compared"]),
        (
            with_(compared=3, max_abs_difference=0.5),
            1,
            ["Max |diff| 0.5", "maxAbsoluteOutputDifference 0.05", "3 compared"],
        ),
        (with_(compared=5, mismatches=2), 1, ["2 compared requests", "shape", "5 compared"]),
        (
            with_(candidate_p99_seconds=0.0111),
            60,
            ["11.0 % above", "maxP99LatencyRegressionPercent 10", "11.10 ms"],
        ),
        (GOOD, 60, ["All thresholds met on 100 requests", "top-1 agreement 1.0000"]),
        (with_(compared=99), 60, ["99 of 100 samples", "99 compared"]),
        (with_(compared=99), 600, ["99 of minSamples 100", "maxDurationSeconds 600"]),
        # Latencies still missing at the deadline: the failure keeps the reason's message.
        (with_(candidate_p99_seconds=None), 60, ["p99 latencies", "100 compared"]),
        (with_(candidate_p99_seconds=None), 600, ["p99 latencies", "100 compared"]),
        (None, 60, ["metrics cannot be read"]),
        (None, 600, ["600 s", "maxDurationSeconds"]),
    ],
)
def test_the_message_names_the_figures_and_the_threshold(aggregates, seconds, fragments):
    message = judge(SHADOW, aggregates, T0, T0 + timedelta(seconds=seconds)).message
    for fragment in fragments:
        assert fragment in message


def test_a_p99_regression_exactly_at_the_limit_passes():
    # maxP99LatencyRegressionPercent is the "largest acceptable" increase: equal passes.
    # 62.5 ms -> 78.125 ms is exactly +25 % in binary floating point (0.011 / 0.010 is a
    # hair under 10 %, so the table's boundary row cannot tell > from >=).
    shadow = SHADOW.model_copy(
        update={
            "thresholds": SHADOW.thresholds.model_copy(
                update={"max_p99_latency_regression_percent": 25}
            )
        }
    )
    at_limit = with_(serving_p99_seconds=0.0625, candidate_p99_seconds=0.078125)
    verdict = judge(shadow, at_limit, T0, T0 + timedelta(seconds=60))
    assert (verdict.outcome, verdict.reason) == (PASSED, Reason.THRESHOLDS_MET)
    slower = with_(serving_p99_seconds=0.0625, candidate_p99_seconds=0.0782)
    assert judge(shadow, slower, T0, T0 + timedelta(seconds=60)).outcome == FAILED


def test_the_summary_names_every_figure_in_its_unit():
    # p99s in milliseconds; errors and timeouts counted together as lost answers.
    aggregates = ShadowAggregates(
        compared=120,
        dropped=4,
        candidate_errors=2,
        timeouts=3,
        max_abs_difference=0.0123,
        top1_rows=100,
        top1_agreements=99,
        serving_p99_seconds=0.0125,
        candidate_p99_seconds=0.0135,
    )
    assert summary(aggregates) == (
        "120 compared, max |diff| 0.0123, top-1 agreement 0.9900, "
        "p99 13.50 ms vs serving 12.50 ms, 5 candidate errors or timeouts, "
        "4 dropped by the mirror"
    )
    # Nothing lost, nothing dropped, nothing measured yet: only the count.
    assert summary(ShadowAggregates(compared=0)) == "0 compared"


def test_latency_regression_is_relative_to_serving():
    assert latency_regression_percent(with_(candidate_p99_seconds=0.012)) == pytest.approx(20)
    assert latency_regression_percent(with_(serving_p99_seconds=None)) is None


@pytest.mark.parametrize(
    ("candidate_p99", "regression", "outcome"),
    [
        # Both p99s read as zero (a query override may round them so): no regression.
        (0.0, 0.0, PASSED),
        # Serving at zero, the candidate above it: infinitely slower, whatever the limit.
        (0.0005, float("inf"), FAILED),
        (2.0, float("inf"), FAILED),
    ],
)
def test_a_zero_serving_p99_is_judged_without_dividing_by_it(candidate_p99, regression, outcome):
    aggregates = with_(serving_p99_seconds=0.0, candidate_p99_seconds=candidate_p99)
    assert latency_regression_percent(aggregates) == regression
    assert judge(SHADOW, aggregates, T0, T0 + timedelta(seconds=60)).outcome == outcome


aggregates_strategy = st.builds(
    ShadowAggregates,
    compared=st.integers(0, 300),
    mismatches=st.integers(0, 2),
    max_abs_difference=st.none() | st.floats(0, 1),
    top1_rows=st.integers(0, 300),
    top1_agreements=st.integers(0, 300),
    serving_p99_seconds=st.none() | st.floats(0.0001, 1),
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
