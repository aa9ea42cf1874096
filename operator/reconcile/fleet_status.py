"""The status of an InferenceDeployment on a mixed GPU fleet. Pure.

Every eligible GPU product has a line in `status.engines` (its engine, nodes and pods),
and `status.enginesReady` counts the built engines for `kubectl get -o wide`. The summary
conditions come from the same table as a single engine's (`situation.summary_conditions`)
over one chain that looks at every product, most pressing first:

    no eligible product > a build failed > builds under way > runtime pods failing >
    a rollout stalled > rolled out everywhere > rolling out

Ready is True only when every product's current engine serves on every pod wanted there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec, InferenceDeploymentStatus
from kubeinfer.operator.api.v1alpha1.conditions import (
    ConditionStatus,
    ConditionType,
    ConditionValue,
    Reason,
)
from kubeinfer.operator.api.v1alpha1.enums import Phase
from kubeinfer.operator.api.v1alpha1.gpu_fleet import ProductEnginePhase, ProductEngineStatus
from kubeinfer.operator.api.v1alpha1.status import VersionStatus
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress
from kubeinfer.operator.reconcile.scaling_status import ScalingReport
from kubeinfer.operator.reconcile.situation import Situation, SituationKind, summary_conditions
from kubeinfer.operator.reconcile.slo_status import SloReport
from kubeinfer.operator.reconcile.status import cache_attach_risk, set_or_remove
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import EnginePhase, EngineState, ServingEngine
from kubeinfer.operator.state.gpu_nodes import ProductCapacity
from kubeinfer.operator.state.runtime_failures import runtime_failure
from kubeinfer.operator.state.snapshot import Event, ObservedState

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE
MESSAGE_LIMIT = 1024
PHASES = {
    EnginePhase.BUILT: ProductEnginePhase.BUILT,
    EnginePhase.BUILDING: ProductEnginePhase.BUILDING,
    EnginePhase.FAILED: ProductEnginePhase.FAILED,
}


@dataclass(frozen=True)
class ProductPass:
    """One GPU product in a pass: its eligible nodes, the spec and observed state its
    single-engine decisions read, its engine, and the engine that serves there (None:
    none yet, so nothing runs there)."""

    capacity: ProductCapacity
    spec: InferenceDeploymentSpec
    view: ObservedState
    engine: EngineState
    serving: ServingEngine | None

    @property
    def product(self) -> str:
        return self.capacity.product

    @property
    def current(self) -> bool:
        """Whether the product serves the spec's engine and version."""
        return (
            self.serving is not None
            and self.engine.ready
            and self.serving.digest == self.engine.digest
            and self.serving.version == self.spec.model.version
        )


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _said(passes: Sequence[ProductPass], phase: EnginePhase) -> str:
    """What the engines in `phase` say, each after its product's name."""
    return _cut(
        " ".join(f"{p.product}: {p.engine.message}" for p in passes if p.engine.phase == phase)
    )


def _keeps_serving(passes: Sequence[ProductPass]) -> str:
    older = sorted({p.serving.version for p in passes if p.serving and not p.current})
    return f" Version {', '.join(older)} keeps serving meanwhile." if older else ""


def _no_products(spec: InferenceDeploymentSpec) -> str:
    fleet = spec.runtime.gpu_fleet
    listed = ", ".join(p.name for p in fleet.products) if fleet and fleet.products else ""
    return (
        "No GPU node is eligible: none carries an nvidia.com/gpu.product label "
        "(GPU feature discovery) with allocatable nvidia.com/gpu"
        + (f" of the products {listed}" if listed else "")
        + " and matches runtime.nodeSelector with its taints tolerated by runtime.tolerations."
    )


