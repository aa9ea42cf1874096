"""The status' situation chain and table (`reconcile.situation`): which single situation
applies when several do (build failed > building > runtime pods failing > rollout stalled
> a shadow rollout's say > rolled out > rolling out), what each situation carries, for one
engine and for a mixed GPU fleet's products (the same chain, their sentences joined, each
after its product), and the one table from situation to Ready, Progressing, Degraded,
Reconciling, Stalled and the phase, walked row by row. Pure: no cluster, no decide."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, Reason
from kubeinfer.operator.api.v1alpha1.enums import Phase
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress
from kubeinfer.operator.reconcile.situation import (
    AS_EXPECTED,
    EngineFacts,
    Facts,
    Situation,
    SituationKind,
    SummaryConditions,
    situation_of,
    summary_conditions,
)
from kubeinfer.operator.rollout.report import ShadowReport
from kubeinfer.operator.state.engine_state import EnginePhase, EngineState, ServingEngine
from kubeinfer.operator.state.runtime_failures import RuntimeFailure

TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
NEW_DIGEST, OLD_DIGEST = "sha256:" + "b" * 64, "sha256:" + "a" * 64
ROLLED = "Deployment demo-runtime: 3 of 3 pods ready"
ROLLING = "Deployment demo-runtime: 1 of 3 pods updated, 3 ready"

BUILT = EngineState(EnginePhase.BUILT, "key", digest=NEW_DIGEST, message="Engine built.")
BUILDING = EngineState(EnginePhase.BUILDING, "key", message="Job j-1 is building the engine.")
BUILD_FAILED = EngineState(EnginePhase.FAILED, "key", message="Job j-0 failed: boom.")
NEW = ServingEngine("2", NEW_DIGEST, "key")
OLD = ServingEngine("1", OLD_DIGEST, "old key")
COMPLETE = RolloutProgress(True, True, True, False, 3, ROLLED)
IN_PROGRESS = RolloutProgress(True, False, True, False, 3, ROLLING)
STALLED = replace(IN_PROGRESS, stalled=True)
CRASHING = RuntimeFailure(Reason.RUNTIME_FAILING, "Pod demo-runtime-x exited with code 1.")
TESTING = ShadowReport(
    progress=(TRUE, Reason.SHADOW_RUNNING, "Version 2 is under shadow test."),
    phase=Phase.SHADOWING,
)
SERVES = "Version 2 (engine sha256:bbb) serves on 3 of 3 pods."


ONE_ENGINE = ("engine", "serving", "failure", "rollout")
"""The changes `facts` makes to its one engine; the others are the object's."""


def facts(**changes: object) -> Facts:
    """One engine, the spec's, built and served on all 3 replicas, unless changed."""
    engine = EngineFacts(engine=BUILT, serving=NEW, version="2", failure=None, rollout=COMPLETE)
    mine = {key: value for key, value in changes.items() if key in ONE_ENGINE}
    served = Facts(engines=(replace(engine, **mine),), version="2", replicas=3)
    return replace(served, **{k: v for k, v in changes.items() if k not in ONE_ENGINE})


DRIFT = "Class 'cat': top-1 agreement 0.81 over 900 rows (threshold 0.9)."
FELL = "The int8 engine drifted; serving falls back to the fp32 engine."

