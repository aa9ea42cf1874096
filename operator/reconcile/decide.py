"""One reconcile pass's decision: observed state in; children, status and events out. Pure.

`decide` is level-triggered: it looks only at what exists now (the spec, the stored
status, the owned children) and never at what event woke it, so create, update, resume,
the resync timer and child events all lead to the same answer.

Rollout order: a change of any engine input builds the new engine first; until the
build reports its digest, the runtime ConfigMap keeps the old engine and the batching
policy that went with it (a new policy may not fit the old engine), and only then does
the new config roll the Deployment, at once with the Rolling strategy, or after the
candidate passes its shadow test with the Shadow strategy (`kubeinfer.operator.rollout`
decides which engine serves and which runs as the candidate; this module only composes).

An object on a mixed GPU fleet (backend tensorrt without a pin or a single gpuProduct)
is decided by `decide_fleet`: an engine per GPU product, each decided as one engine.

Writes: `Decision.apply` lists only the children that are missing or that no longer
carry every field the operator owns on them (`child_writes`, `drift.carries`: a changed
spec changes their input-hash annotation, a hand edit changes the field itself), so a
pass over an unchanged object writes nothing and a hand-edited child is re-applied;
`Decision.desired` lists them all (for `kubeinfer render`).
"""

from __future__ import annotations

from datetime import datetime

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec, InferenceDeploymentStatus
from kubeinfer.operator.api.v1alpha1.gpu_fleet import in_fleet_mode
from kubeinfer.operator.quality.fallback import fallback_spec
from kubeinfer.operator.quality.reference import reference_spec
from kubeinfer.operator.reconcile import desired as build
from kubeinfer.operator.reconcile.child_writes import needs_write
from kubeinfer.operator.reconcile.decide_fleet import decide_fleet, fleet_leftovers
from kubeinfer.operator.reconcile.decide_quality import (
    fallback_engine,
    fallback_key,
    quality_report,
    reference_children,
    reference_engine,
    reference_leftovers,
)
from kubeinfer.operator.reconcile.decide_runtime import candidate_leftovers, runtime_children
from kubeinfer.operator.reconcile.decide_scaling import recommendation as recommended_count
from kubeinfer.operator.reconcile.decide_scaling import scaling as scaling_of
from kubeinfer.operator.reconcile.desired_build import build_engine_job
from kubeinfer.operator.reconcile.requeue import requeue_after
from kubeinfer.operator.reconcile.rollout_progress import available
from kubeinfer.operator.reconcile.scaling_status import ScalingReport
from kubeinfer.operator.reconcile.slo_status import slo_report
from kubeinfer.operator.reconcile.status import (
    compute_status,
    forbidden_status,
    invalid_status,
    transition_events,
)
from kubeinfer.operator.rollout.report import report
from kubeinfer.operator.rollout.shadow import (
    RolloutPlan,
    plan_rollout,
    shadow_replaced_event,
)
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state.engine_state import (
    EngineState,
    engine_state,
    observed_serving,
)
from kubeinfer.operator.state.snapshot import (
    Decision,
    Event,
    KubeObject,
    ObservedState,
    OwnerRef,
)


def _build_jobs(
    owner: OwnerRef,
    spec: InferenceDeploymentSpec,
    settings: OperatorSettings,
    engine: EngineState,
    reference: EngineState | None,
    fallback: EngineState | None,
) -> list[KubeObject]:
    """The build Jobs this pass wants: the spec's engine's, then the quality watch's
    reference and fallback engines' (the fallback only when it is not the reference), each
    built from the spec it stands for."""
    builds = [(spec, engine)]
    if reference is not None:
        builds.append((reference_spec(spec), reference))
    if fallback is not None and fallback is not reference:
        builds.append((fallback_spec(spec), fallback))
    return [
        build_engine_job(owner, of, settings, state.build_key, state.job_attempt)
        for of, state in builds
        if state.job_attempt is not None
    ]


def _plan(
    observed: ObservedState, engine: EngineState, fallback: EngineState | None, now: datetime
) -> RolloutPlan:
    """Which engine serves and which runs as the candidate. With drift and onDrift
    Fallback, serving rolls to the fallback engine once it exists, with no shadow test."""
    if fallback is not None:
        return plan_rollout(
            fallback_spec(observed.spec), fallback, observed_serving(observed),
            observed.status.candidate, {}, None, False, now,
        )  # fmt: skip
    return plan_rollout(
        observed.spec,
        engine,
        observed_serving(observed),
        observed.status.candidate,
        observed.annotations,
        observed.shadow,
        available(observed.candidate_deployment),
        now,
        candidate_pods=observed.candidate_pods,
    )