def fleet_situation(
    observed: ObservedState,
    passes: Sequence[ProductPass],
    rollouts: Mapping[str, RolloutProgress],
) -> Situation:
    """The first situation of the fleet's chain that applies (see the module's docstring)."""
    phases = {p.engine.phase for p in passes}
    older = _keeps_serving(passes)
    serving = any(p.serving for p in passes)
    # Pods of an engine a product's Deployment no longer runs are on their way out.
    failures = (
        runtime_failure(p.view.runtime_pods, digest=p.serving.digest) for p in passes if p.serving
    )
    failure = next((found for found in failures if found is not None), None)
    stalled = [r.message for r in rollouts.values() if r.stalled]
    said = _cut(" ".join(f"{r.message}." for r in rollouts.values()))
    if not passes:
        return Situation(
            SituationKind.ROLLOUT_STALLED, Reason.NO_GPU_NODES, _no_products(observed.spec)
        )
    if EnginePhase.FAILED in phases:
        failed = _said(passes, EnginePhase.FAILED)
        return Situation(
            SituationKind.BUILD_FAILED, Reason.ENGINE_BUILD_FAILED, failed,
            keeps_serving=older, still_serving=serving,
        )  # fmt: skip
    if EnginePhase.BUILDING in phases:
        meanwhile = f" Meanwhile: {failure.message}" if failure else ""
        building = _said(passes, EnginePhase.BUILDING)
        return Situation(
            SituationKind.BUILDING, Reason.ENGINE_BUILDING, building,
            keeps_serving=older, meanwhile=meanwhile,
        )  # fmt: skip
    if failure is not None:
        ready = sum(r.ready_replicas for r in rollouts.values())
        return Situation(
            SituationKind.RUNTIME_FAILING, failure.reason, failure.message,
            keeps_serving=older, still_serving=ready > 0,
        )  # fmt: skip
    if stalled:
        return Situation(
            SituationKind.ROLLOUT_STALLED, Reason.ROLLOUT_STALLED, _cut("; ".join(stalled))
        )
    if all(p.current for p in passes) and all(r.complete for r in rollouts.values()):
        total = sum(p.capacity.nodes for p in passes)
        serves = (
            f"Version {observed.spec.model.version} serves on {len(passes)} GPU products "
            f"({total} nodes), each on its own engine."
        )
        return Situation(SituationKind.ROLLED_OUT, Reason.ROLLOUT_COMPLETE, said, serves=serves)
    replacing = all(p.current for p in passes) and all(
        r.complete or r.replacing for r in rollouts.values()
    )
    reason = Reason.PODS_NOT_READY if replacing and rollouts else Reason.ROLLING_OUT
    return Situation(SituationKind.ROLLING_OUT, reason, said, keeps_serving=older)


def engines_condition(passes: Sequence[ProductPass], situation: Situation) -> ConditionValue:
    """EngineReady: True once every eligible product's engine is built."""
    if not passes:
        return FALSE, Reason.NO_GPU_NODES, situation.message
    if situation.kind == SituationKind.BUILD_FAILED:
        return FALSE, Reason.ENGINE_BUILD_FAILED, situation.message + situation.keeps_serving
    if situation.kind == SituationKind.BUILDING:
        return FALSE, Reason.ENGINE_BUILDING, situation.message + situation.keeps_serving
    products = ", ".join(p.product for p in passes)
    return (
        TRUE,
        Reason.ENGINE_BUILT,
        _cut(f"Engines built for {len(passes)} GPU products: {products}."),
    )


def fleet_availability(rollouts: Mapping[str, RolloutProgress]) -> ConditionValue:
    """Available: does any product serve, whichever version?"""
    said = _cut(" ".join(f"{r.message}." for r in rollouts.values() if r.exists))
    if any(r.available for r in rollouts.values()):
        return TRUE, Reason.DEPLOYMENT_AVAILABLE, said
    if not any(r.exists for r in rollouts.values()):
        return (
            FALSE,
            Reason.WAITING_FOR_ENGINE,
            "No runtime pods: no GPU product's engine is built yet.",
        )
    return FALSE, Reason.DEPLOYMENT_UNAVAILABLE, said


def product_record(
    each: ProductPass, replicas: int, rollout: RolloutProgress
) -> ProductEngineStatus:
    engine = each.engine
    return ProductEngineStatus(
        gpu_product=each.product,
        phase=PHASES.get(engine.phase, ProductEnginePhase.BUILDING),
        digest=engine.digest,
        target=engine.target,
        build_key=engine.build_key if engine.digest else None,
        nodes=each.capacity.nodes,
        gpus=each.capacity.gpus,
        replicas=replicas,
        ready_replicas=rollout.ready_replicas,
        message=_cut(engine.message),
    )


