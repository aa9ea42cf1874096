"""The status's parts as pure functions (`reconcile.status`): conditions set or removed in
one pass, EngineReady from the engine's phase (a fleet's: from every product's), Available
from the rolls' progress."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress
from kubeinfer.operator.reconcile.situation import EngineFacts, Facts, situation_of
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
        (EnginePhase.BUILDING, (FALSE, Reason.ENGINE_BUILDING, "built. Version v1 keeps serving.")),
        (
            EnginePhase.FAILED,
            (FALSE, Reason.ENGINE_BUILD_FAILED, "built. Version v1 keeps serving."),
        ),
    ],
)
def test_engine_ready_says_what_keeps_serving_only_while_not_ready(phase, expected):
    engine = EngineState(
        phase, "key", message="built.", digest=None if phase in NOT_BUILT else "sha256:a"
    )
    facts = one(EngineFacts(engine, SERVING, "v2", None, progress(True, True)))
    assert engine_ready(facts, situation_of(facts)) == expected


def test_engine_ready_on_a_fleet_names_the_products_built_or_says_none_is_eligible():
    built = EngineState(EnginePhase.BUILT, "key", digest="sha256:a", message="built.")
    served = ServingEngine("v2", "sha256:a", "key")
    engines = tuple(
        EngineFacts(built, served, "v2", None, progress(True, True), product=name)
        for name in ("A10G", "L4")
    )
    facts = Facts(engines=engines, version="v2", replicas=2, fleet=True)
    expected = (TRUE, Reason.ENGINE_BUILT, "Engines built for 2 GPU products: A10G, L4.")
    assert engine_ready(facts, situation_of(facts)) == expected
    none = Facts(engines=(), version="v2", replicas=2, fleet=True, no_products="No node.")
    assert engine_ready(none, situation_of(none)) == (FALSE, Reason.NO_GPU_NODES, "No node.")


SERVING = ServingEngine("v1", "sha256:a", "key")
NOT_BUILT = (EnginePhase.BUILDING, EnginePhase.FAILED)


def one(engine: EngineFacts) -> Facts:
    return Facts(engines=(engine,), version=engine.version, replicas=2)


def progress(exists: bool, available: bool) -> RolloutProgress:
    return RolloutProgress(exists, False, available, False, 0, "1 of 2 pods ready")


BUILT = EngineState(EnginePhase.BUILT, "key", digest="sha256:a")


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
    assert availability(one(EngineFacts(BUILT, serving, "v1", None, rollout))) == expected


def test_available_on_a_fleet_says_whether_any_product_serves():
    def product(name: str, rollout: RolloutProgress) -> EngineFacts:
        return EngineFacts(BUILT, SERVING, "v1", None, rollout, product=name)

    some = Facts(
        (product("A", progress(True, False)), product("B", progress(True, True))),
        "v1",
        2,
        fleet=True,
    )
    assert availability(some) == (
        TRUE,
        Reason.DEPLOYMENT_AVAILABLE,
        "1 of 2 pods ready. 1 of 2 pods ready.",
    )
    none = Facts((), "v1", 2, fleet=True)
    assert availability(none) == (
        FALSE,
        Reason.WAITING_FOR_ENGINE,
        "No runtime pods: no GPU product's engine is built yet.",
    )
