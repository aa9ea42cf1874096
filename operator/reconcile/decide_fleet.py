"""One pass over an InferenceDeployment on a mixed GPU fleet: an engine, a build Job and a
runtime Deployment per eligible GPU product. Pure.

The cluster's GPU nodes (read by the gather step) give the eligible products
(`gpu_nodes.eligible_products`). Each product is decided as a single-engine object
whose `runtime.gpuProduct` is that product (`for_product`): its build key, and so its
build Job and engine, differ by product, and its Job and pods carry the product's node
selector, so an engine is built on, and runs only on, the GPU it was built for. The
single-engine decisions read the product's own children (`product_view`): its ConfigMap
remembers its engine, and an older engine keeps serving on that product while a new one
builds, as the Rolling strategy does for one engine.

A product whose engine has not served yet has no ConfigMap and no Deployment: nothing
runs there, and the serving Service (which selects every product's ready serving pods)
sends it no traffic. The pods are split across the products that serve by
`replica_split`. A product whose nodes are gone has its runtime children deleted (its
engine stays in the cache); a new product gets an engine of its own, and the others are
left as they are, but for their share of the pods. An object that ran one engine before
keeps its single Deployment until the products' pods are ready, then it is deleted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.api.v1alpha1.enums import RolloutStrategy
from kubeinfer.operator.api.v1alpha1.status import EngineStatus
from kubeinfer.operator.reconcile import desired as build
from kubeinfer.operator.reconcile.child_writes import needs_write
from kubeinfer.operator.reconcile.decide_quality import reference_leftovers
from kubeinfer.operator.reconcile.decide_runtime import candidate_leftovers, serving_children
from kubeinfer.operator.reconcile.decide_scaling import recommendation, scaling
from kubeinfer.operator.reconcile.desired_build import build_engine_job
from kubeinfer.operator.reconcile.desired_mirror import build_mirror_configmap
from kubeinfer.operator.reconcile.fleet_status import ProductPass, fleet_status, product_events
from kubeinfer.operator.reconcile.replica_split import (
    hold_while_moving,
    largest_remainder,
    product_weights,
)
from kubeinfer.operator.reconcile.requeue import build_wait_seconds
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress, rollout_progress
from kubeinfer.operator.reconcile.slo_status import slo_report
from kubeinfer.operator.reconcile.status import transition_events
from kubeinfer.operator.rollout.shadow import RolloutPlan, plan_rollout
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import (
    build_jobs,
    build_key,
    engine_state,
    observed_serving,
)
from kubeinfer.operator.state.gpu_nodes import ProductCapacity, eligible_products
from kubeinfer.operator.state.snapshot import Decision, KubeObject, ObservedState


def for_product(spec: InferenceDeploymentSpec, product: str) -> InferenceDeploymentSpec:
    """The spec as one GPU product's engine and pods are made from: that product as its
    `runtime.gpuProduct` (an engine input, and the pods' node selector)."""
    runtime = spec.runtime.model_copy(update={"gpu_product": product, "gpu_fleet": None})
    return spec.model_copy(update={"runtime": runtime})


def product_of(child: KubeObject) -> str | None:
    """The GPU product a fleet's ConfigMap, Deployment or pod is for (its label)."""
    labels = (child.get("metadata") or {}).get("labels") or {}
    product = labels.get(names.LABEL_GPU_PRODUCT)
    return product if isinstance(product, str) else None


def _of(children: Sequence[KubeObject], product: str) -> KubeObject | None:
    return next((child for child in children if product_of(child) == product), None)


def product_view(
    observed: ObservedState, product: str, spec: InferenceDeploymentSpec
) -> ObservedState:
    """The observed state as the single-engine decisions of one product read it: the
    product's spec, ConfigMap, Deployment and pods, and as the stored engine its entry in
    `status.engines` (else the single engine's: an object moving to a fleet keeps it on
    the product whose build key it has)."""
    stored = observed.status
    entry = next((e for e in stored.engines if e.gpu_product == product and e.digest), None)
    engine = stored.engine
    if entry is not None:
        engine = EngineStatus(digest=entry.digest, target=entry.target, build_key=entry.build_key)
    status = stored.model_copy(update={"engine": engine, "serving": None, "candidate": None})
    return replace(
        observed,
        spec=spec,
        status=status,
        configmap=_of(observed.product_configmaps, product),
        deployment=_of(observed.product_deployments, product),
        candidate_configmap=None,
        candidate_deployment=None,
        reference_configmap=None,
        reference_deployment=None,
        runtime_pods=tuple(p for p in observed.runtime_pods if product_of(p) == product),
    )


def _product_pass(
    observed: ObservedState,
    capacity: ProductCapacity,
    spec: InferenceDeploymentSpec,
    settings: OperatorSettings,
    now: datetime,
    others: tuple[str, ...],
) -> ProductPass:
    """One product's engine (the Jobs of `others`, the other products' build keys, are
    not stale) and what serves on it: its engine once built, an older one meanwhile."""
    view = product_view(observed, capacity.product, spec)
    engine = engine_state(view, settings, now, others)
    rolling = spec.model_copy(
        update={"rollout": spec.rollout.model_copy(update={"strategy": RolloutStrategy.ROLLING})}
    )
    plan = plan_rollout(rolling, engine, observed_serving(view), None, {}, None, False, now)
    return ProductPass(capacity, spec, view, engine, plan.serving)


def _ready(deployment: KubeObject | None) -> tuple[int, int]:
    """(replicas asked, ready pods) of a Deployment."""
    spec, status = (deployment or {}).get("spec") or {}, (deployment or {}).get("status") or {}
    return int(spec.get("replicas") or 0), int(status.get("readyReplicas") or 0)


def split(
    spec: InferenceDeploymentSpec, passes: Sequence[ProductPass], total: int
) -> dict[str, int]:
    """Each product's pods: `total` split across the products that serve, each product
    that shrinks keeping its pods while others lack ready ones (`replica_split`)."""
    serving = [p.capacity.product for p in passes if p.serving is not None]
    capacities = [p.capacity for p in passes]
    shares = largest_remainder(total, product_weights(spec.runtime.gpu_fleet, capacities, serving))
    current = {p.capacity.product: _ready(p.view.deployment) for p in passes if p.view.deployment}
    held = hold_while_moving(shares, current)
    return {p.capacity.product: held.get(p.capacity.product, 0) for p in passes}


def _runtime_children(
    observed: ObservedState,
    settings: OperatorSettings,
    passes: Sequence[ProductPass],
    replicas: Mapping[str, int],
) -> tuple[list[KubeObject], dict[str, RolloutProgress]]:
    """Each serving product's ConfigMap and Deployment, then the mirror file and the
    Service (with the PodMonitor) they share, and each product's rollout progress."""
    children: list[KubeObject] = []
    shared: list[KubeObject] = []
    rollouts: dict[str, RolloutProgress] = {}
    for each in passes:
        product, deployment = each.capacity.product, None
        if each.serving is not None:
            configmap, deployment, shared = serving_children(
                each.view, settings, each.serving, each.engine, replicas[product], product
            )
            children += [configmap, deployment]
        rollouts[product] = rollout_progress(each.view.deployment, deployment, replicas[product])
    if shared:
        spec = observed.spec
        mirror = build_mirror_configmap(
            observed.owner, spec, spec.model.version, None, existing=observed.mirror_configmap
        )
        children = [*children, *shared] if mirror is None else [mirror, *children, *shared]
    return children, rollouts


def _deletions(
    observed: ObservedState, passes: Sequence[ProductPass], total: int
) -> tuple[tuple[str, str], ...]:
    """The unfinished build Jobs of no product's inputs, the runtime children of products
    no longer eligible, the single engine's once the products' pods are ready, and a
    shadow candidate's or a quality reference's from before."""
    keys = tuple(p.engine.build_key for p in passes)
    _, stale = build_jobs(observed, "", keys)
    eligible = {p.capacity.product for p in passes}
    gone = [
        (kind, child["metadata"]["name"])
        for kind, found in (
            ("Deployment", observed.product_deployments),
            ("ConfigMap", observed.product_configmaps),
        )
        for child in found
        if product_of(child) not in eligible
    ]
    ready = sum(_ready(p.view.deployment)[1] for p in passes)
    single = []
    if ready >= total:
        single = [
            (kind, child["metadata"]["name"])
            for kind, child in (
                ("Deployment", observed.deployment),
                ("ConfigMap", observed.configmap),
            )
            if child
        ]
    return (
        *(("Job", name) for name in stale),
        *gone,
        *single,
        *candidate_leftovers(observed, RolloutPlan(None)),
        *reference_leftovers(observed, None),
    )


def fleet_leftovers(observed: ObservedState, complete: bool) -> tuple[tuple[str, str], ...]:
    """For an object that runs one engine again: a fleet's product ConfigMaps and
    Deployments, once the single Deployment serves on every replica."""
    if not complete:
        return ()
    found = (
        *(("Deployment", d) for d in observed.product_deployments),
        *(("ConfigMap", c) for c in observed.product_configmaps),
    )
    return tuple((kind, child["metadata"]["name"]) for kind, child in found)


def decide_fleet(observed: ObservedState, settings: OperatorSettings, now: datetime) -> Decision:
    """`decide` for an object on a mixed GPU fleet: the eligible products, each one's
    engine and what serves on it, the pods' split, then the children, the status and the
    Events (see the module's docstring)."""
    spec, owner = observed.spec, observed.owner
    capacities = eligible_products(observed.gpu_nodes or (), spec)
    specs = {c.product: for_product(spec, c.product) for c in capacities}
    keys = {product: build_key(of, settings) for product, of in specs.items()}
    passes = []
    for capacity in capacities:
        others = tuple(key for product, key in keys.items() if product != capacity.product)
        of = specs[capacity.product]
        passes.append(_product_pass(observed, capacity, of, settings, now, others))
    slo = slo_report(spec.slo, observed.scaling_signals, observed.status.slo, now)
    recommended = recommendation(observed, now, slo)
    total = recommended.replicas if recommended is not None else build.desired_replicas(spec)
    replicas = split(spec, passes, total)
    pvc = build.build_cache_pvc(owner, spec)
    children = [pvc] if pvc is not None else []
    children += [
        build_engine_job(owner, p.spec, settings, p.engine.build_key, p.engine.job_attempt)
        for p in passes
        if p.engine.job_attempt is not None
    ]
    runtime, rollouts = _runtime_children(observed, settings, passes, replicas)
    children += runtime
    scaled = scaling(observed, recommended, now)
    status = fleet_status(observed, passes, rollouts, replicas, total, now, scaled, slo)
    events = transition_events(observed.status.conditions, status.conditions)
    events += product_events(observed.status.engines, status.engines)
    waits = [build_wait_seconds(settings.requeue, p.engine, None, now) for p in passes]
    if spec.autoscaling.enabled:
        waits.append(settings.requeue.autoscale_poll_seconds)
    return Decision(
        apply=tuple(child for child in children if needs_write(child, observed)),
        delete=_deletions(observed, passes, total),
        status=status,
        events=events + (scaled.events if scaled is not None else ()),
        requeue_after_seconds=min((w for w in waits if w is not None), default=None),
        desired=tuple(children),
        scaling_history=recommended.history if recommended else None,
    )
