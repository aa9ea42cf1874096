"""The status's parts as pure functions (`reconcile.status`): conditions set or removed in
one pass, EngineReady from the engine's phase, Available from the roll's progress."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress
from kubeinfer.operator.reconcile.status import availability, engine_ready, set_or_remove
from kubeinfer.operator.state.engine_state import EnginePhase, EngineState, ServingEngine

T0 = datetime(2025, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(minutes=5)
TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE
READY, SLO, SHADOW = ConditionType.READY, ConditionType.SLO_MET, ConditionType.SHADOW_PASSED


def test_a_condition_without_a_value_is_removed_and_the_others_set_in_order():
    before = set_or_remove(
        [], [(READY, (FALSE, Reason.ENGINE_BUILDING, "")), (SLO, (TRUE, "SLOMet", ""))], 1, T0
    )
    after = set_or_remove(
        before,
        [(SHADOW, (TRUE, Reason.SHADOW_PASSED, "passed")), (SLO, None), (READY, None)],
        2,
        LATER,
    )
    assert [c.type for c in after] == [SHADOW]
    assert (after[0].observed_generation, after[0].last_transition_time) == (2, LATER)


def test_an_unchanged_status_keeps_its_transition_time_and_its_place():
    before = set_or_remove(
        [], [(READY, (FALSE, Reason.ENGINE_BUILDING, "")), (SLO, (TRUE, "SLOMet", ""))], 1, T0
    )
    after = set_or_remove(
        before, [(SLO, (TRUE, "SLOMet", "again")), (READY, (TRUE, "Ready", ""))], 2, LATER
    )
    assert [(c.type, c.last_transition_time) for c in after] == [(READY, LATER), (SLO, T0)]
    assert after[1].message == "again"
    assert before[1].message == "", "the list given is not changed"


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (EnginePhase.BUILT, (TRUE, Reason.ENGINE_BUILT, "built.")),
        (EnginePhase.PINNED, (TRUE, Reason.ENGINE_PINNED, "built.")),
        (EnginePhase.BUILDING, (FALSE, Reason.ENGINE_BUILDING, "built. v1 serves.")),
        (EnginePhase.FAILED, (FALSE, Reason.ENGINE_BUILD_FAILED, "built. v1 serves.")),
    ],
)
def test_engine_ready_says_what_keeps_serving_only_while_not_ready(phase, expected):
    engine = EngineState(phase, "key", message="built.")
    assert engine_ready(engine, " v1 serves.") == expected


SERVING = ServingEngine("v1", "sha256:a", "key")


def progress(exists: bool, available: bool) -> RolloutProgress:
    return RolloutProgress(exists, False, available, False, 0, "1 of 2 pods ready")


@pytest.mark.parametrize(
    ("rollout", "serving", "expected"),
    [
        (
            progress(False, False),
            None,
            (FALSE, Reason.WAITING_FOR_ENGINE, "No runtime pods: 1 of 2 pods ready."),
        ),
        (
            progress(False, False),
            SERVING,
            (FALSE, Reason.DEPLOYMENT_UNAVAILABLE, "No runtime pods: 1 of 2 pods ready."),
        ),
        (progress(True, True), SERVING, (TRUE, Reason.DEPLOYMENT_AVAILABLE, "1 of 2 pods ready.")),
        (
            progress(True, False),
            SERVING,
            (FALSE, Reason.DEPLOYMENT_UNAVAILABLE, "1 of 2 pods ready."),
        ),
    ],
)
def test_available_says_whether_anything_serves(rollout, serving, expected):
    assert availability(rollout, serving) == expected