EVERYTHING_WRONG = {
    "engine": BUILD_FAILED,
    "failure": CRASHING,
    "rollout": STALLED,
    "shadow": TESTING,
}


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        (EVERYTHING_WRONG, SituationKind.BUILD_FAILED),
        ({**EVERYTHING_WRONG, "engine": BUILDING}, SituationKind.BUILDING),
        ({**EVERYTHING_WRONG, "engine": BUILT}, SituationKind.RUNTIME_FAILING),
        ({"rollout": STALLED, "shadow": TESTING}, SituationKind.ROLLOUT_STALLED),
        ({"shadow": TESTING}, SituationKind.SHADOW),
        ({"shadow": TESTING, "quality_drift": DRIFT}, SituationKind.SHADOW),
        ({"quality_drift": DRIFT}, SituationKind.QUALITY_DRIFT),
        ({"quality_drift": DRIFT, "rollout": IN_PROGRESS}, SituationKind.QUALITY_DRIFT),
        ({"quality_drift": DRIFT, "serving": OLD}, SituationKind.ROLLING_OUT),  # not judged
        (
            {"quality_drift": DRIFT, "serving": OLD, "fallback": FELL},
            SituationKind.QUALITY_FALLBACK,
        ),
        ({"fallback": FELL, "shadow": TESTING}, SituationKind.SHADOW),
        ({"fallback": FELL, "failure": CRASHING}, SituationKind.RUNTIME_FAILING),
        ({}, SituationKind.ROLLED_OUT),
        ({"rollout": IN_PROGRESS}, SituationKind.ROLLING_OUT),
        ({"serving": OLD}, SituationKind.ROLLING_OUT),  # complete, but the older engine's
        ({"serving": replace(NEW, version="1")}, SituationKind.ROLLING_OUT),  # older model
        ({"serving": None, "rollout": IN_PROGRESS}, SituationKind.ROLLING_OUT),
    ],
)
def test_the_most_pressing_situation_wins(changes, kind):
    assert situation_of(facts(**changes)).kind == kind


def test_a_failed_build_says_which_older_version_keeps_serving_and_that_something_does():
    assert situation_of(facts(engine=BUILD_FAILED, serving=OLD)) == Situation(
        SituationKind.BUILD_FAILED,
        Reason.ENGINE_BUILD_FAILED,
        "Job j-0 failed: boom.",
        keeps_serving=" Version 1 keeps serving.",
        still_serving=True,
    )
    nothing = situation_of(facts(engine=BUILD_FAILED, serving=None))
    assert (nothing.keeps_serving, nothing.still_serving) == ("", False)


def test_a_build_mentions_failing_pods_only_as_meanwhile():
    assert situation_of(facts(engine=BUILDING, serving=OLD, failure=CRASHING)) == Situation(
        SituationKind.BUILDING,
        Reason.ENGINE_BUILDING,
        "Job j-1 is building the engine.",
        keeps_serving=" Version 1 keeps serving.",
        meanwhile=" Meanwhile: Pod demo-runtime-x exited with code 1.",
    )
    assert situation_of(facts(engine=BUILDING)).meanwhile == ""


@pytest.mark.parametrize(("ready_replicas", "still_serving"), [(0, False), (1, True)])
def test_failing_runtime_pods_are_told_in_their_own_words(ready_replicas, still_serving):
    rollout = replace(IN_PROGRESS, ready_replicas=ready_replicas)
    incompatible = RuntimeFailure(Reason.ENGINE_INCOMPATIBLE, "Pod p: engine of another ORT.")
    assert situation_of(facts(failure=incompatible, rollout=rollout, serving=OLD)) == Situation(
        SituationKind.RUNTIME_FAILING,
        Reason.ENGINE_INCOMPATIBLE,
        "Pod p: engine of another ORT.",
        keeps_serving=" Version 1 keeps serving.",
        still_serving=still_serving,
    )


def test_the_rest_carry_the_rollout_or_the_shadow_in_their_words():
    assert situation_of(facts(rollout=STALLED)) == Situation(
        SituationKind.ROLLOUT_STALLED, Reason.ROLLOUT_STALLED, f"{ROLLING}."
    )
    assert situation_of(facts(shadow=TESTING, serving=OLD)) == Situation(
        SituationKind.SHADOW,
        Reason.SHADOW_RUNNING,
        "Version 2 is under shadow test.",
        shadow=TESTING,
    )
    assert situation_of(facts(rollout=IN_PROGRESS, serving=OLD)) == Situation(
        SituationKind.ROLLING_OUT,
        Reason.ROLLING_OUT,
        f"{ROLLING}.",
        keeps_serving=" Version 1 keeps serving.",
    )


def test_pods_not_ready_after_the_rollout_have_a_reason_of_their_own():
    lost = replace(IN_PROGRESS, replacing=True)
    assert situation_of(facts(rollout=lost)).reason == Reason.PODS_NOT_READY
    assert situation_of(facts(rollout=lost, serving=OLD)).reason == Reason.ROLLING_OUT