PHASE_EVENTS: dict[ProductEnginePhase, tuple[Literal["Normal", "Warning"], Reason]] = {
    ProductEnginePhase.BUILT: ("Normal", Reason.ENGINE_BUILT),
    ProductEnginePhase.BUILDING: ("Normal", Reason.ENGINE_BUILDING),
    ProductEnginePhase.FAILED: ("Warning", Reason.ENGINE_BUILD_FAILED),
}


def product_events(
    before: Sequence[ProductEngineStatus], after: Sequence[ProductEngineStatus]
) -> tuple[Event, ...]:
    """An Event per product whose engine changed phase or digest (or that is new): the
    summary conditions say how many are built, these say which."""
    old = {e.gpu_product: (e.phase, e.digest) for e in before}
    events = []
    for engine in after:
        if old.get(engine.gpu_product) == (engine.phase, engine.digest):
            continue
        kind, reason = PHASE_EVENTS[engine.phase]
        events.append(Event(kind, reason, _cut(f"{engine.gpu_product}: {engine.message}")))
    return tuple(events)


def _serving_record(
    previous: VersionStatus | None,
    passes: Sequence[ProductPass],
    rollouts: Mapping[str, RolloutProgress],
) -> VersionStatus | None:
    """status.serving: the version every product runs once all their rolls are complete
    (no one digest: each product has its own, in status.engines); until then what it was."""
    versions = {p.serving.version for p in passes if p.serving is not None}
    if len(versions) == 1 and all(r.complete for r in rollouts.values()):
        return VersionStatus(version=versions.pop())
    return previous


def fleet_status(
    observed: ObservedState,
    passes: Sequence[ProductPass],
    rollouts: Mapping[str, RolloutProgress],
    replicas: Mapping[str, int],
    total: int,
    now: datetime,
    scaling: ScalingReport | None,
    slo: SloReport | None,
) -> InferenceDeploymentStatus:
    """The whole status of a fleet's pass (`total`: the pods wanted over all products)."""
    generation, previous = observed.owner.generation, observed.status
    situation = fleet_situation(observed, passes, rollouts)
    summary = summary_conditions(situation)
    values: list[tuple[ConditionType, ConditionValue | None]] = [
        (ConditionType.READY, summary.ready),
        (ConditionType.ENGINE_READY, engines_condition(passes, situation)),
        (ConditionType.AVAILABLE, fleet_availability(rollouts)),
        (ConditionType.PROGRESSING, summary.progressing),
        (ConditionType.DEGRADED, summary.degraded),
        (ConditionType.RECONCILING, summary.reconciling),
        (ConditionType.STALLED, summary.stalled),
        (ConditionType.SHADOW_PASSED, None),
        (ConditionType.CACHE_ATTACH_RISK, cache_attach_risk(observed)),
        (ConditionType.SCALING_ACTIVE, scaling.active if scaling else None),
        (ConditionType.SCALING_LIMITED, scaling.limited if scaling else None),
        (ConditionType.SLO_MET, slo.condition if slo else None),
    ]
    ready = sum(r.ready_replicas for r in rollouts.values())
    built = sum(1 for p in passes if p.engine.ready)
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "phase": summary.phase if passes else Phase.PENDING,
            "conditions": set_or_remove(previous.conditions, values, generation, now),
            "engine": None,
            "engines": [
                product_record(p, replicas[p.product], rollouts[p.product]) for p in passes
            ],
            "engines_ready": f"{built}/{len(passes)}",
            "serving": _serving_record(previous.serving, passes, rollouts),
            "replicas": total,
            "ready_replicas": ready,
            "ready": f"{ready}/{total}",
            "selector": names.selector_string(names.serving_selector(observed.owner.name)),
            "candidate": None,
            "autoscaling": scaling.autoscaling if scaling else None,
            "metrics": scaling.metrics if scaling else previous.metrics,
            "quality_watch": None,
            "slo": slo.status if slo else None,
        }
    )
