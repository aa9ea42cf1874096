"""One reconcile pass's decision: observed state in; children, status and events out. Pure.

`decide` is level-triggered: it looks only at what exists now (the spec, the stored
status, the owned children) and never at what event woke it, so create, update, resume,
the resync timer and child events all lead to the same answer.

One tree for every object: the engines it runs (`engines`: its own, or on a mixed GPU
fleet one per eligible GPU product, each decided as an object of one engine is), the
pods wanted and each engine's share of them, then the children and the status those
lead to.

Rollout order: a change of any engine input builds the new engine first; until the
build reports its digest, the runtime ConfigMap keeps the old engine and the batching
policy that went with it (a new policy may not fit the old engine), and only then does
the new config roll the Deployment, at once with the Rolling strategy, or after the
candidate passes its shadow test with the Shadow strategy (`kubeinfer.operator.rollout`
decides which engine serves and which runs as the candidate; this module only composes).

Writes: `Decision.apply` lists only the children that are missing or that no longer
carry every field the operator owns on them (`child_writes`, `drift.carries`: a changed
spec changes their input-hash annotation, a hand edit changes the field itself), so a
pass over an unchanged object writes nothing and a hand-edited child is re-applied;
`Decision.desired` lists them all (for `kubeinfer render`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec, InferenceDeploymentStatus
from kubeinfer.operator.quality.fallback import fallback_spec
from kubeinfer.operator.quality.reference import reference_spec
from kubeinfer.operator.quality.report import QualityReport
from kubeinfer.operator.reconcile import desired as build
from kubeinfer.operator.reconcile import desired_activator
from kubeinfer.operator.reconcile.child_writes import needs_write
from kubeinfer.operator.reconcile.cost_status import cost_record
from kubeinfer.operator.reconcile.decide_quality import (
    quality_report,
    reference_children,
)
from kubeinfer.operator.reconcile.decide_runtime import runtime_children
from kubeinfer.operator.reconcile.decide_scaling import recommendation as recommended_count
from kubeinfer.operator.reconcile.decide_scaling import scaling as scaling_of
from kubeinfer.operator.reconcile.desired_build import build_engine_job
from kubeinfer.operator.reconcile.engines import (
    EnginePass,
    engine_passes,
    retired_runtimes,
)
from kubeinfer.operator.reconcile.events import product_events, transition_events
from kubeinfer.operator.reconcile.known_answers import decide_answers
from kubeinfer.operator.reconcile.reads import Reads, signals_to_read
from kubeinfer.operator.reconcile.requeue import requeue_after
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress
from kubeinfer.operator.reconcile.scaling_status import ScalingReport
from kubeinfer.operator.reconcile.slo_status import slo_report
from kubeinfer.operator.reconcile.status import compute_status, forbidden_status, invalid_status
from kubeinfer.operator.rollout.report import ShadowReport, report
from kubeinfer.operator.rollout.shadow import shadow_replaced_event
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state.decision import Decision, Event
from kubeinfer.operator.state.engine_state import EngineState, stale_jobs
from kubeinfer.operator.state.known_answers import AnswersReport
from kubeinfer.operator.state.observed import KubeObject, ObservedState, OwnerRef


def _build_jobs(
    owner: OwnerRef, settings: OperatorSettings, passes: Sequence[EnginePass]
) -> list[KubeObject]:
    """The build Jobs this pass wants: each engine's, then the quality watch's reference
    and fallback engines' (the fallback only when it is not the reference), each built
    from the spec it stands for."""
    builds: list[tuple[InferenceDeploymentSpec, EngineState]] = []
    for each in passes:
        builds.append((each.view.spec, each.engine))
        if each.reference is not None:
            builds.append((reference_spec(each.view.spec), each.reference))
        if each.fallback is not None and each.fallback is not each.reference:
            builds.append((fallback_spec(each.view.spec), each.fallback))
    return [
        build_engine_job(owner, of, settings, state.build_key, state.job_attempt)
        for of, state in builds
        if state.job_attempt is not None
    ]


def _deletions(
    observed: ObservedState,
    passes: Sequence[EnginePass],
    rollouts: Sequence[RolloutProgress],
    total: int,
) -> tuple[tuple[str, str], ...]:
    """What goes: the unfinished build Jobs of inputs no engine of the object has (sorted),
    the runtime children of engines it no longer runs, the candidate's children when no
    candidate runs, the reference's when the watch needs none."""
    stale = stale_jobs(observed, (key for each in passes for key in each.build_keys))
    found: list[tuple[str, KubeObject | None]] = []
    if not any(each.plan.candidate for each in passes):  # Failed, Aborted, Promoted, replaced
        found += [
            ("Deployment", observed.candidate_deployment),
            ("Service", observed.candidate_service),
            ("ConfigMap", observed.candidate_configmap),
        ]
    if not any(each.reference for each in passes):  # the quality watch is off
        found += [
            ("Deployment", observed.reference_deployment),
            ("Service", observed.reference_service),
            ("ConfigMap", observed.reference_configmap),
        ]
    return (
        *(("Job", name) for name in stale),
        *retired_runtimes(observed, passes, rollouts, total),
        *((kind, child["metadata"]["name"]) for kind, child in found if child),
    )


