"""Properties of the autoscaler over whole sequences of passes, whatever the signals, pods
and time steps (hypothesis): the count never leaves [minReplicas, maxReplicas]; missing or
failing metrics never scale down; no direction change inside a stabilization window (no
scale-down within scaleDownStabilizationSeconds of a scale-up, no scale-up within
scaleUpStabilizationSeconds of a scale-down); every step keeps the rate limits, checked
against the count each period started from, rebuilt from the timeline of decisions (not
from the events the recommender kept). Then the history: the pruned record answers every
window as the full record would, and its size stays bounded over a long run."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.scaling import stabilization
from kubeinfer.operator.scaling.recommend import recommend
from kubeinfer.operator.state.scaling_inputs import ScalingHistory, ScalingSignals, ServingPods

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@st.composite
def specs(draw) -> AutoscalingSpec:
    low = draw(st.integers(1, 3))
    return AutoscalingSpec(
        enabled=True,
        min_replicas=low,
        max_replicas=low + draw(st.integers(0, 30)),
        target_requests_in_progress_per_replica=draw(st.sampled_from([1, 8, 32])),
        gpu_memory_high_watermark=draw(st.sampled_from([0.5, 0.9])),
        tolerance=draw(st.sampled_from([0, 0.1])),
        scale_up_stabilization_seconds=draw(st.sampled_from([0, 30, 60])),
        scale_down_stabilization_seconds=draw(st.sampled_from([0, 60, 300])),
        scale_up_max_percent=draw(st.sampled_from([10, 100, 200])),
        scale_up_max_pods=draw(st.sampled_from([1, 4])),
        scale_up_period_seconds=draw(st.sampled_from([15, 60])),
        scale_down_max_percent=draw(st.sampled_from([10, 50, 100])),
        scale_down_period_seconds=draw(st.sampled_from([15, 60])),
        count_starting_pods=draw(st.booleans()),
    )


@dataclass(frozen=True)
class Step:
    seconds: int
    signals: ScalingSignals
    ready_share: float
    starting_age: float
    startup: float | None


@st.composite
def readings(draw) -> ScalingSignals:
    """Mostly requests in progress (with GPU memory or not); the rest split between GPU memory
    alone, nothing, and an error, which the missing-data checks need."""
    kind = draw(st.sampled_from(["queue"] * 6 + ["gpu", "nothing", "error"]))
    gpu = draw(st.none() | st.floats(0, 1)) if kind == "queue" else draw(st.floats(0, 1))
    if kind == "queue":
        return ScalingSignals(draw(st.floats(0, 400)), gpu)
    if kind == "gpu":
        return ScalingSignals(None, gpu)
    if kind == "nothing":
        return ScalingSignals()
    return ScalingSignals(draw(st.none() | st.floats(0, 400)), error="Prometheus: timed out")


steps = st.builds(
    Step,
    # Mostly the operator's pace (a 15 s resync, sooner on events), sometimes longer gaps.
    seconds=st.sampled_from([1, 5, 15, 15, 15, 15, 30, 60, 120, 400]),
    signals=readings(),
    # Mostly every pod ready, sometimes some or all still starting.
    ready_share=st.sampled_from([1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]),
    starting_age=st.floats(0, 900),
    startup=st.none() | st.floats(1, 300),
)


def missing(signals: ScalingSignals, pods: ServingPods) -> bool:
    unread = (
        signals.requests_in_progress_per_replica is None and signals.gpu_memory_used_ratio is None
    )
    return bool(signals.error) or pods.ready == 0 or unread


def count_at(timeline: list[tuple[float, int]], t: float) -> int:
    """The count in effect at `t`: the last decision made at or before it."""
    return [count for when, count in timeline if when <= t][-1]


@settings(max_examples=200, deadline=None)
@given(spec=specs(), start=st.integers(0, 12), sequence=st.lists(steps, min_size=5, max_size=40))
def test_the_count_stays_bounded_steady_and_within_its_rates(spec, start, sequence):
    current = min(spec.max_replicas, spec.min_replicas + start)
    history, t = ScalingHistory(), 0.0
    timeline = [(-math.inf, current)]  # (when decided, count set)
    last_up = last_down = -math.inf
    for step in sequence:
        t += step.seconds
        ready = round(step.ready_share * current)
        pods = ServingPods(
            desired=current,
            ready=ready,
            starting=current - ready,
            oldest_starting_age_seconds=step.starting_age if current > ready else None,
            startup_seconds=step.startup,
        )
        result = recommend(spec, history, step.signals, pods, T0 + timedelta(seconds=t))
        replicas, history = result.replicas, result.history

        assert spec.min_replicas <= replicas <= spec.max_replicas
        if missing(step.signals, pods):
            assert replicas >= current, "scaled down on missing data"
        if replicas > current:
            assert t - last_down >= spec.scale_up_stabilization_seconds, "up inside up window"
            start_count = count_at(timeline, t - spec.scale_up_period_seconds)
            allowed = max(
                math.ceil(start_count * (1 + spec.scale_up_max_percent / 100)),
                start_count + spec.scale_up_max_pods,
            )
            assert replicas <= max(allowed, current), "scale-up past its rate"
            last_up = t
        elif replicas < current:
            assert t - last_up >= spec.scale_down_stabilization_seconds, "down inside window"
            start_count = count_at(timeline, t - spec.scale_down_period_seconds)
            allowed = math.floor(start_count * (1 - spec.scale_down_max_percent / 100))
            assert replicas >= min(allowed, current), "scale-down past its rate"
            last_down = t
        if replicas != current:
            timeline.append((t, replicas))
        current = replicas


@settings(max_examples=200, deadline=None)
@given(
    up=st.sampled_from([0, 15, 60, 300]),
    down=st.sampled_from([0, 15, 60, 300]),
    passes=st.lists(st.tuples(st.integers(1, 90), st.integers(0, 12)), min_size=1, max_size=60),
    current=st.integers(0, 12),
)
def test_the_pruned_record_answers_every_window_as_the_full_one(up, down, passes, current):
    spec = AutoscalingSpec(scale_up_stabilization_seconds=up, scale_down_stabilization_seconds=down)
    full: list[tuple[datetime, int]] = []
    pruned: stabilization.Recommendations = ()
    now = T0
    for seconds, recommended in passes:
        now += timedelta(seconds=seconds)
        expected = stabilization.stabilize(spec, tuple(full), recommended, current, now)
        assert stabilization.stabilize(spec, pruned, recommended, current, now) == expected
        full.append((now, recommended))
        pruned = stabilization.record(spec, pruned, now, recommended)


def test_the_history_stays_bounded_however_long_it_runs():
    spec = AutoscalingSpec(enabled=True, min_replicas=1, max_replicas=50)
    rng = random.Random(9)
    history, current, longest = ScalingHistory(), 1, (0, 0)
    for n in range(5000):  # about 21 hours of 15 s passes
        signals = ScalingSignals(rng.choice([0.5, 4, 8, 12, 30, 90]))
        ready = rng.randint(0, current)
        pods = ServingPods(current, ready, current - ready, 30.0 if current > ready else None, 60)
        result = recommend(spec, history, signals, pods, T0 + timedelta(seconds=15 * n))
        history, current = result.history, result.replicas
        longest = (
            max(longest[0], len(history.recommendations)),
            max(longest[1], len(history.events)),
        )
    # The down window spans 20 passes (plus this one's); the longest period 4 passes.
    assert longest[0] <= 300 // 15 + 1
    assert longest[1] <= 60 // 15
