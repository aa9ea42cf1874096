"""Scaling to and from zero (operator/scaling/zero.py, through decide_scaling): the idle
window (a request answered, in progress or held starts it over; an unread counter too,
so missing data never takes the last pod), the activator routing as a precondition,
the wakes from zero (a held request, the wake query, a schedule's window) passing the HPA
steps by, the schedule as a floor whatever minReplicas is, and the ScaledToZero condition
and its absence with minReplicas above 0. Cron windows are read in their time zone,
daylight-saving change included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, Reason
from kubeinfer.operator.api.v1alpha1.wake_on import WakeSchedule
from kubeinfer.operator.scaling import zero
from kubeinfer.operator.state.scaling_inputs import (
    ScalingHistory,
    ScalingSignals,
    ServingPods,
    WakeSignals,
)
from pydantic import ValidationError

NOW = datetime(2026, 3, 2, 12, tzinfo=UTC)  # a Monday
TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE
WINDOW = 300


def spec_of(**fields) -> AutoscalingSpec:
    base = {"enabled": True, "minReplicas": 0, "maxReplicas": 8}
    return AutoscalingSpec.model_validate({**base, "scaleToZeroAfterSeconds": WINDOW, **fields})


def seen(seconds_ago: float, counter: float | None = 10.0) -> ScalingHistory:
    return ScalingHistory(activity=(NOW - timedelta(seconds=seconds_ago), counter))


def pods(desired: int, ready: int | None = None) -> ServingPods:
    return ServingPods(desired=desired, ready=desired if ready is None else ready, starting=0)


QUIET = ScalingSignals(requests_in_progress_per_replica=0.0)
ROUTED = WakeSignals(requests_answered=10.0, held_requests=0, activator_routing=True)


def test_idle_for_the_window_with_the_activator_routing_goes_to_zero():
    verdict = zero.decide(spec_of(), seen(WINDOW), QUIET, ROUTED, pods(1), NOW)
    assert verdict.replicas == 0
    assert verdict.signal == zero.IDLE
    assert verdict.condition is not None and verdict.condition[:2] == (TRUE, Reason.IDLE)


@pytest.mark.parametrize(
    ("signals", "wake", "why"),
    [
        (QUIET, WakeSignals(requests_answered=11.0, activator_routing=True), "counter moved"),
        (QUIET, WakeSignals(requests_answered=0.0, activator_routing=True), "a pod restarted"),
        (
            ScalingSignals(requests_in_progress_per_replica=0.5),
            ROUTED,
            "a request in progress",
        ),
        (
            QUIET,
            WakeSignals(requests_answered=10.0, held_requests=1, activator_routing=True),
            "held",
        ),
        (QUIET, WakeSignals(requests_answered=None, activator_routing=True), "counter unread"),
        (ScalingSignals(error="Prometheus down"), ROUTED, "signals unread"),
    ],
)
def test_a_request_seen_or_missing_data_starts_the_window_over(signals, wake, why):
    verdict = zero.decide(spec_of(), seen(WINDOW + 60), signals, wake, pods(1), NOW)
    assert verdict.replicas is None, why
    assert verdict.activity is not None and verdict.activity[0] == NOW, why
    assert verdict.condition is not None and verdict.condition[1] == Reason.RECENTLY_ACTIVE


def test_a_pod_still_starting_keeps_the_window_from_running():
    """The pod a wake started, not ready yet and nothing held any more (the activator's
    read failed, or its requests went to the pod): not idle."""
    starting = ServingPods(desired=1, ready=0, starting=1)
    wake = WakeSignals(requests_answered=None, held_requests=None, activator_routing=True)
    verdict = zero.decide(spec_of(), seen(WINDOW * 3), QUIET, wake, starting, NOW)
    assert verdict.replicas is None
    assert verdict.activity is not None and verdict.activity[0] == NOW


def test_within_the_window_the_pods_stay_and_the_time_of_the_last_request_is_kept():
    verdict = zero.decide(spec_of(), seen(WINDOW - 1), QUIET, ROUTED, pods(2), NOW)
    assert verdict.replicas is None
    assert verdict.floor == 1  # the HPA steps never take the last pod
    assert verdict.activity == (NOW - timedelta(seconds=WINDOW - 1), 10.0)


def test_a_fresh_operator_starts_the_window_at_its_first_pass():
    verdict = zero.decide(spec_of(), ScalingHistory(), QUIET, ROUTED, pods(1), NOW)
    assert verdict.replicas is None
    assert verdict.activity == (NOW, 10.0)


def test_without_the_activator_routing_the_last_pod_is_kept_and_the_condition_says_why():
    wake = WakeSignals(requests_answered=10.0, activator_message="no activator pod is ready")
    verdict = zero.decide(spec_of(), seen(WINDOW * 3), QUIET, wake, pods(1), NOW)
    assert verdict.replicas is None
    assert verdict.condition is not None
    assert verdict.condition[:2] == (FALSE, Reason.ACTIVATOR_NOT_ROUTING)
    assert "no activator pod is ready" in verdict.condition[2]


def test_at_zero_a_held_request_wakes_one_pod_at_once():
    wake = WakeSignals(held_requests=3, activator_routing=True)
    verdict = zero.decide(
        spec_of(), seen(WINDOW * 10), ScalingSignals(error="no pod"), wake, pods(0), NOW
    )
    assert (verdict.replicas, verdict.signal) == (1, zero.HELD_REQUESTS)
    assert verdict.condition is not None and verdict.condition[:2] == (FALSE, Reason.REQUESTS_HELD)
    assert "3 requests held" in verdict.condition[2]


def test_at_zero_with_nothing_waiting_the_count_stays_zero_and_reads_nothing_as_load():
    wake = WakeSignals(held_requests=0, activator_routing=True)
    verdict = zero.decide(
        spec_of(), seen(WINDOW * 10), ScalingSignals(error="no pod"), wake, pods(0), NOW
    )
    assert verdict.replicas == 0
    assert verdict.condition is not None and verdict.condition[:2] == (TRUE, Reason.IDLE)


def test_at_zero_the_wake_query_above_its_threshold_wakes_and_at_it_does_not():
    spec = spec_of(wakeOn={"prometheus": {"query": "sum(jobs_waiting)", "threshold": 5}})
    above = zero.decide(spec, seen(999), QUIET, WakeSignals(wake_query_value=6.0), pods(0), NOW)
    at = zero.decide(spec, seen(999), QUIET, WakeSignals(wake_query_value=5.0), pods(0), NOW)
    assert (above.replicas, above.signal) == (1, zero.WAKE_QUERY)
    assert at.replicas == 0


def test_a_wake_query_that_fails_wakes_nothing_and_is_said():
    spec = spec_of(wakeOn={"prometheus": {"query": "sum(jobs_waiting)"}})
    wake = WakeSignals(wake_query_error="Prometheus answered 503")
    verdict = zero.decide(spec, seen(999), QUIET, wake, pods(0), NOW)
    assert verdict.replicas == 0
    assert verdict.condition is not None and "Prometheus answered 503" in verdict.condition[2]


WEEKDAYS_9_TO_5 = {"start": "0 9 * * 1-5", "durationSeconds": 8 * 3600, "replicas": 3}


def test_an_open_window_wakes_to_its_replicas_and_keeps_them_as_a_floor():
    spec = spec_of(wakeOn={"schedules": [WEEKDAYS_9_TO_5]})
    woken = zero.decide(spec, seen(999), QUIET, WakeSignals(), pods(0), NOW)
    kept = zero.decide(spec, seen(WINDOW * 10), QUIET, ROUTED, pods(3), NOW)
    assert (woken.replicas, woken.signal) == (3, zero.SCHEDULE)
    assert kept.replicas is None and kept.floor == 3
    assert kept.condition is not None and kept.condition[1] == Reason.SCHEDULE_OPEN


def test_a_schedule_is_a_floor_with_min_replicas_above_zero_and_no_condition_is_shown():
    spec = spec_of(minReplicas=1, wakeOn={"schedules": [WEEKDAYS_9_TO_5]})
    verdict = zero.decide(spec, ScalingHistory(), QUIET, WakeSignals(), pods(1), NOW)
    assert (verdict.replicas, verdict.floor, verdict.condition) == (None, 3, None)
    sunday = zero.decide(
        spec, ScalingHistory(), QUIET, WakeSignals(), pods(1), NOW - timedelta(days=1)
    )
    assert sunday.floor == 1


@pytest.mark.parametrize(
    ("utc", "open_"),
    [
        (datetime(2026, 3, 2, 8, 59, 59, tzinfo=UTC), False),
        (datetime(2026, 3, 2, 9, 0, 0, tzinfo=UTC), True),
        (datetime(2026, 3, 2, 16, 59, 59, tzinfo=UTC), True),
        (datetime(2026, 3, 2, 17, 0, 0, tzinfo=UTC), False),
        (datetime(2026, 3, 7, 10, 0, 0, tzinfo=UTC), False),  # Saturday
    ],
)
def test_window_edges(utc, open_):
    assert zero.window_open(WakeSchedule.model_validate(WEEKDAYS_9_TO_5), utc) is open_


def test_a_window_follows_its_time_zone_across_daylight_saving():
    # 08:00 in Paris is 07:00 UTC in winter and 06:00 UTC in summer (from 29 March 2026).
    paris = WakeSchedule.model_validate(
        {"start": "0 8 * * *", "durationSeconds": 3600, "timeZone": "Europe/Paris"}
    )
    assert zero.window_open(paris, datetime(2026, 3, 2, 7, 30, tzinfo=UTC))
    assert not zero.window_open(paris, datetime(2026, 3, 2, 6, 30, tzinfo=UTC))
    assert zero.window_open(paris, datetime(2026, 4, 2, 6, 30, tzinfo=UTC))
    assert not zero.window_open(paris, datetime(2026, 4, 2, 7, 30, tzinfo=UTC))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"wakeOn": {"schedules": [{"start": "61 * * * *", "durationSeconds": 60}]}}, "cron"),
        ({"wakeOn": {"schedules": [{"start": "at nine", "durationSeconds": 60}]}}, "pattern"),
        (
            {
                "wakeOn": {
                    "schedules": [
                        {"start": "0 9 * * *", "durationSeconds": 60, "timeZone": "Mars/Olympus"}
                    ]
                }
            },
            "time zone",
        ),
        ({"minReplicas": 1, "wakeOn": {"prometheus": {"query": "up"}}}, "needs minReplicas 0"),
        ({"wakeOn": {"schedules": [{**WEEKDAYS_9_TO_5, "replicas": 9}]}}, "at most maxReplicas"),
    ],
)
def test_a_wake_that_cannot_work_is_refused_with_the_manifest(fields, says):
    with pytest.raises(ValidationError, match=says):
        spec_of(**fields)