def _events(
    observed: ObservedState,
    status: InferenceDeploymentStatus,
    passes: Sequence[EnginePass],
    scaling: ScalingReport | None,
    answers: AnswersReport | None = None,
) -> tuple[Event, ...]:
    """The Events of this pass: the conditions' transitions, a replaced candidate, a
    fleet's products whose engine changed, the autoscaler's changes, the pods taken out
    of serving for wrong answers."""
    events = transition_events(observed.status.conditions, status.conditions)
    for each in passes:
        if each.plan.replaced is not None:
            events += (shadow_replaced_event(each.plan.replaced, each.plan.record),)
    events += product_events(observed.status.engines, status.engines)
    if scaling is not None:
        events += scaling.events
    if answers is not None:
        events += answers.events
    return events


def _shadow(passes: Sequence[EnginePass]) -> ShadowReport:
    """What a shadow rollout adds to the status: the report of the engine that has one
    (a fleet's products roll out Rolling, by the spec's rules, and have none)."""
    reports = (report(each.view.spec, each.plan) for each in passes)
    return next((r for r in reports if r != ShadowReport()), ShadowReport())


def _quality(
    observed: ObservedState, wanted: Reads, passes: Sequence[EnginePass], now: datetime
) -> QualityReport:
    """The quality watch's status and drift, of the engine it watches (none on a fleet),
    on the window the gather step read."""
    reading = observed.quality if wanted.quality is not None else None
    for each in passes:
        if each.reference is not None:
            serving, held = each.plan.serving, each.held
            return quality_report(
                each.view, reading, serving, each.engine, each.reference, now, held
            )
    return QualityReport()


def decide(observed: ObservedState, settings: OperatorSettings, now: datetime) -> Decision:
    """The children that should exist, the status and the events for one pass: the pods
    wanted, the engines' states and rollout plans (which engine serves, which runs as a
    shadow candidate) with each one's share of the pods, then the children and the status
    they lead to."""
    now = now.replace(microsecond=0)  # metav1.Time has whole seconds
    spec, owner = observed.spec, observed.owner
    wanted = signals_to_read(observed, now)  # what the gather step read beyond the objects
    signals = observed.scaling_signals if wanted.scaling_signals else None
    slo = slo_report(spec.slo, signals, observed.status.slo, now)
    recommendation = recommended_count(observed, now, slo)
    total = recommendation.replicas if recommendation is not None else build.desired_replicas(spec)
    passes = engine_passes(observed, wanted, settings, now, total)
    pvc = build.build_cache_pvc(owner, spec)
    children = [pvc] if pvc is not None else []
    children += _build_jobs(owner, settings, passes)
    passes, rollouts, runtime = runtime_children(settings, passes)
    children += runtime
    for each in passes:
        if each.reference is not None:
            children += reference_children(each.view, settings, each.reference)
    wake = observed.wake_signals if wanted.wake_signals else None
    addresses = wake.activator_addresses if wake is not None else ()
    counted = observed.serving_pods if wanted.serving_pods else None
    ready = counted.ready if counted is not None else 0
    routed = desired_activator.routing(observed, children, total, ready, addresses, settings)
    children = list(routed.children)
    scaling = scaling_of(observed, recommendation, now)
    quality = _quality(observed, wanted, passes, now)
    read = observed.answers if wanted.answers else None
    answers = decide_answers(read, now) if read is not None else None
    cost = cost_record(observed, wanted, now)
    status = compute_status(
        observed, passes, rollouts, total, now, _shadow(passes), scaling, quality, slo, answers,
        cost,
    )  # fmt: skip
    return Decision(
        apply=tuple(child for child in children if needs_write(child, observed)),
        delete=(*_deletions(observed, passes, rollouts, total), *routed.deletions),
        status=status,
        events=_events(observed, status, passes, scaling, answers),
        requeue_after_seconds=_sooner(
            requeue_after(
                settings.requeue,
                [(each.engine, each.fallback) for each in passes],
                now,
                shadowing=any(each.plan.shadowing or each.plan.promoting for each in passes),
                autoscaling=spec.autoscaling.enabled,
                watching=any(each.reference is not None for each in passes),
            ),
            answers.requeue_after_seconds if answers is not None else None,
        ),
        desired=tuple(children),
        scaling_history=recommendation.history if recommendation else None,
        answers=answers,
        activator_route=desired_activator.route(observed),
    )


def _sooner(*delays: float | None) -> float | None:
    """The earliest of the passes asked for (None: none asked)."""
    asked = [delay for delay in delays if delay is not None]
    return min(asked) if asked else None


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
