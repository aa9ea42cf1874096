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

Which situation wins (a failed build over one under way over failing pods over a
stalled rollout over a shadow rollout's say), and what it makes of Ready, Progressing,
Degraded, Reconciling, Stalled and the phase, is written once: `situation`'s chain and
table. `rollout_progress` is re-exported for `decide`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus
from kubeinfer.operator.api.v1alpha1.conditions import (
    Condition,
    ConditionStatus,
    ConditionType,
    ConditionValue,
    Reason,
    set_condition,
)
from kubeinfer.operator.api.v1alpha1.inference_deployment import (
    EngineStatus,
    Phase,
    RolloutStrategy,
    VersionStatus,
)
from kubeinfer.operator.quality.report import QualityReport
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress as RolloutProgress
from kubeinfer.operator.reconcile.rollout_progress import rollout_progress as rollout_progress
from kubeinfer.operator.reconcile.scaling_status import ScalingReport
from kubeinfer.operator.reconcile.situation import Facts, situation_of, summary_conditions
from kubeinfer.operator.reconcile.slo_status import SloReport
from kubeinfer.operator.rollout.report import ShadowReport
from kubeinfer.operator.rollout.shadow import RolloutPlan
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import EnginePhase, EngineState, ServingEngine
from kubeinfer.operator.state.runtime_failures import runtime_failure
from kubeinfer.operator.state.snapshot import Event, ObservedState

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
        Reason.QUALITY_DRIFT,
        Reason.QUALITY_FALLBACK,
        Reason.SLO_MISSED,
    }
)
HOSTNAME_LABEL = "kubernetes.io/hostname"
EVENT_MESSAGE_LIMIT = 1024
MIRRORED = frozenset({ConditionType.RECONCILING, ConditionType.STALLED})
ENGINE_READY = {
    EnginePhase.PINNED: (TRUE, Reason.ENGINE_PINNED),
    EnginePhase.BUILT: (TRUE, Reason.ENGINE_BUILT),
    EnginePhase.BUILDING: (FALSE, Reason.ENGINE_BUILDING),
    EnginePhase.FAILED: (FALSE, Reason.ENGINE_BUILD_FAILED),
}
"""EngineReady's status and reason for each phase of the spec's engine."""


def compute_status(
    observed: ObservedState,
    engine: EngineState,
    plan: RolloutPlan,
    shadow: ShadowReport,
    rollout: RolloutProgress,
    replicas: int,
    now: datetime,
    scaling: ScalingReport | None = None,
    quality: QualityReport | None = None,
    slo: SloReport | None = None,
) -> InferenceDeploymentStatus:
    """The whole status for this pass; `plan.serving` is the engine the desired runtime
    runs, `shadow` what a shadow rollout adds, `scaling` what the autoscaler adds (None:
    autoscaling is off), `quality` what the quality watch adds (None: it is off)."""
    quality = quality or QualityReport()
    generation, serving, previous = observed.owner.generation, plan.serving, observed.status
    facts = _facts(observed, engine, serving, shadow, rollout, replicas, quality)
    summary = summary_conditions(situation_of(facts))
    values: list[tuple[ConditionType, ConditionValue | None]] = [
        (ConditionType.READY, summary.ready),
        (ConditionType.ENGINE_READY, engine_ready(engine, facts.keeps_serving)),
        (ConditionType.AVAILABLE, availability(rollout, serving)),
        (ConditionType.PROGRESSING, summary.progressing),
        (ConditionType.DEGRADED, summary.degraded),
        (ConditionType.RECONCILING, summary.reconciling),
        (ConditionType.STALLED, summary.stalled),
        # Shown only where the feature that writes them is on:
        (ConditionType.SHADOW_PASSED, shadow.shadow_passed),
        (ConditionType.CACHE_ATTACH_RISK, cache_attach_risk(observed)),
        (ConditionType.SCALING_ACTIVE, scaling.active if scaling else None),
        (ConditionType.SCALING_LIMITED, scaling.limited if scaling else None),
        (ConditionType.SLO_MET, slo.condition if slo else None),
    ]
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "phase": summary.phase,
            "conditions": set_or_remove(previous.conditions, values, generation, now),
            "engine": engine_record(observed, engine),
            "serving": serving_record(previous.serving, serving, rollout),
            "replicas": replicas,
            "ready_replicas": rollout.ready_replicas,
            "ready": f"{rollout.ready_replicas}/{replicas}",
            "selector": names.selector_string(names.serving_selector(observed.owner.name)),
            "candidate": plan.record,
            "autoscaling": scaling.autoscaling if scaling else None,
            "metrics": scaling.metrics if scaling else previous.metrics,
            "quality_watch": quality.status,
            "slo": slo.status if slo else None,
        }
    )