def test_the_spec_served_on_every_replica_is_said_whatever_the_situation():
    ready = f"Version 2 (engine {NEW_DIGEST}) serves on 3 of 3 pods."
    assert situation_of(facts()) == Situation(
        SituationKind.ROLLED_OUT, Reason.ROLLOUT_COMPLETE, f"{ROLLED}.", serves=ready
    )
    for changes, kind in (
        ({"failure": CRASHING}, SituationKind.RUNTIME_FAILING),
        ({"rollout": replace(COMPLETE, stalled=True)}, SituationKind.ROLLOUT_STALLED),
        ({"shadow": PROMOTING}, SituationKind.SHADOW),  # the roll to the promoted engine is done
    ):
        situation = situation_of(facts(**changes))
        assert (situation.kind, situation.serves) == (kind, ready)
    assert situation_of(facts(rollout=IN_PROGRESS)).serves == ""


H100, L4 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L4"


def fleet(*engines: EngineFacts) -> Facts:
    """A mixed GPU fleet's facts, one engine per product (3 pods over all of them)."""
    return Facts(engines=engines, version="2", replicas=3, fleet=True, no_products="None.")


def product(name: str, nodes: int = 2, **changes: object) -> EngineFacts:
    """A product whose engine is built and served on its pods, unless changed."""
    engine = EngineFacts(BUILT, NEW, "2", None, COMPLETE, product=name, nodes=nodes)
    return replace(engine, **changes)


def test_a_fleet_without_an_eligible_product_stalls_saying_why():
    assert situation_of(fleet()) == Situation(
        SituationKind.ROLLOUT_STALLED, Reason.NO_GPU_NODES, "None."
    )


def test_a_fleets_sentences_name_each_product_and_every_older_version():
    failing = product(H100, engine=BUILD_FAILED, serving=OLD)
    building = product(L4, engine=BUILDING, serving=replace(OLD, version="0"))
    assert situation_of(fleet(failing, building)) == Situation(
        SituationKind.BUILD_FAILED,
        Reason.ENGINE_BUILD_FAILED,
        f"{H100}: Job j-0 failed: boom.",
        keeps_serving=" Version 0, 1 keeps serving meanwhile.",
        still_serving=True,
    )
    situation = situation_of(fleet(product(H100), building))
    assert (situation.kind, situation.message) == (
        SituationKind.BUILDING,
        f"{L4}: Job j-1 is building the engine.",
    )
    stalled = situation_of(fleet(product(H100, rollout=STALLED), product(L4, rollout=STALLED)))
    assert (stalled.kind, stalled.message) == (
        SituationKind.ROLLOUT_STALLED,
        f"{ROLLING}; {ROLLING}",
    )


def test_a_fleet_rolled_out_everywhere_says_so_once_every_product_serves_the_spec():
    everywhere = situation_of(fleet(product(H100, nodes=2), product(L4, nodes=3)))
    assert everywhere == Situation(
        SituationKind.ROLLED_OUT,
        Reason.ROLLOUT_COMPLETE,
        f"{ROLLED}. {ROLLED}.",
        serves="Version 2 serves on 2 GPU products (5 nodes), each on its own engine.",
    )
    one_rolling = situation_of(fleet(product(H100), product(L4, rollout=IN_PROGRESS)))
    assert (one_rolling.kind, one_rolling.serves) == (SituationKind.ROLLING_OUT, "")
    replacing = product(L4, rollout=replace(IN_PROGRESS, replacing=True))
    assert situation_of(fleet(product(H100), replacing)).reason == Reason.PODS_NOT_READY


def test_a_fleet_served_everywhere_is_ready_whatever_else_a_roll_still_says():
    # As for one engine: a deadline the Deployment's controller has not cleared yet.
    stale = product(L4, rollout=replace(COMPLETE, stalled=True))
    situation = situation_of(fleet(product(H100), stale))
    assert situation.kind == SituationKind.ROLLOUT_STALLED
    assert (
        situation.serves == "Version 2 serves on 2 GPU products (4 nodes), each on its own engine."
    )


