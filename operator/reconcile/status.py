"""The InferenceDeployment's status; the Events of its transitions are `events`'s. Pure.

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
table, over every engine the object runs. What differs on a mixed GPU fleet is only
what its status shows of its engines: `status.engines`, a line per GPU product (and an
Event per product whose engine changes, `events`), instead of `status.engine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec, InferenceDeploymentStatus
from kubeinfer.operator.api.v1alpha1.conditions import (
    Condition,
    ConditionStatus,
    ConditionType,
    ConditionValue,
    Reason,
    set_condition,
)
from kubeinfer.operator.api.v1alpha1.gpu_fleet import ProductEnginePhase, ProductEngineStatus
from kubeinfer.operator.api.v1alpha1.inference_deployment import (
    EngineBatchingStatus,
    EngineStatus,
    Phase,
    RolloutStrategy,
    VersionStatus,
    in_fleet_mode,
)
from kubeinfer.operator.api.v1alpha1.status import CostStatus
from kubeinfer.operator.quality.report import QualityReport
from kubeinfer.operator.reconcile.engines import EnginePass
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress
from kubeinfer.operator.reconcile.scaling_status import ScalingReport
from kubeinfer.operator.reconcile.situation import (
    EngineFacts,
    Facts,
    Situation,
    SituationKind,
    cut,
    situation_of,
    summary_conditions,
)
from kubeinfer.operator.reconcile.slo_status import SloReport
from kubeinfer.operator.rollout.report import ShadowReport
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import EnginePhase, EngineState
from kubeinfer.operator.state.known_answers import AnswersReport
from kubeinfer.operator.state.observed import ObservedState

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE

HOSTNAME_LABEL = "kubernetes.io/hostname"
ENGINE_READY = {
    EnginePhase.PINNED: (TRUE, Reason.ENGINE_PINNED),
    EnginePhase.BUILT: (TRUE, Reason.ENGINE_BUILT),
    EnginePhase.BUILDING: (FALSE, Reason.ENGINE_BUILDING),
    EnginePhase.FAILED: (FALSE, Reason.ENGINE_BUILD_FAILED),
}
"""EngineReady's status and reason for each phase of the spec's engine."""


def compute_status(
    observed: ObservedState,
    passes: Sequence[EnginePass],
    rollouts: Sequence[RolloutProgress],
    total: int,
    now: datetime,
    shadow: ShadowReport | None = None,
    scaling: ScalingReport | None = None,
    quality: QualityReport | None = None,
    slo: SloReport | None = None,
    answers: AnswersReport | None = None,
    cost: CostStatus | None = None,
) -> InferenceDeploymentStatus:
    """The whole status for this pass: `passes` are the engines the object runs (its own,
    or each eligible GPU product's, with its share of the pods), `rollouts` each one's
    roll, `total` the pods wanted over all of them (a fleet's shares hold more while pods
    move); `shadow` is what a shadow rollout adds, `scaling` what the autoscaler adds
    (None: autoscaling is off), `quality` what the quality watch adds (None: it is off),
    `cost` the cost of 1,000 inferences (None: no price is set)."""
    quality = quality or QualityReport()
    generation, previous = observed.owner.generation, observed.status
    facts = _facts(observed, passes, rollouts, total, shadow or ShadowReport(), quality)
    ready = sum(rollout.ready_replicas for rollout in rollouts)
    situation = situation_of(facts)
    summary = summary_conditions(situation)
    values: list[tuple[ConditionType, ConditionValue | None]] = [
        (ConditionType.READY, summary.ready),
        (
            ConditionType.ENGINE_READY,
            engine_ready(facts, situation, _own_batching(observed, passes)),
        ),
        (ConditionType.AVAILABLE, availability(facts)),
        (ConditionType.PROGRESSING, summary.progressing),
        (ConditionType.DEGRADED, summary.degraded),
        (ConditionType.RECONCILING, summary.reconciling),
        (ConditionType.STALLED, summary.stalled),
        # Shown only where the feature that writes them is on:
        (ConditionType.SHADOW_PASSED, facts.shadow.shadow_passed),
        (ConditionType.CACHE_ATTACH_RISK, cache_attach_risk(observed)),
        (ConditionType.SCALING_ACTIVE, scaling.active if scaling else None),
        (ConditionType.SCALING_LIMITED, scaling.limited if scaling else None),
        (ConditionType.SCALED_TO_ZERO, scaling.scaled_to_zero if scaling else None),
        (ConditionType.SLO_MET, slo.condition if slo else None),
        (ConditionType.ANSWERS_CORRECT, _answers_condition(observed, answers)),
    ]
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "phase": Phase.PENDING if facts.fleet and not passes else summary.phase,
            "conditions": set_or_remove(previous.conditions, values, generation, now),
            **engine_records(observed, passes, rollouts),
            "serving": serving_record(previous.serving, facts),
            "replicas": total,
            "ready_replicas": ready,
            "ready": f"{ready}/{total}",
            "selector": names.selector_string(names.serving_selector(observed.owner.name)),
            "candidate": next((p.plan.record for p in passes if p.plan.record), None),
            "autoscaling": scaling.autoscaling if scaling else None,
            "metrics": scaling.metrics if scaling else previous.metrics,
            "quality_watch": quality.status,
            "slo": slo.status if slo else None,
            "cost": cost,
            **_answers_records(observed, answers),
        }
    )


def _answers_condition(
    observed: ObservedState, answers: AnswersReport | None
) -> ConditionValue | None:
    """AnswersCorrect as this pass' verdicts say; as stored on a pass that read none;
    absent while spec.knownAnswers leaves the checks off (as the other features' own
    conditions are while they are off)."""
    if observed.spec.known_answers is None:
        return None
    if answers is not None:
        return answers.condition
    for condition in observed.status.conditions:
        if condition.type == ConditionType.ANSWERS_CORRECT:
            return (condition.status, Reason(condition.reason), condition.message)
    return None


def _answers_records(observed: ObservedState, answers: AnswersReport | None) -> dict[str, object]:
    """The pods taken out, as this pass read them; none listed while the checks are off
    (pods taken out before keep their label and annotation)."""
    if observed.spec.known_answers is None:
        return {"wrong_answers": [], "suspect_nodes": []}
    if answers is None:
        return {}
    return {
        "wrong_answers": list(answers.wrong_answers),
        "suspect_nodes": list(answers.suspect_nodes),
    }


def _facts(
    observed: ObservedState,
    passes: Sequence[EnginePass],
    rollouts: Sequence[RolloutProgress],
    replicas: int,
    shadow: ShadowReport,
    quality: QualityReport,
) -> Facts:
    """What `situation_of` chooses the summary from: each engine's state, the engine its
    runtime runs, its roll and its runtime pods' failure (read against the engine its
    Deployment runs: pods of another are on their way out), and the deciders' reports."""
    engines = tuple(
        EngineFacts(
            engine=each.engine,
            serving=each.plan.serving,
            version=observed.spec.model.version,
            failure=each.failure,
            rollout=rollout,
            product=each.product,
            nodes=each.capacity.nodes if each.capacity else 0,
        )
        for each, rollout in zip(passes, rollouts, strict=True)
    )
    return Facts(
        engines=engines,
        version=observed.spec.model.version,
        replicas=replicas,
        shadow=shadow,
        quality_drift=quality.drift,
        fallback=quality.fallback,
        fleet=in_fleet_mode(observed.spec),
        no_products=_no_products(observed.spec),
    )


