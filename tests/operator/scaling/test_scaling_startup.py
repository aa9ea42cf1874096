"""Startup awareness as a table: a commitment holds recommendations above it while its
pods start (and steps towards it go on, and lower ones pass), a pod starting past the
margin (or past the assumed startup before any was measured) is not counted on, pods set
and not created yet are, `countStartingPods: false` is the plain HPA; then the draining
phase: the first reading after the pods are ready is held, a backlog falling fast enough
to be gone within a startup is held, one that rises or falls too slowly is not, and one
at target ends the commitment. Each row also says what the history remembers after."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.scaling.recommend import recommend
from kubeinfer.operator.scaling.startup import starting
from kubeinfer.operator.state.scaling_inputs import ScalingHistory, ScalingSignals, ServingPods

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
LONG_AGO = ((NOW - timedelta(hours=1), 1),)
STARTING, WITHIN = Reason.PODS_STARTING, Reason.DESIRED_WITHIN_RANGE


def committed(count: int, backlog: tuple[float, float] | None = None) -> ScalingHistory:
    """A scale-up to `count` in progress; `backlog`: (seconds ago, requests) read then."""
    reading = None if backlog is None else (NOW - timedelta(seconds=backlog[0]), backlog[1])
    return ScalingHistory(recommendations=LONG_AGO, committed=count, backlog=reading)


def pods(desired, ready, starting=0, age=None, startup=60.0) -> ServingPods:
    return ServingPods(desired, ready, starting, age, startup)


def row(history, depth, serving, replicas, reason, remembered, *, id, **fields):
    return pytest.param(fields, history, depth, serving, replicas, reason, remembered, id=id)


ROWS = [
    # 2 ready at 5x the target call for 10; the scale-up to 6 in progress holds them at 6.
    row(committed(6), 40, pods(6, 2, 4, age=30), 6, STARTING, 6, id="held-above-commitment"),
    # The rate limit deferred part of the commitment: the steps towards it go on.
    row(committed(10), 80, pods(5, 1, 4, age=15), 10, WITHIN, 10, id="steps-towards-it-go-on"),
    row(committed(16), 200, pods(5, 1, 4, age=15), 10, Reason.SCALE_UP_LIMIT, 16,
        id="held-then-rate-limited"),
    # A burst that ends mid-startup may scale down (and that ends the commitment).
    row(committed(6), 1, pods(6, 2, 4, age=30), 1, WITHIN, None, id="lower-passes",
        scaleDownStabilizationSeconds=0, scaleDownMaxPercent=100),
    # Believed up to twice the measured startup, not after: the plain HPA again.
    row(committed(6), 40, pods(6, 2, 4, age=120), 6, STARTING, 6, id="believed-at-margin"),
    row(committed(6), 40, pods(6, 2, 4, age=121), 10, WITHIN, 10, id="stuck-pod-not-counted"),
    # One stuck pod is enough (5 ready at 5x the target call for 25: 12 allowed now).
    row(committed(6), 40, pods(6, 5, 1, age=121), 12, Reason.SCALE_UP_LIMIT, 20,
        id="one-stuck-pod-not-counted"),
    # Before any startup was measured, 300 s is assumed (600 s with the margin).
    row(committed(6), 40, pods(6, 2, 4, age=600, startup=None), 6, STARTING, 6,
        id="unmeasured-believed"),
    row(committed(6), 40, pods(6, 2, 4, age=601, startup=None), 10, WITHIN, 10,
        id="unmeasured-not-believed-after"),
    # A startup of 0 s is no measurement (the same second): 300 s assumed, the pod believed.
    row(committed(6), 40, pods(6, 2, 4, age=30, startup=0), 6, STARTING, 6,
        id="zero-startup-taken-as-unmeasured"),
    # A measured startup is believed however short: 1 s measured, 3 s is past belief.
    row(committed(6), 40, pods(6, 2, 4, age=3, startup=1), 10, WITHIN, 10,
        id="short-startup-measured"),
    # Pods set and not created yet are on their way too.
    row(committed(6), 40, pods(6, 2, 0), 6, STARTING, 6, id="not-created-yet-counted"),
    # The committed count is ready (more pods starting beyond it): the starting phase is
    # over, and with the queue at target so is the commitment.
    row(committed(6), 8, pods(8, 6, 2, age=30), 8, WITHIN, None,
        id="committed-count-ready-ends-starting"),
    # Without countStartingPods, the plain HPA: 10, and nothing remembered.
    row(committed(6), 40, pods(6, 2, 4, age=30), 10, WITHIN, None, id="awareness-off",
        countStartingPods=False),
    # Ready: the first reading is held (the pods may have arrived just before the pass).
    row(committed(6), 80, pods(6, 6), 6, STARTING, 6, id="first-reading-after-ready-held"),
    # 9 is beyond 10 % of the target 8 (it calls for 7): a backlog, read once more.
    row(committed(6), 9, pods(6, 6), 6, STARTING, 6, id="first-reading-beyond-tolerance-held"),
    # At the tolerance exactly (12 = 8 x 1.5) the backlog is gone: the commitment is over.
    row(committed(6), 12, pods(6, 6), 6, WITHIN, None, id="backlog-at-tolerance-ends-it",
        tolerance=0.5),
    # 600 -> 480 requests in 15 s: at target (52.8) within 54 s, under a 60 s startup.
    row(committed(6, (15, 600)), 80, pods(6, 6), 6, STARTING, 6, id="backlog-draining-held"),
    # 500 -> 480: about 320 s to drain; a pod started now would still find it.
    row(committed(6, (15, 500)), 80, pods(6, 6), 12, Reason.SCALE_UP_LIMIT, 20,
        id="backlog-draining-slowly-not-held"),
    row(committed(6, (15, 400)), 80, pods(6, 6), 12, Reason.SCALE_UP_LIMIT, 20,
        id="backlog-rising-not-held"),
    row(committed(6, (15, 480)), 80, pods(6, 6), 12, Reason.SCALE_UP_LIMIT, 20,
        id="backlog-flat-not-held"),
    # 500 -> 480 in 1 s (passes sooner on events): at target within 22 s, held.
    row(committed(6, (1, 500)), 80, pods(6, 6), 6, STARTING, 6,
        id="backlog-readings-a-second-apart-held"),
    # One pod, 11.5 -> 10.5 requests in 15 s: 1.7 over target (8.8), gone in 26 s. Held:
    # a fall of one request is a fall.
    row(committed(1, (15, 11.5)), 10.5, pods(1, 1), 1, STARTING, 1,
        id="small-backlog-falling-by-one-held"),
    # 192 -> 168 in 15 s, 96 over the target (72 = 8 x 1.5 x 6): gone in exactly 60 s, the
    # startup: within it, held.
    row(committed(6, (15, 192)), 28, pods(6, 6), 6, STARTING, 6,
        id="backlog-gone-exactly-within-a-startup-held", tolerance=0.5),
    # The requests in progress not read (GPU memory read, within tolerance of its watermark): the
    # drain cannot be followed, the commitment is over and GPU memory keeps the count.
    row(committed(6), ScalingSignals(None, 0.95), pods(6, 6), 6, WITHIN, None,
        id="queue-unread-ends-drain"),
    # Back at target: the commitment is over.
    row(committed(6, (15, 480)), 8.5, pods(6, 6), 6, WITHIN, None, id="backlog-gone-ends-it"),
    # All pods set are ready though fewer than committed: the drain phase, first reading.
    row(committed(16), 80, pods(10, 10), 16, STARTING, 16, id="all-set-ready-drain-phase"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "history", "depth", "serving", "replicas", "reason", "remembered"), ROWS
)
def test_the_startup_table(fields, history, depth, serving, replicas, reason, remembered):
    spec = AutoscalingSpec.model_validate({"enabled": True, "maxReplicas": 20, **fields})
    signals = depth if isinstance(depth, ScalingSignals) else ScalingSignals(depth)
    result = recommend(spec, history, signals, serving, NOW)
    assert (result.replicas, result.limited[1]) == (replicas, reason), result.limited
    assert result.history.committed == remembered


@pytest.mark.parametrize(
    ("startup", "words"),
    [
        (60.0, "startup measured 60 s"),
        (1.0, "startup measured 1 s"),
        (None, "startup not measured yet, 300 s assumed"),
        (0.0, "startup not measured yet, 300 s assumed"),
    ],
)
def test_the_hold_says_what_is_on_the_way_and_what_was_measured(startup, words):
    spec = AutoscalingSpec(enabled=True, max_replicas=20)
    serving = pods(6, 2, 4, age=1, startup=startup)
    result = recommend(spec, committed(6), ScalingSignals(40), serving, NOW)
    assert result.desired == 10  # what the signals call for, before the hold
    assert result.limited[2] == (
        f"The signals call for 10 pods; held at 6 pods while 4 of them are on the way "
        f"(4 starting, {words}): the queue that builds meanwhile is not new demand."
    )


@pytest.mark.parametrize(
    ("commitment", "serving", "on_the_way"),
    [
        pytest.param(None, pods(6, 2, 4), False, id="no-commitment"),
        pytest.param(6, pods(6, 2, 4), True, id="pods-starting"),
        pytest.param(6, pods(6, 2, 0), True, id="set-not-created-yet"),
        pytest.param(6, pods(2, 2, 1), True, id="starting-beyond-the-set-count"),
        pytest.param(6, pods(2, 2, 0), False, id="nothing-on-the-way"),
        pytest.param(6, pods(6, 6), False, id="committed-count-ready"),
        pytest.param(6, pods(8, 6, 2), False, id="committed-count-ready-more-starting"),
    ],
)
def test_the_starting_phase_lasts_while_committed_pods_are_on_the_way(
    commitment, serving, on_the_way
):
    assert starting(commitment, serving) is on_the_way


def test_the_draining_phase_remembers_each_reading():
    spec = AutoscalingSpec(enabled=True, max_replicas=20)
    first = recommend(spec, committed(6), ScalingSignals(80), pods(6, 6), NOW)
    assert first.history.backlog == (NOW, 480)
    later = NOW + timedelta(seconds=15)
    second = recommend(spec, first.history, ScalingSignals(60), pods(6, 6), later)
    assert second.replicas == 6 and second.history.backlog == (later, 360)
    assert first.limited[2] == (
        "The signals call for 60 pods; held at 6 pods while the queue that built while they "
        "started is read once more now that they are ready (requests in progress per replica 80; "
        "startup measured 60 s)."
    )
    assert second.limited[2] == (
        "The signals call for 45 pods; held at 6 pods while the queue that built while they "
        "started drains fast enough to be gone before another pod could start (requests in "
        "progress per replica 60, down from 80 at the last pass; startup measured 60 s)."
    )


def test_a_step_towards_the_commitment_while_draining_remembers_the_backlog():
    # 4 of the 6 committed set, all ready, 36 requests (over the 35.2 at target): 5 pods
    # called for, below the commitment, so not held; the reading is kept for the next pass.
    spec = AutoscalingSpec(enabled=True, max_replicas=20)
    result = recommend(spec, committed(6), ScalingSignals(9), pods(4, 4), NOW)
    assert result.replicas == 5
    assert (result.history.committed, result.history.backlog) == (6, (NOW, 36))


def test_a_scale_up_commits_to_the_count_it_heads_for():
    spec = AutoscalingSpec(enabled=True, max_replicas=20)
    history = ScalingHistory(recommendations=LONG_AGO)
    result = recommend(spec, history, ScalingSignals(80), pods(2, 2), NOW)
    # 2 ready at 10x the target call for 20; the rate limit lets 6 be set now.
    assert (result.replicas, result.history.committed) == (6, 20)
    plain = spec.model_copy(update={"count_starting_pods": False})
    assert recommend(plain, history, ScalingSignals(80), pods(2, 2), NOW).history.committed is None
