"""`set_condition`: the transition time moves only when a condition's status changes, so
a reconcile that finds nothing new produces an identical status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubeinfer.operator.api.v1alpha1 import ConditionStatus, ConditionType, Reason, set_condition

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_a_new_condition_is_appended_with_now() -> None:
    [ready] = set_condition(
        [], ConditionType.READY, ConditionStatus.FALSE, Reason.NOT_READY, "waiting", 3, T0
    )
    assert (ready.type, ready.status, ready.reason, ready.observed_generation) == (
        "Ready",
        "False",
        "NotReady",
        3,
    )
    assert ready.last_transition_time == T0


def test_same_status_keeps_the_transition_time_but_takes_the_new_message() -> None:
    first = set_condition(
        [], ConditionType.READY, ConditionStatus.FALSE, Reason.NOT_READY, "a", 1, T0
    )
    [again] = set_condition(
        first, ConditionType.READY, ConditionStatus.FALSE, Reason.WAITING_FOR_ENGINE, "b", 2, T1
    )
    assert again.last_transition_time == T0
    assert (again.reason, again.message, again.observed_generation) == ("WaitingForEngine", "b", 2)


def test_a_status_change_moves_the_transition_time_and_keeps_the_order() -> None:
    conditions = set_condition(
        [], ConditionType.ENGINE_READY, ConditionStatus.FALSE, Reason.ENGINE_BUILDING, "", 1, T0
    )
    conditions = set_condition(
        conditions, ConditionType.READY, ConditionStatus.FALSE, Reason.NOT_READY, "", 1, T0
    )
    conditions = set_condition(
        conditions, ConditionType.ENGINE_READY, ConditionStatus.TRUE, Reason.ENGINE_BUILT, "", 1, T1
    )
    assert [c.type for c in conditions] == ["EngineReady", "Ready"]
    assert conditions[0].last_transition_time == T1
    assert conditions[1].last_transition_time == T0


def test_identical_input_gives_an_equal_list() -> None:
    once = set_condition([], ConditionType.READY, ConditionStatus.TRUE, Reason.READY, "", 1, T0)
    twice = set_condition(once, ConditionType.READY, ConditionStatus.TRUE, Reason.READY, "", 1, T1)
    assert once == twice
