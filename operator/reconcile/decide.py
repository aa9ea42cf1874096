"""One reconcile pass's decision: observed state in; children, status and events out. Pure.

`decide` is level-triggered: it looks only at what exists now (the spec, the stored
status, the owned children) and never at what event woke it, so create, update, resume,
the resync timer and child events all lead to the same answer.

Rollout order: a change of any engine input builds the new engine first; until the
build reports its digest, the runtime ConfigMap keeps the old engine and the batching
policy that went with it (a new policy may not fit the old engine), and only then does
the new config roll the Deployment. `promotion_gate` is the seam where the shadow test
of a later issue decides whether a built engine may replace the serving one.

Writes: `Decision.apply` lists only the children that are missing or whose input hash
differs from the observed one, so a pass over an unchanged object writes nothing;
`Decision.desired` lists them all (for `kubeinfer render` and for drift checks).
"""

from __future__ import annotations

from datetime import datetime

import yaml
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus
from kubeinfer.operator.reconcile import desired as build
from kubeinfer.operator.reconcile.engine_state import (
    EnginePhase,
    EngineState,
    ServingEngine,
    engine_state,
    observed_serving,
)
from kubeinfer.operator.reconcile.snapshot import (
    Decision,
    KubeObject,
    ObservedState,
    OwnerRef,
)
from kubeinfer.operator.reconcile.status import (
    compute_status,
    invalid_status,
    rollout_progress,
    transition_events,
)
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.runtime.config import RuntimeConfig
from pydantic import ValidationError


def promotion_gate(
    observed: ObservedState, candidate: ServingEngine, serving: ServingEngine | None
) -> bool:
    """May the built `candidate` replace what serves now? The Rolling strategy promotes at
    once. The shadow gate of a later issue goes here: with strategy Shadow it will run
    the candidate beside `serving`, compare them, and answer True only once the
    thresholds pass (status.candidate carries its progress)."""
    return True


def choose_serving(
    observed: ObservedState, engine: EngineState, current: ServingEngine | None
) -> ServingEngine | None:
    """The engine the runtime should run after this pass."""
    if not engine.ready or engine.digest is None:
        return current
    candidate = ServingEngine(observed.spec.model.version, engine.digest, engine.build_key)
    if current is None or current == candidate or promotion_gate(observed, candidate, current):
        return candidate
    return current


def _serving_config(
    observed: ObservedState, settings: OperatorSettings, serving: ServingEngine, is_current: bool
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
    return build.runtime_config(observed.spec, settings, serving.version, serving.digest)


def _observed_child(observed: ObservedState, kind: str, name: str) -> KubeObject | None:
    candidates: tuple[KubeObject | None, ...]
    candidates = {
        "PersistentVolumeClaim": (observed.pvc,),
        "ConfigMap": (observed.configmap,),
        "Deployment": (observed.deployment,),
        "Service": (observed.service,),
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
    """A desired child must be applied when it is missing or its input hash changed."""
    existing = _observed_child(observed, child["kind"], child["metadata"]["name"])
    if existing is None:
        return True
    return child["kind"] not in CREATE_ONLY and build.input_hash(existing) != build.input_hash(
        child
    )


def decide(observed: ObservedState, settings: OperatorSettings, now: datetime) -> Decision:
    """The children that should exist, the status and the events for one pass."""
    now = now.replace(microsecond=0)  # metav1.Time has whole seconds
    spec, owner = observed.spec, observed.owner
    engine = engine_state(observed, settings, now)
    children: list[KubeObject] = []

    pvc = build.build_cache_pvc(owner, spec)
    if pvc is not None:
        children.append(pvc)
    if engine.job_attempt is not None:
        children.append(
            build.build_engine_job(owner, spec, settings, engine.build_key, engine.job_attempt)
        )

    serving = choose_serving(observed, engine, observed_serving(observed))
    replicas = build.desired_replicas(spec, observed.deployment)
    deployment = None
    if serving is not None:
        is_current = serving.build_key == engine.build_key and serving.digest == engine.digest
        config = _serving_config(observed, settings, serving, is_current)
        configmap = build.build_runtime_configmap(owner, config, serving.build_key)
        deployment = build.build_runtime_deployment(owner, spec, settings, configmap, replicas)
        children += [configmap, deployment, build.build_service(owner, serving.version)]

    rollout = rollout_progress(observed.deployment, deployment, replicas)
    status = compute_status(observed, engine, serving, rollout, replicas, now)

    requeue: float | None = None
    if engine.phase == EnginePhase.BUILDING:
        requeue = settings.build_poll_seconds
    elif engine.phase == EnginePhase.FAILED and engine.retry_at is not None:
        requeue = max(1.0, (engine.retry_at - now).total_seconds())

    return Decision(
        apply=tuple(child for child in children if needs_write(child, observed)),
        delete=tuple(("Job", name) for name in engine.delete_jobs),
        status=status,
        events=transition_events(observed.status.conditions, status.conditions),
        requeue_after_seconds=requeue,
        desired=tuple(children),
    )


def decide_invalid(
    owner: OwnerRef, status: InferenceDeploymentStatus, error: Exception | str, now: datetime
) -> Decision:
    """A spec the API server accepted but the model refuses (e.g. no CEL on the cluster):
    Degraded=True, Ready=False with reason InvalidSpec and the validation message. No
    child is touched, and nothing is requeued: only a new spec can fix it."""
    now = now.replace(microsecond=0)
    new = invalid_status(status, str(error), owner.generation, now)
    return Decision(status=new, events=transition_events(status.conditions, new.conditions))