def _deletions(
    observed: ObservedState,
    plan: RolloutPlan,
    engines: tuple[EngineState | None, ...],
    reference: EngineState | None,
) -> tuple[tuple[str, str], ...]:
    """What goes: the stale build Jobs of `engines` (sorted, once each), the candidate's
    children when no candidate runs, the reference's when the watch needs none."""
    jobs = sorted({name for state in engines if state is not None for name in state.delete_jobs})
    return (
        *(("Job", name) for name in jobs),
        *candidate_leftovers(observed, plan),
        *reference_leftovers(observed, reference),
    )


def _events(
    observed: ObservedState,
    status: InferenceDeploymentStatus,
    plan: RolloutPlan,
    scaling: ScalingReport | None,
) -> tuple[Event, ...]:
    """The Events of this pass: the conditions' transitions, a replaced candidate, the
    autoscaler's changes."""
    events = transition_events(observed.status.conditions, status.conditions)
    if plan.replaced is not None:
        events += (shadow_replaced_event(plan.replaced, plan.record),)
    if scaling is not None:
        events += scaling.events
    return events


def decide(observed: ObservedState, settings: OperatorSettings, now: datetime) -> Decision:
    """The children that should exist, the status and the events for one pass: the
    engine's state, then the rollout plan (which engine serves, which runs as a shadow
    candidate), then the children and the status they lead to."""
    now = now.replace(microsecond=0)  # metav1.Time has whole seconds
    if in_fleet_mode(observed.spec):
        return decide_fleet(observed, settings, now)
    spec, owner = observed.spec, observed.owner
    reference = reference_engine(observed, settings, now)
    others = (*((reference.build_key,) if reference else ()), *fallback_key(spec, settings))
    engine = engine_state(observed, settings, now, others)
    held, fallback = fallback_engine(observed, settings, now, engine, reference)
    pvc = build.build_cache_pvc(owner, spec)
    children = [pvc] if pvc is not None else []
    children += _build_jobs(owner, spec, settings, engine, reference, fallback)

    plan = _plan(observed, engine, fallback, now)
    slo = slo_report(spec.slo, observed.scaling_signals, observed.status.slo, now)
    recommendation = recommended_count(observed, now, slo)
    replicas = (
        recommendation.replicas if recommendation is not None else build.desired_replicas(spec)
    )
    plan, rollout, runtime = runtime_children(
        observed, settings, plan, fallback or engine, engine, reference, replicas
    )
    children += runtime
    if reference is not None:
        children += reference_children(observed, settings, reference)
    scaling = scaling_of(observed, recommendation, now)
    watch_report = quality_report(observed, plan.serving, engine, reference, now, held)
    status = compute_status(
        observed, engine, plan, report(spec, plan), rollout, replicas, now, scaling, watch_report,
        slo,
    )  # fmt: skip
    return Decision(
        apply=tuple(child for child in children if needs_write(child, observed)),
        delete=(
            *_deletions(observed, plan, (engine, reference, fallback), reference),
            *fleet_leftovers(observed, rollout.complete),
        ),
        status=status,
        events=_events(observed, status, plan, scaling),
        requeue_after_seconds=requeue_after(
            settings.requeue,
            engine,
            fallback,
            now,
            shadowing=plan.shadowing or plan.promoting,
            autoscaling=spec.autoscaling.enabled,
            watching=reference is not None,
        ),
        desired=tuple(children),
        scaling_history=recommendation.history if recommendation else None,
    )


def decide_forbidden(
    owner: OwnerRef,
    decided: Decision,
    before: InferenceDeploymentStatus,
    message: str,
    now: datetime,
) -> Decision:
    """The pass' decision once the API server refused one of its writes with 403: its
    status marked Forbidden with the server's words, and the Events of that transition."""
    status = forbidden_status(decided.status, message, owner.generation, now.replace(microsecond=0))
    return Decision(status=status, events=transition_events(before.conditions, status.conditions))


def decide_invalid(
    owner: OwnerRef, status: InferenceDeploymentStatus, error: Exception | str, now: datetime
) -> Decision:
    """A spec the API server accepted but the model refuses (e.g. no CEL on the cluster):
    Degraded=True, Ready=False with reason InvalidSpec and the validation message. No
    child is touched, and nothing is requeued: only a new spec can fix it."""
    now = now.replace(microsecond=0)
    new = invalid_status(status, str(error), owner.generation, now)
    return Decision(status=new, events=transition_events(status.conditions, new.conditions))
