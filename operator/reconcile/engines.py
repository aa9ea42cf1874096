"""The engines an InferenceDeployment runs in one pass, each decided the same way: its
one engine, or on a mixed GPU fleet one per eligible GPU product. Pure.

An object runs one engine unless the spec puts it on a mixed GPU fleet
(`inference_deployment.in_fleet_mode`). There, the cluster's GPU nodes (read by the
gather step) give the eligible products (`gpu_nodes.eligible_products`), and each product
is what an object of one engine is, with that product as its `runtime.gpuProduct`
(`for_product`): its build key, and so its build Job and engine, differ by product, and
its Job and pods carry the product's node selector, so an engine is built on, and runs
only on, the GPU it was built for. Each product's decisions read its own children
(`product_view`): its ConfigMap remembers its engine, and an older engine keeps serving
on that product while a new one builds, as for one engine.

Every engine goes through the same steps (`_engine_pass`): the quality watch's reference
and fallback engines where the watch is on (never on a fleet, by the spec's rules), the
engine's state, then the rollout plan (which engine serves, which runs as a shadow
candidate: a fleet rolls out Rolling, by the same rules).

A product whose engine has not served yet has no ConfigMap and no Deployment: nothing
runs there, and the serving Service (which selects every product's ready serving pods)
sends it no traffic. The pods are split across the products that serve (`split`,
`replica_split`); one engine runs them all. A product whose nodes are gone has its
runtime children deleted at once (its engine stays in the cache); a new product gets an
engine of its own, and the others are left as they are, but for their share of the pods.
An object that changes mode keeps its old runtime children until the new ones serve
every pod (`retired_runtimes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.api.v1alpha1.inference_deployment import in_fleet_mode
from kubeinfer.operator.api.v1alpha1.status import EngineStatus
from kubeinfer.operator.quality.fallback import FallbackReport, fallback_spec
from kubeinfer.operator.reconcile.decide_quality import (
    fallback_engine,
    fallback_key,
    reference_engine,
)
from kubeinfer.operator.reconcile.reads import Reads
from kubeinfer.operator.reconcile.replica_split import (
    hold_while_moving,
    largest_remainder,
    product_weights,
)
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress, available
from kubeinfer.operator.rollout.shadow import RolloutPlan, plan_rollout
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import (
    EngineState,
    engine_state,
    observed_serving,
)
from kubeinfer.operator.state.gpu_nodes import ProductCapacity, eligible_products
from kubeinfer.operator.state.observed import KubeObject, ObservedState
from kubeinfer.operator.state.runtime_failures import RuntimeFailure, runtime_failure


@dataclass(frozen=True)
class EnginePass:
    """One engine of the object in this pass: the object's own (`product` None), or one
    GPU product's on a mixed fleet (`capacity`: its eligible nodes and their GPUs). `view`
    is the observed state as this engine's decisions read it (its `spec` is the one the
    engine and its pods are made from), `plan` which engine serves there (`plan.serving`,
    None: none yet, so nothing runs there) and which runs as a shadow candidate;
    `reference`, `fallback` and `held` are the quality watch's."""

    product: str | None
    capacity: ProductCapacity | None
    view: ObservedState
    engine: EngineState
    plan: RolloutPlan
    reference: EngineState | None = None
    fallback: EngineState | None = None
    """The quality watch's fallback engine; while it serves, the serving children carry
    its inputs."""
    held: FallbackReport | None = None
    build_keys: tuple[str, ...] = ()
    """The build keys of the engines this one needs: its own, and the watch's reference
    and fallback engines' (their unfinished Jobs are not stale)."""
    replicas: int = 0
    """The runtime pods wanted on this engine."""
    failure: RuntimeFailure | None = None
    """Why runtime pods of the engine serving here cannot start (pods of another engine
    are on their way out); None while none fails, or while the pods were not listed (the
    Deployment has settled: `reads`)."""


def engine_passes(
    observed: ObservedState, wanted: Reads, settings: OperatorSettings, now: datetime, total: int
) -> tuple[EnginePass, ...]:
    """The engines the object runs, each with its share of the `total` pods wanted: its
    own engine runs them all; on a mixed fleet each eligible GPU product's (in name
    order) shares them. `wanted` is what the gather step read beyond the objects."""
    if not in_fleet_mode(observed.spec):
        own = _engine_pass(observed, wanted, None, settings, now)
        return (replace(own, replicas=total),)
    capacities = eligible_products(observed.gpu_nodes or (), observed.spec)
    passes = [
        _engine_pass(
            product_view(observed, wanted, c.product, for_product(observed.spec, c.product)),
            wanted,
            c,
            settings,
            now,
        )
        for c in capacities
    ]
    shares = split(observed.spec, passes, total)
    return tuple(
        replace(each, replicas=shares.get(c.product, 0))
        for c, each in zip(capacities, passes, strict=True)
    )


