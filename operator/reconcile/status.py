"""The InferenceDeployment's status and the Events of its transitions. Pure.

Conditions are written through `set_condition`, so an unchanged condition keeps its
lastTransitionTime, and every message is built from facts that change only when the
world does (no "retrying in 12 s"): a pass that finds nothing new computes a status equal
to the stored one, and the operator patches nothing.

`Ready` is the summary (`kubectl wait --for=condition=Ready`, and what an Argo CD health
check reads): True only when the current generation's engine is what the Deployment runs
and every desired replica of that Deployment is updated, ready and available. kstatus,
which Flux's health checks use, reads only `Reconciling` (True while building or rolling
out) and `Stalled` (True when a build failed, a rollout exceeded its deadline or the spec
is invalid), so those two mirror Progressing and Degraded.

Runtime pods that cannot start (`runtime_failures`: an engine built by another backend
version than their image has, reason EngineIncompatible; another exit code or an image
that cannot be pulled, RuntimeFailing) make the object Degraded with the pod's own
message, rather than a rollout that silently waits for its progress deadline. While the
spec's engine is being built they are only mentioned in Progressing: a new image rolls
the serving pods before their new engine is built, and those pods refuse the old engine
until it is (the old pods keep serving meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus
from kubeinfer.operator.api.v1alpha1.conditions import (
    Condition,
    ConditionStatus,
    ConditionType,
    Reason,
    set_condition,
)
from kubeinfer.operator.api.v1alpha1.inference_deployment import (
    EngineStatus,
    Phase,
    RolloutStrategy,
    VersionStatus,
)
from kubeinfer.operator.reconcile.child_meta import input_hash
from kubeinfer.operator.reconcile.scaling_status import ScalingReport
from kubeinfer.operator.rollout.report import ShadowReport
from kubeinfer.operator.rollout.shadow import RolloutPlan
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import EnginePhase, EngineState
from kubeinfer.operator.state.runtime_failures import runtime_failure
from kubeinfer.operator.state.snapshot import Event, KubeObject, ObservedState

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE

WARNING_REASONS = frozenset(
    {
        Reason.INVALID_SPEC,
        Reason.FORBIDDEN,
        Reason.ENGINE_BUILD_FAILED,
        Reason.ROLLOUT_STALLED,
        Reason.SHADOW_FAILED,
        Reason.SHADOW_ABORTED,
        Reason.READ_WRITE_ONCE_ACROSS_NODES,
        Reason.ENGINE_INCOMPATIBLE,
        Reason.RUNTIME_FAILING,
    }
)
HOSTNAME_LABEL = "kubernetes.io/hostname"
EVENT_MESSAGE_LIMIT = 1024
MIRRORED = frozenset({ConditionType.RECONCILING, ConditionType.STALLED})


@dataclass(frozen=True)
class RolloutProgress:
    """How far the observed Deployment is from the desired one."""

    exists: bool
    complete: bool
    available: bool
    stalled: bool
    ready_replicas: int
    message: str


def rollout_progress(
    observed: KubeObject | None, desired: KubeObject | None, replicas: int
) -> RolloutProgress:
    """Complete means: the observed Deployment is the desired one (same input hash), its
    controller has seen that generation, and all `replicas` pods are updated, ready and
    available with no old pod left."""
    if observed is None or desired is None:
        return RolloutProgress(False, False, False, False, 0, "the Deployment does not exist yet")
    name = observed["metadata"]["name"]
    status: dict[str, Any] = observed.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    available_count = int(status.get("availableReplicas") or 0)
    total = int(status.get("replicas") or 0)
    generation = observed["metadata"].get("generation")
    seen = generation is None or int(status.get("observedGeneration") or 0) >= int(generation)
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    available_condition = conditions.get("Available")
    available = (
        available_condition.get("status") == "True"
        if available_condition
        else available_count >= replicas
    )
    progressing = conditions.get("Progressing") or {}
    stalled = progressing.get("reason") == "ProgressDeadlineExceeded"
    complete = (
        input_hash(observed) == input_hash(desired)
        and seen
        and updated >= replicas
        and ready >= replicas
        and available_count >= replicas
        and total == replicas
    )
    message = f"Deployment {name}: {updated} of {replicas} pods updated, {ready} ready"
    if stalled:
        message += f"; {progressing.get('message') or 'progress deadline exceeded'}"
    return RolloutProgress(True, complete, available, stalled, ready, message)


def compute_status(
    observed: ObservedState,
    engine: EngineState,
    plan: RolloutPlan,
    shadow: ShadowReport,
    rollout: RolloutProgress,
    replicas: int,
    now: datetime,
    scaling: ScalingReport | None = None,
) -> InferenceDeploymentStatus:
    """The whole status for this pass; `plan.serving` is the engine the desired runtime
    runs, `shadow` what a shadow rollout adds, `scaling` what the autoscaler adds (None:
    autoscaling is off)."""
    spec, generation = observed.spec, observed.owner.generation
    serving = plan.serving
    previous = observed.status
    current = (
        engine.ready
        and serving is not None
        and serving.digest == engine.digest
        and serving.version == spec.model.version
    )
    ready = current and rollout.complete
    # Pods of an engine the Deployment no longer runs are on their way out.
    failure = runtime_failure(observed.runtime_pods, digest=serving.digest if serving else None)
    failing = None if failure is None else (failure.reason, failure.message)
    old = serving if serving is not None and not current else None
    keeps = f" Version {old.version} keeps serving." if old else ""

    # EngineReady
    if engine.phase == EnginePhase.PINNED:
        engine_condition = (TRUE, Reason.ENGINE_PINNED, engine.message)
    elif engine.phase == EnginePhase.BUILT:
        engine_condition = (TRUE, Reason.ENGINE_BUILT, engine.message)
    elif engine.phase == EnginePhase.BUILDING:
        engine_condition = (FALSE, Reason.ENGINE_BUILDING, engine.message + keeps)
    else:
        engine_condition = (FALSE, Reason.ENGINE_BUILD_FAILED, engine.message + keeps)

    # Available: is anything serving, whichever version it is?
    if not rollout.exists:
        waiting = Reason.WAITING_FOR_ENGINE if serving is None else Reason.DEPLOYMENT_UNAVAILABLE
        available = (FALSE, waiting, f"No runtime pods: {rollout.message}.")
    elif rollout.available:
        available = (TRUE, Reason.DEPLOYMENT_AVAILABLE, f"{rollout.message}.")
    else:
        available = (FALSE, Reason.DEPLOYMENT_UNAVAILABLE, f"{rollout.message}.")

    # Progressing and Degraded
    degraded = (FALSE, Reason.AS_EXPECTED, "")
    if engine.phase == EnginePhase.FAILED:
        progressing = (FALSE, Reason.ENGINE_BUILD_FAILED, engine.message)
        degraded = (TRUE, Reason.ENGINE_BUILD_FAILED, engine.message + keeps)
    elif engine.phase == EnginePhase.BUILDING:
        meanwhile = f" Meanwhile: {failing[1]}" if failing else ""
        progressing = (TRUE, Reason.ENGINE_BUILDING, engine.message + meanwhile)
    elif failing is not None:
        progressing = (FALSE, *failing)
        degraded = (TRUE, *failing)
    elif rollout.stalled:
        progressing = (FALSE, Reason.ROLLOUT_STALLED, f"{rollout.message}.")
        degraded = (TRUE, Reason.ROLLOUT_STALLED, f"{rollout.message}.")
    elif shadow.progress is not None:
        progressing = shadow.progress
        degraded = shadow.degraded or degraded
    elif ready:
        progressing = (FALSE, Reason.ROLLOUT_COMPLETE, f"{rollout.message}.")
    else:
        progressing = (TRUE, Reason.ROLLING_OUT, f"{rollout.message}.")

    # Ready: the summary
    if ready:
        summary = (
            TRUE,
            Reason.READY,
            f"Version {spec.model.version} (engine {engine.digest}) serves on "
            f"{replicas} of {replicas} pods.",
        )
    elif engine.phase in (EnginePhase.BUILDING, EnginePhase.FAILED):
        summary = (FALSE, engine_condition[1], engine_condition[2])
    elif failing is not None:
        summary = (FALSE, failing[0], failing[1] + keeps)
    elif rollout.stalled:
        summary = (FALSE, Reason.ROLLOUT_STALLED, f"{rollout.message}.")
    elif shadow.progress is not None:
        summary = (FALSE, shadow.progress[1], shadow.progress[2])
    else:
        summary = (FALSE, Reason.ROLLING_OUT, f"{rollout.message}.{keeps}")

    # kstatus (Flux's health check) reads only Reconciling and Stalled: mirror Progressing
    # and a Degraded that needs attention into them.
    if degraded[0] == TRUE:
        reconciling, stalled = (FALSE, degraded[1], degraded[2]), degraded
    elif progressing[0] == TRUE:
        reconciling, stalled = progressing, (FALSE, Reason.AS_EXPECTED, "")
    else:
        reconciling, stalled = (
            (FALSE, progressing[1], progressing[2]),
            (FALSE, Reason.AS_EXPECTED, ""),
        )

    conditions = list(previous.conditions)
    values = [
        (ConditionType.READY, summary),
        (ConditionType.ENGINE_READY, engine_condition),
        (ConditionType.AVAILABLE, available),
        (ConditionType.PROGRESSING, progressing),
        (ConditionType.DEGRADED, degraded),
        (ConditionType.RECONCILING, reconciling),
        (ConditionType.STALLED, stalled),
    ]
    if shadow.shadow_passed is not None:
        values.append((ConditionType.SHADOW_PASSED, shadow.shadow_passed))
    else:
        conditions = [c for c in conditions if c.type != ConditionType.SHADOW_PASSED]
    risk = cache_attach_risk(observed)
    if risk is not None:
        values.append((ConditionType.CACHE_ATTACH_RISK, risk))
    else:
        conditions = [c for c in conditions if c.type != ConditionType.CACHE_ATTACH_RISK]
    if scaling is not None:
        values.append((ConditionType.SCALING_ACTIVE, scaling.active))
        values.append((ConditionType.SCALING_LIMITED, scaling.limited))
    else:
        scaling_types = (ConditionType.SCALING_ACTIVE, ConditionType.SCALING_LIMITED)
        conditions = [c for c in conditions if c.type not in scaling_types]
    for type_, (status, reason, message) in values:
        conditions = set_condition(conditions, type_, status, reason, message, generation, now)

    if ready:
        phase = Phase.READY
    elif engine.phase == EnginePhase.FAILED:
        phase = Phase.DEGRADED if serving is not None else Phase.FAILED
    elif engine.phase == EnginePhase.BUILDING:
        phase = Phase.BUILDING_ENGINE
    elif failing is not None:
        phase = Phase.DEGRADED if rollout.ready_replicas else Phase.FAILED  # serving?
    elif rollout.stalled:
        phase = Phase.DEGRADED
    else:
        phase = shadow.phase or Phase.DEPLOYING

    engine_status = EngineStatus(
        digest=engine.digest,
        backend=spec.engine.backend,
        precision=spec.engine.precision,
        target=engine.target,
        max_batch_size=spec.engine.max_batch_size,
        build_key=engine.build_key if engine.digest else None,
    )
    if serving is not None and rollout.complete:
        serving_status: VersionStatus | None = VersionStatus(
            version=serving.version, engine_digest=serving.digest
        )
    else:
        serving_status = previous.serving
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "phase": phase,
            "conditions": conditions,
            "engine": engine_status,
            "serving": serving_status,
            "replicas": replicas,
            "ready_replicas": rollout.ready_replicas,
            "ready": f"{rollout.ready_replicas}/{replicas}",
            "selector": names.selector_string(names.serving_selector(observed.owner.name)),
            "candidate": plan.record,
            "autoscaling": scaling.autoscaling if scaling else None,
            "metrics": scaling.metrics if scaling else previous.metrics,
        }
    )


def invalid_status(
    status: InferenceDeploymentStatus, message: str, generation: int, now: datetime
) -> InferenceDeploymentStatus:
    """Degraded=True, Stalled=True, Ready=False and Reconciling=False with reason
    InvalidSpec; the rest is kept, since the children of the last valid spec are left as
    they are."""
    conditions = list(status.conditions)
    for type_, value in (
        (ConditionType.READY, FALSE),
        (ConditionType.DEGRADED, TRUE),
        (ConditionType.RECONCILING, FALSE),
        (ConditionType.STALLED, TRUE),
    ):
        conditions = set_condition(
            conditions, type_, value, Reason.INVALID_SPEC, message, generation, now
        )
    return status.model_copy(
        update={"observed_generation": generation, "phase": Phase.FAILED, "conditions": conditions}
    )


def forbidden_status(
    status: InferenceDeploymentStatus, message: str, generation: int, now: datetime
) -> InferenceDeploymentStatus:
    """`status` with Degraded=True and Ready=False, reason Forbidden: the API server
    refused the operator a write its Role does not allow, so what the spec asks cannot be
    made until the Role is fixed. The next pass that gets through clears it."""
    conditions = list(status.conditions)
    for type_, value in ((ConditionType.READY, FALSE), (ConditionType.DEGRADED, TRUE)):
        conditions = set_condition(
            conditions, type_, value, Reason.FORBIDDEN, message, generation, now
        )
    return status.model_copy(update={"conditions": conditions})


def cache_attach_risk(observed: ObservedState) -> tuple[ConditionStatus, Reason, str] | None:
    """The CacheAttachRisk condition, or None where there is none. The claim the operator
    creates defaults to ReadWriteOnce, the one access mode every storage class offers, and
    such a volume attaches to one node at a time: a runtime pod (or a shadow candidate, or
    a build Job) scheduled on another node waits in ContainerCreating with a Multi-Attach
    error. The operator does not pin the pods to one node for it (that would stop the
    spreading of GPU pods, and classes such as NFS mount ReadWriteOnce volumes on several
    nodes anyway); it warns, with what to change, whenever more than one runtime pod may
    mount the claim: more than one replica (autoscaling's maximum when autoscaling), or a
    shadow candidate beside the serving pods. The observed claim's access modes win over
    the spec's, since a claim's are fixed at creation. No warning for an existing claim
    (its access modes are the owner's choice) or pods pinned by kubernetes.io/hostname."""
    spec = observed.spec
    cache = spec.engine.cache
    if cache.existing_claim or HOSTNAME_LABEL in spec.runtime.node_selector:
        return None
    modes = ((observed.pvc or {}).get("spec") or {}).get("accessModes") or [cache.access_mode]
    if "ReadWriteMany" in modes:
        return None
    scaling = spec.autoscaling
    pods = scaling.max_replicas if scaling.enabled else spec.runtime.replicas
    shadow = spec.rollout.strategy == RolloutStrategy.SHADOW
    if shadow:
        pods += spec.rollout.shadow.replicas
    if pods <= 1:
        return None
    claim = names.cache_claim_name(observed.owner.name)
    return (
        TRUE,
        Reason.READ_WRITE_ONCE_ACROSS_NODES,
        f"The engine cache claim {claim} is {'/'.join(modes)} and up to {pods} runtime pods"
        f"{' (serving and shadow candidate)' if shadow else ''} mount it, plus a build Job "
        "while an engine builds: the volume attaches to one node, so a pod scheduled on "
        "another waits in ContainerCreating (Multi-Attach error). Set "
        "engine.cache.accessMode ReadWriteMany on a storage class that supports it, name a "
        "shareable engine.cache.existingClaim, or keep the pods on one node "
        f"(runtime.nodeSelector {HOSTNAME_LABEL}).",
    )


def transition_events(before: list[Condition], after: list[Condition]) -> tuple[Event, ...]:
    """One Event per condition whose status or reason changed (or that is new); Warning for
    failure reasons. Reconciling and Stalled only mirror Progressing and Degraded, whose
    Events already announce the same transitions."""
    old = {c.type: c for c in before}
    events = []
    for condition in after:
        if condition.type in MIRRORED:
            continue
        previous = old.get(condition.type)
        if previous and (previous.status, previous.reason) == (condition.status, condition.reason):
            continue
        if (
            previous is None
            and condition.type == ConditionType.DEGRADED
            and condition.status == FALSE
        ):
            continue  # "not degraded" on creation is no news
        text = f"{condition.type} is {condition.status}"
        if condition.message:
            text += f": {condition.message}"
        if len(text) > EVENT_MESSAGE_LIMIT:
            text = text[: EVENT_MESSAGE_LIMIT - 3] + "..."
        kind: Literal["Normal", "Warning"] = (
            "Warning" if condition.reason in WARNING_REASONS else "Normal"
        )
        events.append(Event(type=kind, reason=condition.reason, message=text))
    return tuple(events)
