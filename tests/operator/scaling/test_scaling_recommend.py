"""The autoscaler's recommendation as a table, a row per rule: tolerance, each signal and
the largest winning, GPU memory only pushing up (and its floor), missing or failing
metrics and no ready pod (the count held), each stabilization window, each rate limit,
the bounds (also without metrics), and the history a fresh operator starts from. Then the
messages (figures against their targets, nothing relative to the clock, so a pass that
finds nothing new gives the same conditions) and the history returned (this pass'
recommendation and scale event recorded). Startup awareness has its own table in
test_scaling_startup.py; properties over whole sequences are in
test_scaling_properties.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, Reason
from kubeinfer.operator.scaling.recommend import recommend
from kubeinfer.operator.state.scaling_inputs import (
    ScaleEvent,
    ScalingHistory,
    ScalingSignals,
    ServingPods,
)

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
BASE = {"enabled": True, "minReplicas": 1, "maxReplicas": 20}
QUEUE, GPU, NONE = "requestsInProgressPerReplica", "gpuMemoryUsedRatio", "none"


def spec_of(**fields) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate({**BASE, **fields})


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def ran_before(*recommendations: tuple[float, int], events=(), committed=None) -> ScalingHistory:
    """A history of (seconds ago, count) recommendations; by default one long past, so
    the record is not empty (an empty one is a fresh operator's, its own row)."""
    return ScalingHistory(
        recommendations=tuple((ago(s), n) for s, n in recommendations or ((3600, 1),)),
        events=tuple(ScaleEvent(ago(s), before, after) for s, before, after in events),
        committed=committed,
    )


def serving(desired: int, ready: int | None = None, starting: int = 0) -> ServingPods:
    return ServingPods(
        desired=desired, ready=desired if ready is None else ready, starting=starting
    )


def row(fields, signals, pods, replicas, signal, limited, *, id, history=None):
    """One rule: spec fields, what was read, the pods, the history (by default one that
    ran long before) -> the count, the deciding signal and the ScalingLimited reason."""
    history = ran_before() if history is None else history
    return pytest.param(fields, history, signals, pods, replicas, signal, limited, id=id)


WITHIN = Reason.DESIRED_WITHIN_RANGE
FREE_DOWN = {"scaleDownStabilizationSeconds": 0, "scaleDownMaxPercent": 100}
"""No down window and no down limit: the signals' own answer shows."""

ROWS = [
    # Tolerance: 8.7 is within 10 % of 8, nothing moves; 8.9 is not: ceil(2 x 8.9 / 8) = 3.
    row({}, ScalingSignals(8.7), serving(2), 2, QUEUE, WITHIN, id="within-tolerance-holds"),
    row({}, ScalingSignals(8.9), serving(2), 3, QUEUE, WITHIN, id="beyond-tolerance-scales"),
    row({"tolerance": 0}, ScalingSignals(8.7), serving(2), 3, QUEUE, WITHIN,
        id="zero-tolerance-scales-on-any-excess"),
    # Exactly at the tolerance is within it (the HPA skips a ratio off by <= tolerance),
    # either way: 10 / 8 and 6 / 8 are 1 +- 0.25 exactly.
    row({"tolerance": 0.25}, ScalingSignals(10), serving(2), 2, QUEUE, WITHIN,
        id="exactly-at-tolerance-holds-up"),
    row({"tolerance": 0.25, **FREE_DOWN}, ScalingSignals(6), serving(4), 4, QUEUE, WITHIN,
        id="exactly-at-tolerance-holds-down"),
    # The HPA's formula: ceil(ready x value / target).
    row({}, ScalingSignals(23.5), serving(2), 6, QUEUE, WITHIN, id="queue-depth-scales-up"),
    row(FREE_DOWN, ScalingSignals(2), serving(4), 1, QUEUE, WITHIN,
        id="queue-depth-scales-down"),
    # The mean is over the ready pods: 3 ready of 5 at twice the target call for 6.
    row({}, ScalingSignals(16), serving(5, ready=3, starting=2), 6, QUEUE, WITHIN,
        id="formula-counts-ready-pods"),
    # Above target never calls for fewer than now (3 ready x 1.5 = 4.5, 6 set).
    row({}, ScalingSignals(12), serving(6, ready=3, starting=3), 6, QUEUE, WITHIN,
        id="above-target-never-calls-for-fewer"),
    # GPU memory pushes up: ceil(4 x 0.95 / 0.8) = 5, and at least one more than now.
    row({"gpuMemoryHighWatermark": 0.8}, ScalingSignals(8, 0.95), serving(4), 5, GPU, WITHIN,
        id="gpu-memory-pushes-up"),
    row({"gpuMemoryHighWatermark": 0.8}, ScalingSignals(8, 0.95),
        serving(6, ready=2, starting=4), 7, GPU, WITHIN, id="gpu-memory-adds-at-least-one"),
    # Above the watermark within tolerance: GPU memory keeps the count the queue would cut.
    row({"gpuMemoryHighWatermark": 0.8, **FREE_DOWN}, ScalingSignals(1, 0.85), serving(4), 4,
        GPU, Reason.GPU_MEMORY_HIGH, id="gpu-memory-floor-holds"),
    # Exactly at its tolerance above the watermark (0.625 / 0.5 = 1.25) GPU memory keeps
    # the count, as the queue's tolerance does; and with the requests in progress not calling for
    # fewer pods, keeping them is no limit (DesiredWithinRange, not GpuMemoryHigh).
    row({"gpuMemoryHighWatermark": 0.5, "tolerance": 0.25}, ScalingSignals(8, 0.625),
        serving(4), 4, QUEUE, WITHIN, id="gpu-memory-exactly-at-tolerance-keeps"),
    row({"gpuMemoryHighWatermark": 0.8}, ScalingSignals(8, 0.85), serving(4), 4, QUEUE,
        WITHIN, id="gpu-memory-floor-no-limit-when-queue-keeps-too"),
    # At or below the watermark GPU memory has no say: the queue's scale-down passes.
    row({"gpuMemoryHighWatermark": 0.8, **FREE_DOWN}, ScalingSignals(1, 0.8), serving(4), 1,
        QUEUE, WITHIN, id="gpu-memory-at-watermark-no-say"),
    # The largest recommendation wins, and names its signal.
    row({"gpuMemoryHighWatermark": 0.8}, ScalingSignals(12, 0.95), serving(4), 6, QUEUE,
        WITHIN, id="largest-wins-queue"),
    row({"gpuMemoryHighWatermark": 0.5}, ScalingSignals(9.5, 0.95), serving(4), 8, GPU,
        WITHIN, id="largest-wins-gpu"),
    # A tie goes to the first signal, the requests in progress: ceil(4 x 10 / 8) = ceil(4 x 0.95 /
    # 0.8) = 5.
    row({"gpuMemoryHighWatermark": 0.8}, ScalingSignals(10, 0.95), serving(4), 5, QUEUE,
        WITHIN, id="tie-goes-to-queue-depth"),
    # The requests in progress unread, GPU memory read: it may add pods, nothing removes one.
    row(FREE_DOWN, ScalingSignals(None, 0.3), serving(4), 4, NONE, WITHIN,
        id="queue-unread-gpu-low-holds"),
    row({"gpuMemoryHighWatermark": 0.8}, ScalingSignals(None, 0.95), serving(4), 5, GPU,
        WITHIN, id="queue-unread-gpu-high-scales-up"),
    # Missing data never scales down: the count is held.
    row(FREE_DOWN, ScalingSignals(0.5, error="Prometheus: timed out"), serving(6), 6, NONE,
        WITHIN, id="metrics-error-holds"),
    row(FREE_DOWN, ScalingSignals(None, None), serving(6), 6, NONE, WITHIN,
        id="every-signal-missing-holds"),
    row(FREE_DOWN, ScalingSignals(0.5), serving(3, ready=0, starting=3), 3, NONE, WITHIN,
        id="no-ready-pod-holds"),
    # Stabilization windows over the recorded recommendations.
    row({"scaleUpStabilizationSeconds": 60}, ScalingSignals(24), serving(2), 3, QUEUE,
        Reason.SCALE_UP_STABILIZED, history=ran_before((30, 3)), id="up-window-lowest"),
    row({"scaleUpStabilizationSeconds": 60}, ScalingSignals(24), serving(2), 6, QUEUE,
        WITHIN, history=ran_before((60, 3)), id="up-window-forgets-older"),
    row({"scaleDownMaxPercent": 100}, ScalingSignals(2), serving(6), 5, QUEUE,
        Reason.SCALE_DOWN_STABILIZED, history=ran_before((299, 5), (100, 4)),
        id="down-window-highest"),
    row({"scaleDownMaxPercent": 100}, ScalingSignals(2), serving(6), 2, QUEUE, WITHIN,
        history=ran_before((300, 5)), id="down-window-forgets-older"),
    # A fresh history (a restarted operator) is seeded with the count: no scale-down yet.
    row({}, ScalingSignals(2), serving(6), 6, QUEUE, Reason.SCALE_DOWN_STABILIZED,
        history=ScalingHistory(), id="fresh-history-does-not-scale-down"),
    row({}, ScalingSignals(23.5), serving(2), 6, QUEUE, WITHIN, history=ScalingHistory(),
        id="fresh-history-scales-up"),
    # Up: max(+100 %, +4 pods) per 15 s, from the count at the period's start.
    row({}, ScalingSignals(80), serving(2), 6, QUEUE, Reason.SCALE_UP_LIMIT,
        id="up-limit-by-pods"),
    row({"maxReplicas": 100}, ScalingSignals(80), serving(10), 20, QUEUE,
        Reason.SCALE_UP_LIMIT, id="up-limit-by-percent"),
    row({}, ScalingSignals(80), serving(5), 6, QUEUE, Reason.SCALE_UP_LIMIT,
        history=ran_before(events=[(10, 2, 5)]), id="up-limit-from-period-start"),
    row({}, ScalingSignals(80), serving(5), 10, QUEUE, Reason.SCALE_UP_LIMIT,
        history=ran_before(events=[(15, 2, 5)]), id="up-limit-period-over"),
    # A scale event of this very instant (a second pass in the same tick) counts: 2 -> 6
    # just now used the period up.
    row({}, ScalingSignals(80), serving(6), 6, QUEUE, Reason.SCALE_UP_LIMIT,
        history=ran_before(events=[(0, 2, 6)]), id="up-limit-counts-an-event-this-instant"),
    # A period that began at 0 pods (the bounds then raised them to 2) allows 0 + 4.
    row({"minReplicas": 2}, ScalingSignals(80), serving(2), 4, QUEUE, Reason.SCALE_UP_LIMIT,
        history=ran_before(events=[(10, 0, 2)]), id="up-limit-from-zero"),
    # minReplicas raised 2 -> 10 a moment ago: the period's allowance (from 2: at most 6) is
    # spent, and the limit holds the count, never lowers it towards 6.
    row({}, ScalingSignals(80), serving(10), 10, QUEUE, Reason.SCALE_UP_LIMIT,
        history=ran_before(events=[(10, 2, 10)]), id="up-limit-used-up-holds"),
    # The percent of whole pods, exactly: 10 % of 50 is 5 (float64's 50 x 1.1 is
    # 55.00000000000001, which would round up to 56); 6 % of 20 is 1.2, a pod and a part
    # of one, which rounds up to 2.
    row({"scaleUpMaxPercent": 10, "scaleUpMaxPods": 1, "maxReplicas": 100},
        ScalingSignals(80), serving(50), 55, QUEUE, Reason.SCALE_UP_LIMIT,
        id="up-limit-percent-exact"),
    row({"scaleUpMaxPercent": 6, "scaleUpMaxPods": 1, "maxReplicas": 100},
        ScalingSignals(80), serving(20), 22, QUEUE, Reason.SCALE_UP_LIMIT,
        id="up-limit-percent-part-of-a-pod-rounds-up"),
    # Down: -50 % per 60 s, from the count at the period's start.
    row({"scaleDownStabilizationSeconds": 0}, ScalingSignals(0.5), serving(8), 4, QUEUE,
        Reason.SCALE_DOWN_LIMIT, id="down-limit"),
    row({"scaleDownStabilizationSeconds": 0}, ScalingSignals(0.5), serving(6), 4, QUEUE,
        Reason.SCALE_DOWN_LIMIT, history=ran_before(events=[(30, 8, 6)]),
        id="down-limit-from-period-start"),
    row({"scaleDownStabilizationSeconds": 0}, ScalingSignals(0.5), serving(4), 4, QUEUE,
        Reason.SCALE_DOWN_LIMIT, history=ran_before(events=[(30, 8, 4)]),
        id="down-limit-used-up-holds"),
    # Wanting exactly what the limit allows is not limited: 8 -> 4 at -50 %.
    row({"scaleDownStabilizationSeconds": 0}, ScalingSignals(4), serving(8), 4, QUEUE, WITHIN,
        id="down-to-exactly-the-limit-not-limited"),
    # The percent of whole pods, exactly: -80 % of 10 leaves 2 (float64's 10 x (1 - 0.8) is
    # 1.9999999999999996, which would truncate to 1); -90 % of 120 leaves 12.
    row({"scaleDownStabilizationSeconds": 0, "scaleDownMaxPercent": 80}, ScalingSignals(0.5),
        serving(10), 2, QUEUE, Reason.SCALE_DOWN_LIMIT, id="down-limit-percent-exact"),
    row({"scaleDownStabilizationSeconds": 0, "scaleDownMaxPercent": 90, "maxReplicas": 200},
        ScalingSignals(0.5), serving(120), 12, QUEUE, Reason.SCALE_DOWN_LIMIT,
        id="down-limit-percent-exact-large"),
    # The bounds, last.
    row({"minReplicas": 3, **FREE_DOWN}, ScalingSignals(1), serving(6), 3, QUEUE,
        Reason.TOO_FEW_REPLICAS, id="min-replicas"),
    row({"maxReplicas": 5}, ScalingSignals(80), serving(4), 5, QUEUE,
        Reason.TOO_MANY_REPLICAS, id="max-replicas"),
    # Wanting exactly maxReplicas is within range.
    row({"maxReplicas": 6}, ScalingSignals(23.5), serving(2), 6, QUEUE, WITHIN,
        id="exactly-max-replicas-within-range"),
    row({"maxReplicas": 5}, ScalingSignals(None, error="down"), serving(7), 5, NONE,
        Reason.TOO_MANY_REPLICAS, id="bounds-apply-without-metrics"),
    row({"minReplicas": 2}, ScalingSignals(None), serving(0, ready=0), 2, NONE,
        Reason.TOO_FEW_REPLICAS, id="from-zero-to-min"),
]  # fmt: skip


def unavailable(signals: ScalingSignals, pods: ServingPods) -> bool:
    """The brief's definition of missing data: an error, no ready pod, or no signal."""
    unread = (
        signals.requests_in_progress_per_replica is None and signals.gpu_memory_used_ratio is None
    )
    return bool(signals.error) or pods.ready == 0 or unread


@pytest.mark.parametrize(
    ("fields", "history", "signals", "pods", "replicas", "signal", "limited"), ROWS
)
def test_the_recommendation_table(fields, history, signals, pods, replicas, signal, limited):
    result = recommend(spec_of(**fields), history, signals, pods, NOW)
    assert (result.replicas, result.signal, result.limited[1]) == (replicas, signal, limited), (
        result.active,
        result.limited,
    )
    status = (
        ConditionStatus.TRUE
        if result.limited[1] != Reason.DESIRED_WITHIN_RANGE
        else ConditionStatus.FALSE
    )
    assert result.limited[0] == status
    if unavailable(signals, pods):
        assert result.active[:2] == (ConditionStatus.FALSE, Reason.METRICS_UNAVAILABLE)
    else:
        assert result.active[:2] == (ConditionStatus.TRUE, Reason.VALID_METRIC_FOUND)


def test_messages_give_each_signal_against_its_target():
    spec = spec_of(gpuMemoryHighWatermark=0.9)
    result = recommend(spec, ran_before(), ScalingSignals(23.5, 0.5), serving(2), NOW)
    assert result.active[2] == (
        "Requests in progress per replica 23.5 (target 8) calls for 6 pods; "
        "GPU memory used 0.5 is within its high watermark 0.9."
    )
    limited = recommend(spec, ran_before(), ScalingSignals(80), serving(2), NOW).limited
    assert limited[2] == (
        "20 pods wanted; scaleUpMaxPercent 100 % or scaleUpMaxPods 4 per "
        "scaleUpPeriodSeconds 15 allow 6."
    )


def test_a_metrics_error_is_named_in_the_condition():
    signals = ScalingSignals(error="Prometheus at http://prom:9090: timed out after 5 s")
    active = recommend(spec_of(), ran_before(), signals, serving(3), NOW).active
    assert active[0] == ConditionStatus.FALSE
    assert "timed out after 5 s" in active[2] and "held at 3 pods" in active[2]


@pytest.mark.parametrize(
    ("fields", "signals", "pods"),
    [
        pytest.param({}, ScalingSignals(8.2), serving(4), id="at-target"),
        pytest.param({}, ScalingSignals(2), serving(6), id="down-stabilized"),
        pytest.param({}, ScalingSignals(error="no route to host"), serving(3), id="no-metrics"),
        pytest.param({"gpuMemoryHighWatermark": 0.8}, ScalingSignals(1, 0.85), serving(4),
                     id="gpu-floor"),
    ],
)  # fmt: skip
def test_a_pass_that_finds_nothing_new_gives_the_same_recommendation(fields, signals, pods):
    spec = spec_of(**fields)
    first = recommend(spec, ran_before((120, 6)), signals, pods, NOW)
    assert first.replicas == pods.desired  # a steady state: nothing to act on
    later = recommend(spec, first.history, signals, pods, NOW + timedelta(seconds=15))
    same = ("replicas", "desired", "signal", "active", "limited")
    assert [getattr(later, f) for f in same] == [getattr(first, f) for f in same]


def test_the_history_records_the_pass_and_its_scale_event():
    result = recommend(spec_of(), ran_before((100, 2)), ScalingSignals(23.5), serving(2), NOW)
    assert result.history.recommendations[-1] == (NOW, 6)
    assert result.history.events == (ScaleEvent(NOW, 2, 6),)
    steady = recommend(spec_of(), result.history, ScalingSignals(8), serving(6), NOW)
    assert steady.history.events == result.history.events  # no change, no event


def test_the_count_follows_the_signals_again_once_they_return():
    spec, history, pods = spec_of(), ran_before(), serving(2)
    for second in range(0, 600, 15):
        outage = ScalingSignals(error="connection refused")
        result = recommend(spec, history, outage, pods, NOW + timedelta(seconds=second))
        assert result.replicas == 2
        history = result.history
    back = recommend(spec, history, ScalingSignals(23.5), pods, NOW + timedelta(seconds=600))
    assert back.replicas == 6 and back.active[1] == Reason.VALID_METRIC_FOUND


MESSAGES = [
    # Within range: the figure against its target, and the count against both bounds.
    ({}, ran_before(), ScalingSignals(8.2), serving(4),
     "Requests in progress per replica 8.2 (target 8) calls for 4 pods.",
     "4 pods, within minReplicas 1 and maxReplicas 20."),
    # Each bound names the count wanted and the bound.
    ({"minReplicas": 3, **FREE_DOWN}, ran_before(), ScalingSignals(1), serving(6),
     "Requests in progress per replica 1 (target 8) calls for 1 pod.",
     "1 pod wanted; minReplicas is 3."),
    ({"maxReplicas": 5}, ran_before(), ScalingSignals(80), serving(4),
     "Requests in progress per replica 80 (target 8) calls for 40 pods.",
     "8 pods wanted; maxReplicas is 5."),
    # Each window names the recommendation, its setting and the extremum it kept.
    ({"scaleUpStabilizationSeconds": 60}, ran_before((30, 3)), ScalingSignals(24), serving(2),
     "Requests in progress per replica 24 (target 8) calls for 6 pods.",
     "6 pods recommended; scaling up only to the lowest recommendation over "
     "scaleUpStabilizationSeconds 60: 3."),
    ({"scaleDownMaxPercent": 100}, ran_before((299, 5), (100, 4)), ScalingSignals(2),
     serving(6),
     "Requests in progress per replica 2 (target 8) calls for 2 pods.",
     "2 pods recommended; scaling down only to the highest recommendation over "
     "scaleDownStabilizationSeconds 300: 5."),
    # The down limit names its settings and what they allow.
    ({"scaleDownStabilizationSeconds": 0}, ran_before(), ScalingSignals(0.5), serving(8),
     "Requests in progress per replica 0.5 (target 8) calls for 1 pod.",
     "1 pod wanted; scaleDownMaxPercent 50 % per scaleDownPeriodSeconds 60 allows 4."),
    # GPU memory: what it keeps, and what the requests in progress alone would do.
    ({"gpuMemoryHighWatermark": 0.8, **FREE_DOWN}, ran_before(), ScalingSignals(1, 0.85),
     serving(4),
     "Requests in progress per replica 1 (target 8) calls for 1 pod; GPU memory used 0.85 (high "
     "watermark 0.8) keeps at least 4 pods.",
     "GPU memory used 0.85 (high watermark 0.8) keeps at least 4 pods; the requests in progress "
     "alone call for 1 pod."),
    ({"gpuMemoryHighWatermark": 0.8}, ran_before(), ScalingSignals(None, 0.95), serving(4),
     "Requests in progress per replica could not be read; GPU memory used 0.95 (high "
     "watermark 0.8) calls for at least 5 pods.",
     "5 pods, within minReplicas 1 and maxReplicas 20."),
    # Missing data: why, and what was done with the count.
    ({"maxReplicas": 5}, ran_before(), ScalingSignals(error="connection refused"), serving(7),
     "The metrics could not be read: connection refused; the count is only brought within "
     "its bounds, never scaled down on missing data.",
     "7 pods wanted; maxReplicas is 5."),
    ({}, ran_before(), ScalingSignals(0.5), serving(3, ready=0, starting=3),
     "No serving pod is ready to measure (3 starting); the count is held at 3 pods, never "
     "scaled down on missing data.",
     "3 pods, within minReplicas 1 and maxReplicas 20."),
    ({}, ran_before(), ScalingSignals(0.5), serving(3, ready=0, starting=0),
     "No serving pod is ready to measure; the count is held at 3 pods, never scaled down "
     "on missing data.",
     "3 pods, within minReplicas 1 and maxReplicas 20."),
    ({}, ran_before(), ScalingSignals(None, None), serving(6),
     "Neither the requests in progress nor GPU memory could be read from the pods; the count "
     "is held at 6 pods, never scaled down on missing data.",
     "6 pods, within minReplicas 1 and maxReplicas 20."),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "history", "signals", "pods", "active", "limited"), MESSAGES)
