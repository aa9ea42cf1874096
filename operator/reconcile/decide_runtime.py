"""The runtime's children for one pass: each engine's serving ConfigMap and Deployment
(the object's one, or each GPU product's on a mixed fleet), the Service, disruption
budget and PodMonitor they share, the mirror file, and a shadow candidate's children.
Pure.

The serving children run the engine the rollout plan serves. For the current engine they
are rendered from the spec; for an older one (a new engine still building or on trial)
from what it was deployed with, the config and image recorded on its ConfigMap, so a
change of spec never reaches pods running an engine built for another image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import yaml
from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.api.v1alpha1.enums import Backend
from kubeinfer.operator.reconcile import desired as build
from kubeinfer.operator.reconcile.decide_quality import watched_reference
from kubeinfer.operator.reconcile.desired_mirror import build_mirror_configmap
from kubeinfer.operator.reconcile.desired_monitoring import build_pod_monitor
from kubeinfer.operator.reconcile.engines import EnginePass
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress, rollout_progress
from kubeinfer.operator.rollout.shadow import RolloutPlan, promotion_complete
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import (
    EngineState,
    ServingEngine,
    agreement_for,
    batching_for,
    input_bytes_for,
)
from kubeinfer.operator.state.observed import KubeObject, ObservedState
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


def serving_children(
    observed: ObservedState,
    settings: OperatorSettings,
    serving: ServingEngine,
    engine: EngineState,
    replicas: int,
    product: str | None = None,
) -> tuple[KubeObject, KubeObject, list[KubeObject]]:
    """The serving runtime's ConfigMap and Deployment, then its Service, its disruption
    budget and the PodMonitor where the cluster has them. They depend only on the serving
    engine, which a promotion finishing leaves as it is, so they are rendered once per
    pass. With `product`, a mixed GPU fleet's ConfigMap and Deployment of that GPU
    product."""
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
        product=product,
        batching=batching_for(engine, serving),
    )
    monitors = observed.pod_monitors_available
    deployment = build.build_runtime_deployment(
        owner, spec, settings, configmap, replicas, pod_monitors=monitors
    )
    others = [
        build.build_service(owner, serving.version, grpc_port=spec.runtime.grpc_port),
        build.build_disruption_budget(owner, serving.version),
    ]
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
) -> tuple[KubeObject | None, list[KubeObject]]:
    """The serving version's mirror file (naming no candidate unless the plan mirrors, no
    reference unless the watch runs; none while it names nothing and never did) and the
    shadow candidate's children when the plan runs one."""
    spec, owner = observed.spec, observed.owner
    target = plan.candidate if plan.mirror else None
    mirror = build_mirror_configmap(
        owner,
        spec,
        serving.version,
        (target.version, target.digest) if target else None,
        watched_reference(observed, serving, engine, reference),
        observed.mirror_configmap,
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
        batching=batching_for(engine, candidate),
    )
    replicas = spec.rollout.shadow.replicas
    return mirror, [
        configmap,
        build.build_runtime_deployment(owner, spec, settings, configmap, replicas, role),
        build.build_service(owner, candidate.version, role, spec.runtime.grpc_port),
    ]


def runtime_children(
    settings: OperatorSettings, passes: Sequence[EnginePass]
) -> tuple[tuple[EnginePass, ...], tuple[RolloutProgress, ...], list[KubeObject]]:
    """The engines once each serving roll's progress is known (a promoted engine rolled
    out on every pod lets the candidate go), those progresses, and the runtime's
    children: each serving engine's ConfigMap, the mirror file before the Deployments
    whose pods mount it, each serving engine's Deployment (its share of the pods), then the
    Service with the disruption budget and PodMonitor they share, and a shadow
    candidate's children. Nothing runs where no engine serves yet."""
    configmaps: list[KubeObject] = []
    deployments: list[KubeObject] = []
    shared: list[KubeObject] = []
    passes = list(passes)
    rollouts = []
    for index, each in enumerate(passes):
        deployment = None
        if each.plan.serving is not None:
            configmap, deployment, shared = serving_children(
                each.view,
                settings,
                each.plan.serving,
                each.fallback or each.engine,
                each.replicas,
                each.product,
            )
            configmaps.append(configmap)
            deployments.append(deployment)
        scaling = each.view.spec.autoscaling
        on_demand = scaling.enabled and scaling.min_replicas == 0
        rollout = rollout_progress(each.view.deployment, deployment, each.replicas, on_demand)
        rollouts.append(rollout)
        passes[index] = replace(each, plan=promotion_complete(each.plan, rollout.complete))
    serving = [(each, each.plan.serving) for each in passes if each.plan.serving is not None]
    if not serving:
        return tuple(passes), tuple(rollouts), []
    last, served = serving[-1]
    mirror, candidate = _shadow_children(
        last.view, settings, last.plan, served, last.engine, last.reference
    )
    mirrors = [mirror] if mirror is not None else []
    children = [*configmaps, *mirrors, *deployments, *shared, *candidate]
    return tuple(passes), tuple(rollouts), children