def _facts(
    observed: ObservedState,
    engine: EngineState,
    serving: ServingEngine | None,
    shadow: ShadowReport,
    rollout: RolloutProgress,
    replicas: int,
    quality: QualityReport,
) -> Facts:
    """What `situation_of` chooses the summary from: the deciders' reports for this pass
    and the runtime pods' failure, read against the engine the Deployment runs."""
    return Facts(
        engine=engine,
        serving=serving,
        version=observed.spec.model.version,
        # Pods of an engine the Deployment no longer runs are on their way out.
        failure=runtime_failure(observed.runtime_pods, digest=serving.digest if serving else None),
        rollout=rollout,
        shadow=shadow,
        replicas=replicas,
        quality_drift=quality.drift,
        fallback=quality.fallback,
    )


def set_or_remove(
    conditions: list[Condition],
    values: Sequence[tuple[ConditionType, ConditionValue | None]],
    generation: int,
    now: datetime,
) -> list[Condition]:
    """`conditions` with each of `values` set in order (`set_condition`: an unchanged
    status keeps its lastTransitionTime, a new type is appended) and each type whose value
    is None removed (the part that writes it is off, or has nothing to say)."""
    absent = {type_ for type_, value in values if value is None}
    result = [condition for condition in conditions if condition.type not in absent]
    for type_, value in values:
        if value is not None:
            result = set_condition(result, type_, *value, generation, now)
    return result


def engine_ready(engine: EngineState, keeps_serving: str) -> ConditionValue:
    """EngineReady: the phase's status and reason, and the engine's message; while it is
    not ready, followed by what keeps serving meanwhile."""
    status, reason = ENGINE_READY[engine.phase]
    return status, reason, engine.message if status == TRUE else engine.message + keeps_serving


def availability(rollout: RolloutProgress, serving: ServingEngine | None) -> ConditionValue:
    """Available: is anything serving, whichever version it is?"""
    if not rollout.exists:
        waiting = Reason.WAITING_FOR_ENGINE if serving is None else Reason.DEPLOYMENT_UNAVAILABLE
        return FALSE, waiting, f"No runtime pods: {rollout.message}."
    if rollout.available:
        return TRUE, Reason.DEPLOYMENT_AVAILABLE, f"{rollout.message}."
    return FALSE, Reason.DEPLOYMENT_UNAVAILABLE, f"{rollout.message}."


def serving_record(
    previous: VersionStatus | None, serving: ServingEngine | None, rollout: RolloutProgress
) -> VersionStatus | None:
    """status.serving: the version and engine every serving pod runs once the roll is
    complete; until then what it was."""
    if serving is not None and rollout.complete:
        return VersionStatus(version=serving.version, engine_digest=serving.digest)
    return previous


def engine_record(observed: ObservedState, engine: EngineState) -> EngineStatus:
    """status.engine: the spec's engine, with the build key it was built from once it is."""
    spec = observed.spec.engine
    return EngineStatus(
        digest=engine.digest,
        backend=spec.backend,
        precision=spec.precision,
        target=engine.target,
        max_batch_size=spec.max_batch_size,
        build_key=engine.build_key if engine.digest else None,
    )


def invalid_status(
    status: InferenceDeploymentStatus, message: str, generation: int, now: datetime
) -> InferenceDeploymentStatus:
    """Degraded=True, Stalled=True, Ready=False and Reconciling=False with reason
    InvalidSpec; the rest is kept, since the children of the last valid spec are left as
    they are."""
    values = [
        (type_, (value, Reason.INVALID_SPEC, message))
        for type_, value in (
            (ConditionType.READY, FALSE),
            (ConditionType.DEGRADED, TRUE),
            (ConditionType.RECONCILING, FALSE),
            (ConditionType.STALLED, TRUE),
        )
    ]
    conditions = set_or_remove(status.conditions, values, generation, now)
    return status.model_copy(
        update={"observed_generation": generation, "phase": Phase.FAILED, "conditions": conditions}
    )


def forbidden_status(
    status: InferenceDeploymentStatus, message: str, generation: int, now: datetime
) -> InferenceDeploymentStatus:
    """`status` with Degraded=True and Ready=False, reason Forbidden: the API server
    refused the operator a write its Role does not allow, so what the spec asks cannot be
    made until the Role is fixed. The next pass that gets through clears it."""
    values = [
        (ConditionType.READY, (FALSE, Reason.FORBIDDEN, message)),
        (ConditionType.DEGRADED, (TRUE, Reason.FORBIDDEN, message)),
    ]
    conditions = set_or_remove(status.conditions, values, generation, now)
    return status.model_copy(update={"conditions": conditions})