def said(kind: SituationKind, reason: Reason, message: str, **more: object) -> Situation:
    return Situation(kind, reason, message, **more)


OLDER = {"keeps_serving": " Version 1 keeps serving."}
BLOCKED = ShadowReport(
    progress=(FALSE, Reason.SHADOW_FAILED, "Version 2 failed its shadow test."),
    degraded=(TRUE, Reason.SHADOW_FAILED, "Version 2 failed its shadow test."),
    phase=Phase.DEGRADED,
)
PROMOTING = ShadowReport(progress=(TRUE, Reason.PROMOTING, "Version 2 passed."))

FALLEN_BACK = "The fallback engine serves on every pod."
TABLE = [
    (
        said(SituationKind.BUILD_FAILED, Reason.ENGINE_BUILD_FAILED, "Boom.", **OLDER),
        SummaryConditions(
            ready=(FALSE, Reason.ENGINE_BUILD_FAILED, "Boom. Version 1 keeps serving."),
            progressing=(FALSE, Reason.ENGINE_BUILD_FAILED, "Boom."),
            degraded=(TRUE, Reason.ENGINE_BUILD_FAILED, "Boom. Version 1 keeps serving."),
            reconciling=(FALSE, Reason.ENGINE_BUILD_FAILED, "Boom. Version 1 keeps serving."),
            stalled=(TRUE, Reason.ENGINE_BUILD_FAILED, "Boom. Version 1 keeps serving."),
            phase=Phase.FAILED,
        ),
    ),
    (
        said(SituationKind.BUILD_FAILED, Reason.ENGINE_BUILD_FAILED, "Boom.", still_serving=True),
        SummaryConditions(
            ready=(FALSE, Reason.ENGINE_BUILD_FAILED, "Boom."),
            progressing=(FALSE, Reason.ENGINE_BUILD_FAILED, "Boom."),
            degraded=(TRUE, Reason.ENGINE_BUILD_FAILED, "Boom."),
            reconciling=(FALSE, Reason.ENGINE_BUILD_FAILED, "Boom."),
            stalled=(TRUE, Reason.ENGINE_BUILD_FAILED, "Boom."),
            phase=Phase.DEGRADED,
        ),
    ),
    (
        said(
            SituationKind.BUILDING,
            Reason.ENGINE_BUILDING,
            "Building.",
            meanwhile=" Meanwhile: crash.",
            **OLDER,
        ),
        SummaryConditions(
            ready=(FALSE, Reason.ENGINE_BUILDING, "Building. Version 1 keeps serving."),
            progressing=(TRUE, Reason.ENGINE_BUILDING, "Building. Meanwhile: crash."),
            degraded=AS_EXPECTED,
            reconciling=(TRUE, Reason.ENGINE_BUILDING, "Building. Meanwhile: crash."),
            stalled=AS_EXPECTED,
            phase=Phase.BUILDING_ENGINE,
        ),
    ),
    (
        said(SituationKind.RUNTIME_FAILING, Reason.RUNTIME_FAILING, "Crash.", **OLDER),
        SummaryConditions(
            ready=(FALSE, Reason.RUNTIME_FAILING, "Crash. Version 1 keeps serving."),
            progressing=(FALSE, Reason.RUNTIME_FAILING, "Crash."),
            degraded=(TRUE, Reason.RUNTIME_FAILING, "Crash."),
            reconciling=(FALSE, Reason.RUNTIME_FAILING, "Crash."),
            stalled=(TRUE, Reason.RUNTIME_FAILING, "Crash."),
            phase=Phase.FAILED,
        ),
    ),
    (
        said(SituationKind.RUNTIME_FAILING, Reason.RUNTIME_FAILING, "Crash.", still_serving=True),
        SummaryConditions(
            ready=(FALSE, Reason.RUNTIME_FAILING, "Crash."),
            progressing=(FALSE, Reason.RUNTIME_FAILING, "Crash."),
            degraded=(TRUE, Reason.RUNTIME_FAILING, "Crash."),
            reconciling=(FALSE, Reason.RUNTIME_FAILING, "Crash."),
            stalled=(TRUE, Reason.RUNTIME_FAILING, "Crash."),
            phase=Phase.DEGRADED,
        ),
    ),
    (
        said(SituationKind.ROLLOUT_STALLED, Reason.ROLLOUT_STALLED, "Timed out.", **OLDER),
        SummaryConditions(
            ready=(FALSE, Reason.ROLLOUT_STALLED, "Timed out."),  # the older one unsaid
            progressing=(FALSE, Reason.ROLLOUT_STALLED, "Timed out."),
            degraded=(TRUE, Reason.ROLLOUT_STALLED, "Timed out."),
            reconciling=(FALSE, Reason.ROLLOUT_STALLED, "Timed out."),
            stalled=(TRUE, Reason.ROLLOUT_STALLED, "Timed out."),
            phase=Phase.DEGRADED,
        ),
    ),
    (
        said(SituationKind.SHADOW, Reason.SHADOW_RUNNING, "Testing.", shadow=TESTING),
        SummaryConditions(
            ready=(FALSE, Reason.SHADOW_RUNNING, "Testing."),
            progressing=TESTING.progress,
            degraded=AS_EXPECTED,
            reconciling=TESTING.progress,
            stalled=AS_EXPECTED,
            phase=Phase.SHADOWING,
        ),
    ),
    (
        said(SituationKind.SHADOW, Reason.PROMOTING, "Version 2 passed.", shadow=PROMOTING),
        SummaryConditions(
            ready=(FALSE, Reason.PROMOTING, "Version 2 passed."),
            progressing=(TRUE, Reason.PROMOTING, "Version 2 passed."),
            degraded=AS_EXPECTED,
            reconciling=(TRUE, Reason.PROMOTING, "Version 2 passed."),
            stalled=AS_EXPECTED,
            phase=Phase.DEPLOYING,
        ),
    ),
    (
        said(
            SituationKind.SHADOW,
            Reason.SHADOW_FAILED,
            "Version 2 failed its shadow test.",
            shadow=BLOCKED,
        ),
        SummaryConditions(
            ready=(FALSE, Reason.SHADOW_FAILED, "Version 2 failed its shadow test."),
            progressing=(FALSE, Reason.SHADOW_FAILED, "Version 2 failed its shadow test."),
            degraded=(TRUE, Reason.SHADOW_FAILED, "Version 2 failed its shadow test."),
            reconciling=(FALSE, Reason.SHADOW_FAILED, "Version 2 failed its shadow test."),
            stalled=(TRUE, Reason.SHADOW_FAILED, "Version 2 failed its shadow test."),
            phase=Phase.DEGRADED,
        ),
    ),
    (
        said(SituationKind.QUALITY_DRIFT, Reason.QUALITY_DRIFT, DRIFT, serves=SERVES),
        SummaryConditions(  # it serves: Ready; not a reconcile failure: Stalled stays False
            ready=(TRUE, Reason.READY, SERVES),
            progressing=(
                FALSE,
                Reason.ROLLOUT_COMPLETE,
                "The spec's engine serves on every pod.",
            ),
            degraded=(TRUE, Reason.QUALITY_DRIFT, DRIFT),
            reconciling=(
                FALSE,
                Reason.ROLLOUT_COMPLETE,
                "The spec's engine serves on every pod.",
            ),
            stalled=AS_EXPECTED,
            phase=Phase.READY,
        ),
    ),
    (
        said(SituationKind.QUALITY_DRIFT, Reason.QUALITY_DRIFT, DRIFT, meanwhile="2 of 3."),
        SummaryConditions(  # scaling up meanwhile: the condition stays, Progressing says so
            ready=(FALSE, Reason.ROLLING_OUT, "2 of 3."),
            progressing=(TRUE, Reason.ROLLING_OUT, "2 of 3."),
            degraded=(TRUE, Reason.QUALITY_DRIFT, DRIFT),
            reconciling=(TRUE, Reason.ROLLING_OUT, "2 of 3."),
            stalled=AS_EXPECTED,
            phase=Phase.DEPLOYING,
        ),
    ),
    (
        said(SituationKind.QUALITY_FALLBACK, Reason.QUALITY_DRIFT, FELL, still_serving=True),
        SummaryConditions(  # the spec's engine does not serve: not Ready, nor a failure
            ready=(FALSE, Reason.QUALITY_FALLBACK, FELL),
            progressing=(FALSE, Reason.ROLLOUT_COMPLETE, FALLEN_BACK),
            degraded=(TRUE, Reason.QUALITY_DRIFT, FELL),
            reconciling=(FALSE, Reason.ROLLOUT_COMPLETE, FALLEN_BACK),
            stalled=AS_EXPECTED,
            phase=Phase.DEGRADED,
        ),
    ),
    (
        said(
            SituationKind.QUALITY_FALLBACK,
            Reason.QUALITY_DRIFT,
            FELL,
            meanwhile="1 of 3.",
            still_serving=True,
        ),
        SummaryConditions(  # rolling to the fallback engine
            ready=(FALSE, Reason.QUALITY_FALLBACK, FELL),
            progressing=(TRUE, Reason.ROLLING_OUT, "1 of 3."),
            degraded=(TRUE, Reason.QUALITY_DRIFT, FELL),
            reconciling=(TRUE, Reason.ROLLING_OUT, "1 of 3."),
            stalled=AS_EXPECTED,
            phase=Phase.DEGRADED,
        ),
    ),
    (
        said(SituationKind.ROLLED_OUT, Reason.ROLLOUT_COMPLETE, "3 of 3.", serves=SERVES),
        SummaryConditions(
            ready=(TRUE, Reason.READY, SERVES),
            progressing=(FALSE, Reason.ROLLOUT_COMPLETE, "3 of 3."),
            degraded=AS_EXPECTED,
            reconciling=(FALSE, Reason.ROLLOUT_COMPLETE, "3 of 3."),
            stalled=AS_EXPECTED,
            phase=Phase.READY,
        ),
    ),
    (
        said(SituationKind.ROLLING_OUT, Reason.ROLLING_OUT, "1 of 3.", **OLDER),
        SummaryConditions(
            ready=(FALSE, Reason.ROLLING_OUT, "1 of 3. Version 1 keeps serving."),
            progressing=(TRUE, Reason.ROLLING_OUT, "1 of 3."),
            degraded=AS_EXPECTED,
            reconciling=(TRUE, Reason.ROLLING_OUT, "1 of 3."),
            stalled=AS_EXPECTED,
            phase=Phase.DEPLOYING,
        ),
    ),
]


