"""The autoscaler's parts on their own, where `recommend` cannot show a difference: what
each signal proposes (a signal that has no say is still named), GPU memory against a
watermark of 0, the figures messages print, and what the history keeps (only what a
window or a limit can still read: a record that grows for nothing costs memory in a
long-running operator)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.scaling import rate_limits, stabilization
from kubeinfer.operator.scaling.signals import figure, propose
from kubeinfer.operator.state.scaling_inputs import ScaleEvent, ScalingSignals, ServingPods

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
QUEUE, GPU = "requestsInProgressPerReplica", "gpuMemoryUsedRatio"


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("watermark", "signals", "pods", "proposed"),
    [
        # Neither has a say, and each is still named (ScalingActive lists them by name).
        pytest.param(0.8, ScalingSignals(None, 0.5), ServingPods(4, 4, 0),
                     ((QUEUE, None), (GPU, None)), id="no-say-still-named"),
        # A watermark of 0: any use at all is too much, one pod more than are ready.
        pytest.param(0.0, ScalingSignals(8, 0.1), ServingPods(4, 4, 0),
                     ((QUEUE, 4), (GPU, 5)), id="watermark-0-one-more"),
        # ... counted from the ready pods, a rolling update's surge pod among them.
        pytest.param(0.0, ScalingSignals(8, 0.1), ServingPods(4, 5, 0),
                     ((QUEUE, 4), (GPU, 6)), id="watermark-0-counts-ready-pods"),
        # ... and no use is not too much.
        pytest.param(0.0, ScalingSignals(8, 0.0), ServingPods(4, 4, 0),
                     ((QUEUE, 4), (GPU, None)), id="watermark-0-no-use-no-say"),
    ],
)  # fmt: skip
def test_what_each_signal_proposes(watermark, signals, pods, proposed):
    spec = AutoscalingSpec(enabled=True, max_replicas=20, gpu_memory_high_watermark=watermark)
    proposals = propose(spec, signals, pods)
    assert tuple((p.signal, p.replicas) for p in proposals) == proposed


@pytest.mark.parametrize(
    ("value", "text"),
    [(23.5, "23.5"), (8.0, "8"), (100, "100"), (0.934, "0.93"), (-0.001, "0")],
)
def test_figures_have_at_most_two_decimals_and_no_trailing_zeros(value, text):
    assert figure(value) == text


UP_60_DOWN_300 = AutoscalingSpec(
    scale_up_stabilization_seconds=60, scale_down_stabilization_seconds=300
)


@pytest.mark.parametrize(
    ("recorded", "recommended", "kept"),
    [
        # Lower for the up window, higher for the down window: both can still be picked.
        pytest.param(((ago(30), 3), (ago(20), 7)), 5, ((ago(30), 3), (ago(20), 7), (NOW, 5)),
                     id="each-window-extremum-kept"),
        # A newer equal value answers both windows for longer: the older one goes.
        pytest.param(((ago(30), 4),), 4, ((NOW, 4),), id="newer-equal-dominates"),
        # Older than both windows, however low: no window reads it.
        pytest.param(((ago(3600), 1),), 5, ((NOW, 5),), id="older-than-both-windows"),
        # From a clock that went back: that one goes, the ones before it stay.
        pytest.param(((ago(30), 2), (NOW + timedelta(seconds=10), 9)), 5,
                     ((ago(30), 2), (NOW, 5)), id="future-entry-alone-dropped"),
        # A pass of this very instant (two in one tick) is inside every window.
        pytest.param(((NOW, 3),), 5, ((NOW, 3), (NOW, 5)), id="same-instant-kept"),
    ],
)  # fmt: skip
def test_the_recommendations_kept_are_those_a_window_can_still_pick(recorded, recommended, kept):
    assert stabilization.record(UP_60_DOWN_300, recorded, NOW, recommended) == kept


def test_the_scale_events_kept_are_those_a_limit_can_still_count():
    # Periods 15 s up, 60 s down: an event exactly 60 s old is outside both (a period is
    # the last 60 s, its start excluded, as `_start_of_period` counts).
    spec = AutoscalingSpec()
    at_cutoff, inside, now = (
        ScaleEvent(ago(60), 4, 2),
        ScaleEvent(ago(59), 2, 1),
        ScaleEvent(NOW, 1, 2),
    )
    assert rate_limits.record(spec, (at_cutoff, inside, now), NOW) == (inside, now)