def _no_products(spec: InferenceDeploymentSpec) -> str:
    """Why a mixed fleet has no engine: no GPU node is eligible."""
    fleet = spec.runtime.gpu_fleet
    listed = ", ".join(p.name for p in fleet.products) if fleet and fleet.products else ""
    return (
        "No GPU node is eligible: none carries an nvidia.com/gpu.product label "
        "(GPU feature discovery) with allocatable nvidia.com/gpu"
        + (f" of the products {listed}" if listed else "")
        + " and matches runtime.nodeSelector with its taints tolerated by runtime.tolerations."
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


def engine_ready(facts: Facts, situation: Situation, batching: str = "") -> ConditionValue:
    """EngineReady: True once every engine is built (or pinned), with what the engine
    says (and, for the object's own engine, `batching`: what its build found of whether
    the model batches, where it does not or is not known to; on a fleet, which products
    have one); while one is not, why, followed by what keeps serving meanwhile."""
    if facts.fleet and not facts.engines:
        return FALSE, Reason.NO_GPU_NODES, situation.message
    if situation.kind == SituationKind.BUILD_FAILED:
        return FALSE, Reason.ENGINE_BUILD_FAILED, situation.message + situation.keeps_serving
    if situation.kind == SituationKind.BUILDING:
        return FALSE, Reason.ENGINE_BUILDING, situation.message + situation.keeps_serving
    if not facts.fleet:
        (one,) = facts.engines
        return *ENGINE_READY[one.engine.phase], one.engine.message + batching
    products = ", ".join(str(each.product) for each in facts.engines)
    built = f"Engines built for {len(facts.engines)} GPU products: {products}."
    return TRUE, Reason.ENGINE_BUILT, cut(built)


def _own_batching(observed: ObservedState, passes: Sequence[EnginePass]) -> str:
    """`batching_said` of the object's own engine (a fleet's products say nothing)."""
    if in_fleet_mode(observed.spec) or len(passes) != 1:
        return ""
    return batching_said(observed, passes[0].engine)


def batching_record(observed: ObservedState, engine: EngineState) -> EngineBatchingStatus | None:
    """status.engine.batching: what the build found, with the maxBatchSize the runtime
    serves with (the spec's where the model batches, 1 where it does not). A fleet's
    engines carry none (status.engines)."""
    found = engine.batching
    if found is None or not engine.ready:
        return None
    configured = observed.spec.runtime.batching.max_batch_size
    effective = (
        {True: configured, False: 1}.get(found.batches) if found.batches is not None else None
    )
    return EngineBatchingStatus(
        batches=found.batches, max_batch_size=effective, reason=found.reason
    )


def batching_said(observed: ObservedState, engine: EngineState | None = None) -> str:
    """What EngineReady's message adds of the build's finding for the object's own engine
    (`engine`, else its recorded one; nothing on a fleet): nothing where the model
    batches; where it does not, that it is served one request per run, with maxBatchSize
    in effect and the spec's set aside; where it was not found out, that the runtime finds
    out at start."""
    if engine is None:
        return ""
    record = batching_record(observed, engine)
    if record is None or record.batches is True:
        return ""
    if record.batches is None:
        return (
            f" Whether the model batches was not found out at build ({record.reason}); the "
            "runtime finds out at start."
        )
    configured = observed.spec.runtime.batching.max_batch_size
    set_aside = (
        f"; runtime.batching.maxBatchSize {configured} is set aside" if configured > 1 else ""
    )
    return (
        f" The model does not batch ({record.reason}): the runtime serves it one request per "
        f"run, maxBatchSize 1 in effect{set_aside}."
    )


def availability(facts: Facts) -> ConditionValue:
    """Available: is anything serving, whichever version it is?"""
    existing = [each.rollout for each in facts.engines if each.rollout.exists]
    said = cut(" ".join(f"{rollout.message}." for rollout in existing))
    if any(rollout.available for rollout in existing):
        return TRUE, Reason.DEPLOYMENT_AVAILABLE, said
    if existing:
        return FALSE, Reason.DEPLOYMENT_UNAVAILABLE, said
    if facts.fleet:
        return (
            FALSE,
            Reason.WAITING_FOR_ENGINE,
            "No runtime pods: no GPU product's engine is built yet.",
        )
    serves = any(each.serving for each in facts.engines)
    waiting = Reason.DEPLOYMENT_UNAVAILABLE if serves else Reason.WAITING_FOR_ENGINE
    return FALSE, waiting, f"No runtime pods: {facts.engines[0].rollout.message}."


def serving_record(previous: VersionStatus | None, facts: Facts) -> VersionStatus | None:
    """status.serving: the version every serving pod runs once every roll is complete,
    with one engine its digest too (a fleet's products each have their own, in
    status.engines); until then what it was."""
    versions = {each.serving.version for each in facts.engines if each.serving is not None}
    if len(versions) != 1 or not facts.complete:
        return previous
    version = versions.pop()
    if facts.fleet:
        return VersionStatus(version=version)
    (one,) = facts.engines
    return VersionStatus(version=version, engine_digest=one.serving.digest if one.serving else None)


def engine_records(
    observed: ObservedState, passes: Sequence[EnginePass], rollouts: Sequence[RolloutProgress]
) -> dict[str, object]:
    """status.engine for the object's own engine, with the build key it was built from
    once it is; on a fleet, a line per eligible product in status.engines (its engine,
    nodes and pods) and status.enginesReady, the built engines counted, for `kubectl get
    -o wide`."""
    if not in_fleet_mode(observed.spec):
        (one,) = passes
        spec, engine = observed.spec.engine, one.engine
        record = EngineStatus(
            digest=engine.digest,
            backend=spec.backend,
            precision=spec.precision,
            target=engine.target,
            max_batch_size=spec.max_batch_size,
            build_key=engine.build_key if engine.digest else None,
            batching=batching_record(observed, engine),
        )
        return {"engine": record}
    built = sum(1 for each in passes if each.engine.ready)
    return {
        "engine": None,
        "engines": [
            product_record(each, rollout) for each, rollout in zip(passes, rollouts, strict=True)
        ],
        "engines_ready": f"{built}/{len(passes)}",
    }


PRODUCT_PHASES = {
    EnginePhase.BUILT: ProductEnginePhase.BUILT,
    EnginePhase.BUILDING: ProductEnginePhase.BUILDING,
    EnginePhase.FAILED: ProductEnginePhase.FAILED,
}


def product_record(each: EnginePass, rollout: RolloutProgress) -> ProductEngineStatus:
    """A fleet's line for one GPU product in status.engines."""
    engine, capacity = each.engine, each.capacity
    return ProductEngineStatus(
        gpu_product=each.product or "",
        phase=PRODUCT_PHASES.get(engine.phase, ProductEnginePhase.BUILDING),
        digest=engine.digest,
        target=engine.target,
        build_key=engine.build_key if engine.digest else None,
        nodes=capacity.nodes if capacity else 0,
        gpus=capacity.gpus if capacity else 0,
        replicas=each.replicas,
        ready_replicas=rollout.ready_replicas,
        message=cut(engine.message),
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