def _mounting(shadow: bool, watched: bool) -> str:
    """Which runtime pods the CacheAttachRisk message counts, when not serving's alone."""
    pods = [
        "serving",
        *(["shadow candidate"] if shadow else []),
        *(["quality reference"] if watched else []),
    ]
    if len(pods) == 1:
        return ""
    return f" ({', '.join(pods[:-1])} and {pods[-1]})"


def cache_attach_risk(observed: ObservedState) -> tuple[ConditionStatus, Reason, str] | None:
    """The CacheAttachRisk condition, or None where there is none. The claim the operator
    creates defaults to ReadWriteOnce, the one access mode every storage class offers, and
    such a volume attaches to one node at a time: a runtime pod (or a shadow candidate, or
    a build Job) scheduled on another node waits in ContainerCreating with a Multi-Attach
    error. The operator does not pin the pods to one node for it (that would stop the
    spreading of GPU pods, and classes such as NFS mount ReadWriteOnce volumes on several
    nodes anyway); it warns, with what to change, whenever more than one runtime pod may
    mount the claim: more than one replica (autoscaling's maximum when autoscaling), a
    shadow candidate or the quality watch's reference beside the serving pods. The
    observed claim's access modes win over the spec's, since a claim's are fixed at
    creation. No warning for an existing claim
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
    watched = spec.quality_watch.enabled
    if watched:
        pods += 1  # the quality watch's reference pod
    if pods <= 1:
        return None
    claim = names.cache_claim_name(observed.owner.name)
    return (
        TRUE,
        Reason.READ_WRITE_ONCE_ACROSS_NODES,
        f"The engine cache claim {claim} is {'/'.join(modes)} and up to {pods} runtime pods"
        f"{_mounting(shadow, watched)} mount it, plus a build Job "
        "while an engine builds: the volume attaches to one node, so a pod scheduled on "
        "another waits in ContainerCreating (Multi-Attach error). Set "
        "engine.cache.accessMode ReadWriteMany on a storage class that supports it, name a "
        "shareable engine.cache.existingClaim, or keep the pods on one node "
        f"(runtime.nodeSelector {HOSTNAME_LABEL}).",
    )


def transition_events(before: list[Condition], after: list[Condition]) -> tuple[Event, ...]:
    """An Event per piece of news: the conditions whose status or reason changed (or that
    are new), one Event per reason, Warning for failure reasons. Conditions that change
    together for one reason are one piece of news (an engine starting to build makes
    Ready, EngineReady and Progressing say EngineBuilding: one Event names the three).
    Not news: Reconciling and Stalled, which mirror Progressing and Degraded; a new object
    not being Degraded, or not yet Available; and Available changing its reason while it
    stays False (it announces when pods start or stop serving; why none serve is Ready's
    and Degraded's news)."""
    old = {c.type: c for c in before}
    news: dict[str, list[Condition]] = {}
    for condition in after:
        previous = old.get(condition.type)
        if condition.type in MIRRORED or not _is_news(previous, condition):
            continue
        news.setdefault(condition.reason, []).append(condition)
    return tuple(_event(reason, conditions) for reason, conditions in news.items())


def _is_news(previous: Condition | None, condition: Condition) -> bool:
    if previous is None:
        quiet = {ConditionType.DEGRADED, ConditionType.AVAILABLE}
        return not (condition.type in quiet and condition.status == FALSE)
    if previous.status != condition.status:
        return True
    return previous.reason != condition.reason and not (
        condition.type == ConditionType.AVAILABLE and condition.status == FALSE
    )


def _event(reason: str, conditions: list[Condition]) -> Event:
    """One Event for the conditions that changed for `reason`: `A is S, B is T: message`
    when they say the same, each one's `A is S: message` otherwise."""
    said = [f"{c.type} is {c.status}" for c in conditions]
    messages = [c.message for c in conditions]
    if len(set(messages)) == 1:
        text = ", ".join(said) + (f": {messages[0]}" if messages[0] else "")
    else:
        text = "; ".join(f"{s}: {m}" if m else s for s, m in zip(said, messages, strict=True))
    if len(text) > EVENT_MESSAGE_LIMIT:
        text = text[: EVENT_MESSAGE_LIMIT - 3] + "..."
    kind: Literal["Normal", "Warning"] = "Warning" if reason in WARNING_REASONS else "Normal"
    return Event(type=kind, reason=reason, message=text)