def test_each_condition_message_names_its_figures(fields, history, signals, pods, active, limited):
    """What `kubectl describe` shows: each figure the decision turned on, by its name."""
    result = recommend(spec_of(**fields), history, signals, pods, NOW)
    assert (result.active[2], result.limited[2]) == (active, limited)


def test_bringing_the_count_within_its_bounds_without_metrics_is_a_scale_event():
    spec, outage = spec_of(maxReplicas=5), ScalingSignals(error="connection refused")
    brought = recommend(spec, ran_before(), outage, serving(7), NOW)
    assert brought.history.events == (ScaleEvent(NOW, 7, 5),)  # the rate limits count it
    held = recommend(spec, ran_before(), outage, serving(4), NOW)
    assert held.history.events == ()


@pytest.mark.parametrize("aware", [True, False])
def test_a_pass_without_metrics_keeps_the_history_as_it_was(aware):
    """The windows, the limits and a commitment in progress resume where they were once
    the signals return (what a window or a limit can no longer see aside); a commitment
    is kept only while startup awareness is on."""
    history = ScalingHistory(
        recommendations=((ago(100), 8),),
        events=(ScaleEvent(ago(30), 6, 8),),
        committed=8,
        backlog=(ago(15), 200.0),
    )
    spec = spec_of(countStartingPods=aware)
    result = recommend(spec, history, ScalingSignals(error="timed out"), serving(8), NOW)
    if aware:
        assert result.history == history
    else:
        assert result.history == ScalingHistory(history.recommendations, history.events)
