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

Writes: `Decision.apply` lists only the children that are missing or that no longer
carry every field the operator owns on them (`drift.carries`: a changed spec changes
their input-hash annotation, a hand edit changes the field itself), so a pass over an
unchanged object writes nothing and a hand-edited child is re-applied; `Decision.desired`
lists them all (for `kubeinfer render`).
"""

from __future__ import annotations

from datetime import datetime

import yaml
from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec, InferenceDeploymentStatus
from kubeinfer.operator.api.v1alpha1.enums import Backend
from kubeinfer.operator.quality.fallback import fallback_spec
from kubeinfer.operator.quality.reference import reference_spec
from kubeinfer.operator.reconcile import desired as build
from kubeinfer.operator.reconcile.decide_quality import (
    fallback_engine,
    fallback_key,
    quality_report,
    reference_children,
    reference_engine,
    reference_leftovers,
    watched_reference,
)
from kubeinfer.operator.reconcile.desired_mirror import build_mirror_configmap
from kubeinfer.operator.reconcile.desired_monitoring import build_pod_monitor
from kubeinfer.operator.reconcile.drift import carries
from kubeinfer.operator.reconcile.rollout_progress import available
from kubeinfer.operator.reconcile.scaling_status import scaling_report
from kubeinfer.operator.reconcile.slo_status import SloReport, slo_report
from kubeinfer.operator.reconcile.status import (
    compute_status,
    forbidden_status,
    invalid_status,
    rollout_progress,
    transition_events,
)
from kubeinfer.operator.rollout.report import report
from kubeinfer.operator.rollout.shadow import (
    RolloutPlan,
    plan_rollout,
    promotion_complete,
    shadow_replaced_event,
)
from kubeinfer.operator.scaling.recommend import recommend
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import (
    EnginePhase,
    EngineState,
    ServingEngine,
    agreement_for,
    engine_state,
    input_bytes_for,
    observed_serving,
)
from kubeinfer.operator.state.scaling_inputs import (
    Recommendation,
    ScalingSignals,
    ServingPods,
    SloMiss,
)
from kubeinfer.operator.state.snapshot import (
    Decision,
    KubeObject,
    ObservedState,
    OwnerRef,
)
from pydantic import ValidationError


def _spec_image(spec: InferenceDeploymentSpec, settings: OperatorSettings) -> str:
    return settings.images.image_for(spec.runtime.image, spec.engine.backend == Backend.TENSORRT)


def _serving_image(
    observed: ObservedState, settings: OperatorSettings, serving: ServingEngine, is_current: bool
) -> str:
    """The image the serving engine runs in: the spec's for the current engine; for an
    older engine, the image it was deployed with (the ConfigMap's annotation, else the
    Deployment's container), so a new image never runs an engine built for the old one
    (its backend may not load it) while the new image's engine builds."""
    if not is_current:
        meta = (observed.configmap or {}).get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if annotations.get(names.ANNOTATION_ENGINE_DIGEST) == serving.digest:
            if image := annotations.get(names.ANNOTATION_RUNTIME_IMAGE):
                return str(image)
        template = ((observed.deployment or {}).get("spec") or {}).get("template") or {}
        for container in (template.get("spec") or {}).get("containers") or []:
            if container.get("name") == "runtime" and container.get("image"):
                return str(container["image"])
    return _spec_image(observed.spec, settings)


def _serving_config(
    observed: ObservedState,
    settings: OperatorSettings,
    serving: ServingEngine,
    is_current: bool,
    input_bytes_per_row: int | None = None,
) -> RuntimeConfig:
    """The runtime config for `serving`: from the spec when it is the current engine; for
    an older engine, the config it was deployed with (kept from the observed ConfigMap)."""
    if not is_current and observed.configmap:
        text = (observed.configmap.get("data") or {}).get(build.CONFIG_KEY)
        try:
            kept = RuntimeConfig.model_validate(yaml.safe_load(text or ""))
        except (ValidationError, yaml.YAMLError):
            kept = None
        if kept is not None and kept.engine.digest == serving.digest:
            return kept
    return build.runtime_config(
        observed.spec, settings, serving.version, serving.digest,
        input_bytes_per_row=input_bytes_per_row,
    )  # fmt: skip


def _observed_child(observed: ObservedState, kind: str, name: str) -> KubeObject | None:
    candidates: tuple[KubeObject | None, ...]
    candidates = {
        "PersistentVolumeClaim": (observed.pvc,),
        "ConfigMap": (
            observed.configmap,
            observed.candidate_configmap,
            observed.mirror_configmap,
        ),
        "Deployment": (observed.deployment, observed.candidate_deployment),
        "Service": (observed.service, observed.candidate_service),
        "PodMonitor": (observed.pod_monitor,),
        "Job": observed.jobs,
    }.get(kind, ())
    for child in candidates:
        if child and (child.get("metadata") or {}).get("name") == name:
            return child
    return None


CREATE_ONLY = frozenset({"Job", "PersistentVolumeClaim"})
"""Kinds written only when missing. A Job's pod template is immutable, and a change
outside the engine inputs (resources, image, tolerations) must not disturb a build under
way: the next attempt, if any, is created from the new spec. A claim's class and access
modes are immutable and its size may only grow, so re-applying a changed cache spec would
be refused on every pass: the claim is created once and resized on the claim itself."""


def needs_write(child: KubeObject, observed: ObservedState) -> bool:
    """A desired child must be applied when it is missing, or (unless created only) when
    the observed one lacks or changed a field the operator owns on it. apiVersion and
    kind are not compared: the child was found by them, and the items of a list the API
    server answers carry neither."""
    existing = _observed_child(observed, child["kind"], child["metadata"]["name"])
    if existing is None:
        return True
    owned = {key: value for key, value in child.items() if key not in ("apiVersion", "kind")}
    return child["kind"] not in CREATE_ONLY and not carries(existing, owned)


def _serving_children(
    observed: ObservedState,
    settings: OperatorSettings,
    serving: ServingEngine,
    engine: EngineState,
    replicas: int,
) -> tuple[KubeObject, KubeObject, list[KubeObject]]:
    """The serving runtime's ConfigMap and Deployment, then its Service and the PodMonitor
    where the cluster has them. They depend only on the serving engine, which a
    promotion finishing leaves as it is, so they are rendered once per pass."""
    spec, owner = observed.spec, observed.owner
    is_current = serving.build_key == engine.build_key and serving.digest == engine.digest
    serving_bytes = input_bytes_for(engine, serving)
    config = _serving_config(observed, settings, serving, is_current, serving_bytes)
    image = _serving_image(observed, settings, serving, is_current)
    configmap = build.build_runtime_configmap(
        owner,
        config,
        serving.build_key,
        image,
        input_bytes_per_row=serving_bytes,
        agreement=agreement_for(engine, serving),
    )
    monitors = observed.pod_monitors_available
    deployment = build.build_runtime_deployment(
        owner, spec, settings, configmap, replicas, pod_monitors=monitors
    )
    others = [build.build_service(owner, serving.version, grpc_port=spec.runtime.grpc_port)]
    if monitors:
        others.append(
            build_pod_monitor(owner, serving.version, settings.metrics.pod_monitor_labels)
        )
    return configmap, deployment, others


def _shadow_children(
    observed: ObservedState,
    settings: OperatorSettings,
    plan: RolloutPlan,
    serving: ServingEngine,
    engine: EngineState,
    reference: EngineState | None,
) -> tuple[KubeObject, list[KubeObject]]:
    """The serving version's mirror file (naming no candidate unless the plan mirrors, no
    reference unless the watch runs) and the shadow candidate's children when the plan
    runs one."""
    spec, owner = observed.spec, observed.owner
    target = plan.candidate if plan.mirror else None
    mirror = build_mirror_configmap(
        owner,
        spec,
        serving.version,
        (target.version, target.digest) if target else None,
        watched_reference(observed, serving, engine, reference),
    )
    if plan.candidate is None:
        return mirror, []
    candidate, role = plan.candidate, names.ROLE_CANDIDATE
    candidate_bytes = input_bytes_for(engine, candidate)
    config = build.runtime_config(
        spec, settings, candidate.version, candidate.digest, role, candidate_bytes
    )
    configmap = build.build_runtime_configmap(
        owner,
        config,
        candidate.build_key,
        _spec_image(spec, settings),
        role,
        candidate_bytes,
        agreement_for(engine, candidate),
    )
    replicas = spec.rollout.shadow.replicas
    return mirror, [
        configmap,
        build.build_runtime_deployment(owner, spec, settings, configmap, replicas, role),
        build.build_service(owner, candidate.version, role, spec.runtime.grpc_port),
    ]


def _candidate_leftovers(observed: ObservedState, plan: RolloutPlan) -> tuple[tuple[str, str], ...]:
    """The candidate's children when the plan runs no candidate (Failed, Aborted,
    Promoted, replaced)."""
    if plan.candidate is not None:
        return ()
    found = (
        ("Deployment", observed.candidate_deployment),
        ("Service", observed.candidate_service),
        ("ConfigMap", observed.candidate_configmap),
    )
    return tuple((kind, child["metadata"]["name"]) for kind, child in found if child)


def _no_pods(observed: ObservedState) -> ServingPods:
    """What is known of the pods when none were counted (the Deployment is new)."""
    current = ((observed.deployment or {}).get("spec") or {}).get("replicas")
    minimum = observed.spec.autoscaling.min_replicas
    return ServingPods(
        desired=current if isinstance(current, int) else minimum, ready=0, starting=0
    )


def _slo_miss(observed: ObservedState, slo: SloReport | None, now: datetime) -> SloMiss | None:
    """The objective missed, for the autoscaler: for how long since the later of the miss'
    start and the count's last change (a windowed p99 lags a scale-up)."""
    if slo is None or slo.status.met is not False or slo.status.p99_milliseconds is None:
        return None
    since = slo.status.missed_since or now
    scaled = observed.status.autoscaling.last_scale_time if observed.status.autoscaling else None
    if scaled is not None and scaled > since:
        since = scaled
    return SloMiss(
        slo.status.p99_milliseconds / 1e3,
        slo.status.objective_p99_milliseconds / 1e3,
        max(0.0, (now - since).total_seconds()),
    )


def _recommendation(
    observed: ObservedState, now: datetime, slo: SloReport | None = None
) -> Recommendation | None:
    """The autoscaler's count, once the serving Deployment exists (a new one starts at
    minReplicas); None with autoscaling off."""
    scaling = observed.spec.autoscaling
    if not scaling.enabled or observed.deployment is None:
        return None
    signals = observed.scaling_signals or ScalingSignals(error="The signals were not read.")
    pods = observed.serving_pods or _no_pods(observed)
    slo_miss = _slo_miss(observed, slo, now)
    return recommend(scaling, observed.scaling_history, signals, pods, now, slo_miss)


def decide(observed: ObservedState, settings: OperatorSettings, now: datetime) -> Decision:
    """The children that should exist, the status and the events for one pass: the
    engine's state, then the rollout plan (which engine serves, which runs as a shadow
    candidate), then the children and the status they lead to."""
    now = now.replace(microsecond=0)  # metav1.Time has whole seconds
    spec, owner = observed.spec, observed.owner
    reference = reference_engine(observed, settings, now)
    others = (*((reference.build_key,) if reference else ()), *fallback_key(spec, settings))
    engine = engine_state(observed, settings, now, others)
    held, fallback = fallback_engine(observed, settings, now, engine, reference)
    children: list[KubeObject] = []

    pvc = build.build_cache_pvc(owner, spec)
    if pvc is not None:
        children.append(pvc)
    if engine.job_attempt is not None:
        children.append(
            build.build_engine_job(owner, spec, settings, engine.build_key, engine.job_attempt)
        )
    if reference is not None and reference.job_attempt is not None:
        children.append(
            build.build_engine_job(
                owner, reference_spec(spec), settings, reference.build_key, reference.job_attempt
            )
        )

    if fallback is not None and fallback is not reference and fallback.job_attempt is not None:
        children.append(
            build.build_engine_job(
                owner, fallback_spec(spec), settings, fallback.build_key, fallback.job_attempt
            )
        )

    if fallback is not None:
        # Drift with onDrift Fallback: serving rolls to the fallback engine once it exists.
        plan = plan_rollout(
            fallback_spec(spec), fallback, observed_serving(observed),
            observed.status.candidate, {}, None, False, now,
        )  # fmt: skip
    else:
        plan = plan_rollout(
            spec,
            engine,
            observed_serving(observed),
            observed.status.candidate,
            observed.annotations,
            observed.shadow,
            available(observed.candidate_deployment),
            now,
            candidate_pods=observed.candidate_pods,
        )
    slo = slo_report(spec.slo, observed.scaling_signals, observed.status.slo, now)
    recommendation = _recommendation(observed, now, slo)
    if recommendation is not None:
        replicas = recommendation.replicas
    else:
        replicas = build.desired_replicas(spec)
    deployment = None
    if plan.serving is not None:
        configmap, deployment, served = _serving_children(
            observed, settings, plan.serving, fallback or engine, replicas
        )
    rollout = rollout_progress(observed.deployment, deployment, replicas)
    # Once the roll to a promoted engine is done, the candidate goes.
    plan = promotion_complete(plan, rollout.complete)
    if plan.serving is not None and deployment is not None:
        # The mirror file before the Deployment whose pods mount it.
        mirror, candidate = _shadow_children(
            observed, settings, plan, plan.serving, engine, reference
        )
        children += [configmap, mirror, deployment, *served, *candidate]
    if reference is not None:
        children += reference_children(observed, settings, reference)
    scaling = None
    if recommendation is not None:
        scaling = scaling_report(
            spec,
            recommendation,
            observed.scaling_signals,
            observed.serving_pods or _no_pods(observed),
            observed.status.autoscaling,
            observed.status.metrics,
            now,
        )
    watch_report = quality_report(observed, plan.serving, engine, reference, now, held)
    status = compute_status(
        observed, engine, plan, report(spec, plan), rollout, replicas, now, scaling, watch_report,
        slo,
    )  # fmt: skip

    polls = settings.requeue
    requeue: float | None = None
    if engine.phase == EnginePhase.BUILDING:
        requeue = polls.build_poll_seconds
    elif engine.phase == EnginePhase.FAILED and engine.retry_at is not None:
        requeue = max(1.0, (engine.retry_at - now).total_seconds())
    if fallback is not None and fallback.phase == EnginePhase.BUILDING:
        requeue = polls.build_poll_seconds
    if plan.shadowing or plan.promoting:
        requeue = min(requeue or polls.shadow_poll_seconds, polls.shadow_poll_seconds)
    if spec.autoscaling.enabled:
        requeue = min(requeue or polls.autoscale_poll_seconds, polls.autoscale_poll_seconds)
    if reference is not None:  # the watch's window slides: judged as often as a shadow
        requeue = min(requeue or polls.shadow_poll_seconds, polls.shadow_poll_seconds)

    stale_reference_jobs = reference.delete_jobs if reference else ()
    stale_fallback_jobs = fallback.delete_jobs if fallback else ()
    events = transition_events(observed.status.conditions, status.conditions)
    if plan.replaced is not None:
        events += (shadow_replaced_event(plan.replaced, plan.record),)
    if scaling is not None:
        events += scaling.events
    return Decision(
        apply=tuple(child for child in children if needs_write(child, observed)),
        delete=(
            *(
                ("Job", name)
                for name in sorted(
                    {*engine.delete_jobs, *stale_reference_jobs, *stale_fallback_jobs}
                )
            ),
            *_candidate_leftovers(observed, plan),
            *reference_leftovers(observed, reference),
        ),
        status=status,
        events=events,
        requeue_after_seconds=requeue,
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