@pytest.mark.parametrize(
    ("situation", "expected"), TABLE, ids=[f"{s.kind}-{s.reason}" for s, _ in TABLE]
)
def test_each_situation_maps_to_its_conditions_and_phase(situation, expected):
    assert summary_conditions(situation) == expected


def test_the_table_has_a_row_for_every_situation():
    assert {situation.kind for situation, _ in TABLE} == set(SituationKind)


@pytest.mark.parametrize(
    "situation",
    [
        said(SituationKind.RUNTIME_FAILING, Reason.RUNTIME_FAILING, "Crash.", serves=SERVES),
        said(SituationKind.ROLLOUT_STALLED, Reason.ROLLOUT_STALLED, "Stale.", serves=SERVES),
        said(
            SituationKind.SHADOW,
            Reason.PROMOTING,
            "Version 2 passed.",
            shadow=PROMOTING,
            serves=SERVES,
        ),
    ],
    ids=lambda situation: situation.kind,
)
def test_a_served_spec_keeps_ready_while_progressing_and_degraded_tell_the_rest(situation):
    conditions = summary_conditions(situation)
    assert (conditions.ready, conditions.phase) == ((TRUE, Reason.READY, SERVES), Phase.READY)
    assert conditions.progressing[1:] == (situation.reason, situation.message)


def test_reconciling_is_never_anything_but_true_or_false():
    unknown = ShadowReport(progress=(UNKNOWN, Reason.SHADOW_RUNNING, "Hm."))
    situation = said(SituationKind.SHADOW, Reason.SHADOW_RUNNING, "Hm.", shadow=unknown)
    assert summary_conditions(situation).reconciling == (FALSE, Reason.SHADOW_RUNNING, "Hm.")