def _engine_pass(
    view: ObservedState,
    wanted: Reads,
    capacity: ProductCapacity | None,
    settings: OperatorSettings,
    now: datetime,
) -> EnginePass:
    """One engine's state, its plan, and why its runtime pods fail, from what `view` shows
    of it. An engine the quality watch watches also has the watch's reference and fallback
    engines."""
    product = capacity.product if capacity is not None else None
    engine = engine_state(view, settings, now)
    reference = held = fallback = None
    keys: tuple[str, ...] = (engine.build_key,)
    if view.spec.quality_watch.enabled:  # never on a fleet, by the spec's rules
        reference = reference_engine(view, settings, now)
        held, fallback = fallback_engine(view, settings, now, engine, reference)
        keys += (*((reference.build_key,) if reference else ()), *fallback_key(view.spec, settings))
    plan = _plan(view, wanted, engine, fallback, now)
    failure = None
    if plan.serving is not None and wanted.runtime_pods:
        failure = runtime_failure(view.runtime_pods, digest=plan.serving.digest)
    return EnginePass(
        product, capacity, view, engine, plan, reference, fallback, held, keys, failure=failure
    )


def _plan(
    view: ObservedState,
    wanted: Reads,
    engine: EngineState,
    fallback: EngineState | None,
    now: datetime,
) -> RolloutPlan:
    """Which engine serves and which runs as the candidate. With drift and onDrift
    Fallback, serving rolls to the fallback engine once it exists, with no shadow test."""
    if fallback is not None:
        return plan_rollout(
            fallback_spec(view.spec), fallback, observed_serving(view),
            view.status.candidate, {}, None, False, now,
        )  # fmt: skip
    return plan_rollout(
        view.spec,
        engine,
        observed_serving(view),
        view.status.candidate,
        view.annotations,
        view.shadow if wanted.shadow is not None else None,
        available(view.candidate_deployment),
        now,
        candidate_pods=view.candidate_pods if wanted.candidate_pods else (),
    )


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
    observed: ObservedState, wanted: Reads, product: str, spec: InferenceDeploymentSpec
) -> ObservedState:
    """The observed state as the decisions of one product read it: the product's spec,
    ConfigMap, Deployment and pods (where they were listed), and as the stored engine its
    entry in `status.engines` (else the single engine's: an object moving to a fleet keeps
    it on the product whose build key it has)."""
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
        runtime_pods=tuple(p for p in observed.runtime_pods if product_of(p) == product)
        if wanted.runtime_pods
        else (),
    )


def _ready(deployment: KubeObject | None) -> tuple[int, int]:
    """(replicas asked, ready pods) of a Deployment."""
    spec, status = (deployment or {}).get("spec") or {}, (deployment or {}).get("status") or {}
    return int(spec.get("replicas") or 0), int(status.get("readyReplicas") or 0)


def split(
    spec: InferenceDeploymentSpec, passes: Sequence[EnginePass], total: int
) -> dict[str, int]:
    """A fleet's `total` pods split across the products that serve, each product that
    shrinks keeping its pods while others lack ready ones (`replica_split`)."""
    fleet = [(p.capacity, p) for p in passes if p.capacity is not None]
    serving = [c.product for c, p in fleet if p.plan.serving is not None]
    weights = product_weights(spec.runtime.gpu_fleet, [c for c, _ in fleet], serving)
    shares = largest_remainder(total, weights)
    current = {c.product: _ready(p.view.deployment) for c, p in fleet if p.view.deployment}
    return hold_while_moving(shares, current)


def retired_runtimes(
    observed: ObservedState,
    passes: Sequence[EnginePass],
    rollouts: Sequence[RolloutProgress],
    total: int,
) -> tuple[tuple[str, str], ...]:
    """The runtime children of engines the object no longer runs: on a fleet, a product
    no longer eligible's at once (nothing of it can run), the single engine's once the
    products' ready pods add up to `total`; for one engine, a fleet's products' once its
    own roll is complete."""
    found = (
        *(("Deployment", d) for d in observed.product_deployments),
        *(("ConfigMap", c) for c in observed.product_configmaps),
    )
    if not in_fleet_mode(observed.spec):
        if not all(rollout.complete for rollout in rollouts):
            return ()
        return tuple((kind, child["metadata"]["name"]) for kind, child in found)
    eligible = {p.product for p in passes}
    gone = [(kind, c["metadata"]["name"]) for kind, c in found if product_of(c) not in eligible]
    if sum(_ready(p.view.deployment)[1] for p in passes) < total:
        return tuple(gone)
    single = (("Deployment", observed.deployment), ("ConfigMap", observed.configmap))
    return (*gone, *((kind, child["metadata"]["name"]) for kind, child in single if child))
