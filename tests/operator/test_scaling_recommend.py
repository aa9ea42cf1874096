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
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, Reason
from kubeinfer.operator.api.v1alpha1.inference_deployment import AutoscalingSpec
from kubeinfer.operator.scaling.inputs import (
    ScaleEvent,
    ScalingHistory,
    ScalingSignals,
    ServingPods,
)
from kubeinfer.operator.scaling.recommend import recommend

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
BASE = {"enabled": True, "minReplicas": 1, "maxReplicas": 20}
QUEUE, GPU, NONE = "queueDepthPerReplica", "gpuMemoryUsedRatio", "none"


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
    # At or below the watermark GPU memory has no say: the queue's scale-down passes.
    row({"gpuMemoryHighWatermark": 0.8, **FREE_DOWN}, ScalingSignals(1, 0.8), serving(4), 1,
        QUEUE, WITHIN, id="gpu-memory-at-watermark-no-say"),
    # The largest recommendation wins, and names its signal.
    row({"gpuMemoryHighWatermark": 0.8}, ScalingSignals(12, 0.95), serving(4), 6, QUEUE,
        WITHIN, id="largest-wins-queue"),
    row({"gpuMemoryHighWatermark": 0.5}, ScalingSignals(9.5, 0.95), serving(4), 8, GPU,
        WITHIN, id="largest-wins-gpu"),
    # The queue depth unread, GPU memory read: it may add pods, nothing removes one.
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
    # Down: -50 % per 60 s, from the count at the period's start.
    row({"scaleDownStabilizationSeconds": 0}, ScalingSignals(0.5), serving(8), 4, QUEUE,
        Reason.SCALE_DOWN_LIMIT, id="down-limit"),
    row({"scaleDownStabilizationSeconds": 0}, ScalingSignals(0.5), serving(6), 4, QUEUE,
        Reason.SCALE_DOWN_LIMIT, history=ran_before(events=[(30, 8, 6)]),
        id="down-limit-from-period-start"),
    row({"scaleDownStabilizationSeconds": 0}, ScalingSignals(0.5), serving(4), 4, QUEUE,
        Reason.SCALE_DOWN_LIMIT, history=ran_before(events=[(30, 8, 4)]),
        id="down-limit-used-up-holds"),
    # The bounds, last.
    row({"minReplicas": 3, **FREE_DOWN}, ScalingSignals(1), serving(6), 3, QUEUE,
        Reason.TOO_FEW_REPLICAS, id="min-replicas"),
    row({"maxReplicas": 5}, ScalingSignals(80), serving(4), 5, QUEUE,
        Reason.TOO_MANY_REPLICAS, id="max-replicas"),
    row({"maxReplicas": 5}, ScalingSignals(None, error="down"), serving(7), 5, NONE,
        Reason.TOO_MANY_REPLICAS, id="bounds-apply-without-metrics"),
    row({"minReplicas": 2}, ScalingSignals(None), serving(0, ready=0), 2, NONE,
        Reason.TOO_FEW_REPLICAS, id="from-zero-to-min"),
]  # fmt: skip


def unavailable(signals: ScalingSignals, pods: ServingPods) -> bool:
    """The brief's definition of missing data: an error, no ready pod, or no signal."""
    unread = signals.queue_depth_per_replica is None and signals.gpu_memory_used_ratio is None
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
        "Queue depth per replica 23.5 (target 8) calls for 6 pods; "
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
