"""The serving pods as the autoscaler reads them from the API (`serving_pods`), table-tested:
which pods count as ready, starting or gone, and how startup time is measured."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.state.serving_pods import RECENT_PODS, serving_pods, startup_seconds

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def stamp(seconds_before_now: float) -> str:
    return (NOW - timedelta(seconds=seconds_before_now)).isoformat().replace("+00:00", "Z")


def pod(
    created: float | None,
    ready: float | None = None,
    *,
    ready_status: str = "True",
    terminating: bool = False,
    other_conditions: bool = True,
) -> dict:
    """A pod created `created` seconds ago, Ready since `ready` seconds ago (None: no Ready
    condition), with the conditions the kubelet writes before Ready."""
    metadata: dict = {"name": "p"}
    if created is not None:
        metadata["creationTimestamp"] = stamp(created)
    if terminating:
        metadata["deletionTimestamp"] = stamp(0)
    conditions = []
    if other_conditions:
        conditions.append(
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(1)}
        )
    if ready is not None:
        conditions.append(
            {"type": "Ready", "status": ready_status, "lastTransitionTime": stamp(ready)}
        )
    return {"metadata": metadata, "status": {"conditions": conditions}}


def deployment(replicas) -> dict:
    return {"spec": {"replicas": replicas}}


def test_ready_starting_and_terminating_pods_are_told_apart():
    pods = [
        pod(100, 70),  # ready after 30 s
        pod(50, 10),  # ready after 40 s
        pod(20),  # starting: no Ready condition yet
        pod(30, 5, ready_status="False"),  # starting: Ready is False
        pod(200, 150, terminating=True),  # going: neither
        pod(25, terminating=True),  # going, never ready: neither
    ]
    seen = serving_pods(pods, deployment(5), NOW)
    assert (seen.desired, seen.ready, seen.starting) == (5, 2, 2)
    assert seen.oldest_starting_age_seconds == pytest.approx(30.0)
    assert seen.startup_seconds == pytest.approx(35.0)  # the median of 30 and 40


def test_without_a_deployment_or_its_replicas_the_live_pods_are_the_count():
    pods = [pod(10, 5), pod(10), pod(10, terminating=True)]
    assert serving_pods(pods, None, NOW).desired == 2
    assert serving_pods(pods, {}, NOW).desired == 2
    assert serving_pods(pods, {"spec": {}}, NOW).desired == 2
    assert serving_pods(pods, deployment("3"), NOW).desired == 2  # not an int: not trusted
    assert serving_pods(pods, deployment(0), NOW).desired == 0


def test_no_pods_no_figures():
    seen = serving_pods([], deployment(1), NOW)
    assert (seen.ready, seen.starting) == (0, 0)
    assert seen.oldest_starting_age_seconds is None
    assert seen.startup_seconds is None


def test_a_starting_pod_without_a_creation_time_counts_but_has_no_age():
    seen = serving_pods([pod(None), pod(40)], deployment(2), NOW)
    assert seen.starting == 2
    assert seen.oldest_starting_age_seconds == pytest.approx(40.0)
    assert serving_pods([pod(None)], deployment(1), NOW).oldest_starting_age_seconds is None


def test_pods_that_never_said_ready_are_not_measured():
    pods = [pod(60, 20), pod(30), pod(30, 10, ready_status="Unknown"), pod(None, 5)]
    assert startup_seconds(pods) == pytest.approx(40.0)
    assert startup_seconds([pod(30), pod(None, 5)]) is None


def test_a_ready_time_before_creation_or_unreadable_is_not_measured():
    broken = pod(10, 20)  # Ready 20 s ago, created 10 s ago: clock skew, not a startup
    unreadable = pod(10, 5)
    unreadable["status"]["conditions"][-1]["lastTransitionTime"] = "yesterday"
    assert startup_seconds([broken, unreadable]) is None
    assert startup_seconds([broken, unreadable, pod(100, 90)]) == pytest.approx(10.0)
    assert startup_seconds([pod(10, 10)]) == 0.0  # ready the instant it was created


def test_the_ready_condition_is_found_among_others_and_decides_alone():
    lone = pod(50, 20, other_conditions=False)
    assert startup_seconds([lone]) == pytest.approx(30.0)
    # a pod whose status or conditions are missing is starting, not ready
    bare = {"metadata": {"creationTimestamp": stamp(5)}}
    empty = {"metadata": {"creationTimestamp": stamp(6)}, "status": {"conditions": None}}
    seen = serving_pods([bare, empty, lone], deployment(3), NOW)
    assert (seen.ready, seen.starting) == (1, 2)
    assert seen.oldest_starting_age_seconds == pytest.approx(6.0)


def test_startup_is_the_median_of_the_most_recently_created_ready_pods():
    # RECENT_PODS recent pods took 10 s each; older ones took 1000 s and are left out
    recent = [pod(100 + i, 90 + i) for i in range(RECENT_PODS)]
    old = [pod(10_000 + i, 9_000 + i) for i in range(RECENT_PODS - 1)]
    assert startup_seconds(old + recent) == pytest.approx(10.0)
    assert startup_seconds(recent + old) == pytest.approx(10.0)  # order given does not matter
    # one more slow pod than fast ones among the recent: the median moves to the slow ones
    mixed = [pod(100 + i, 90 + i) for i in range(RECENT_PODS // 2 - 1)] + [
        pod(200 + i, 100 + i) for i in range(RECENT_PODS // 2 + 1)
    ]
    assert startup_seconds(mixed) == pytest.approx(100.0)
    assert isinstance(startup_seconds(recent), float)


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert startup_seconds([pod(100, 90), pod(100, 70)]) == pytest.approx(20.0)
