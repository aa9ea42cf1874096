"""The cluster's GPU nodes as a mixed fleet's decisions see them, and which GPU products
an InferenceDeployment may run on. Pure.

A node counts when GPU feature discovery labelled its product (`nvidia.com/gpu.product`)
and it has allocatable `nvidia.com/gpu`. A product is eligible for an object when one of
its nodes matches the object's `runtime.nodeSelector`, tolerates nothing the object does
not (its NoSchedule and NoExecute taints are tolerated by `runtime.tolerations`), and the
product is listed in `runtime.gpuFleet.products` where that lists any.

The taints Kubernetes itself puts on a node that is not ready, unreachable, cordoned or
under pressure (`node.kubernetes.io/...`) describe the node's state, not a policy, and so
does the operator's own on a node whose pods answered wrong (`kubeinfer.io/suspect-
answers`): such a node keeps its product eligible (its engine is kept, not rebuilt when
the node returns) but its GPUs do not count towards the product's share of the pods
meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.api.v1alpha1.inference_deployment import Toleration
from kubeinfer.operator.state.names import TAINT_SUSPECT_ANSWERS

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
NODE_STATE_TAINTS = "node.kubernetes.io/"
"""The prefix of the taints the node lifecycle controller and the kubelet manage."""
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class GpuNode:
    """What a mixed fleet's decisions read of one GPU node."""

    name: str
    product: str
    gpus: int
    """Allocatable nvidia.com/gpu."""
    labels: tuple[tuple[str, str], ...]
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    """The Ready condition is True."""
    schedulable: bool = True
    """Not cordoned (spec.unschedulable unset)."""

    @property
    def usable(self) -> bool:
        """Ready, schedulable, and free of the node-state taints that keep pods away."""
        state_taints = [t for t in self.taints if _state(t) and _blocks(t)]
        return self.ready and self.schedulable and not state_taints


@dataclass(frozen=True)
class ProductCapacity:
    """One eligible GPU product: its eligible nodes and the GPUs of the usable ones."""

    product: str
    nodes: int
    gpus: int


def gpu_node(node: Mapping[str, Any]) -> GpuNode | None:
    """The GPU node a Node object describes, or None for a node without a labelled GPU
    product or without allocatable GPUs."""
    meta, spec, status = (node.get(k) or {} for k in ("metadata", "spec", "status"))
    labels = meta.get("labels") or {}
    product = labels.get(GPU_PRODUCT_LABEL)
    gpus = _count((status.get("allocatable") or {}).get(GPU_RESOURCE))
    if not product or gpus <= 0:
        return None
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("taints") or []
    )
    return GpuNode(
        name=str(meta.get("name") or ""),
        product=str(product),
        gpus=gpus,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        taints=taints,
        ready=conditions.get("Ready") == "True",
        schedulable=not spec.get("unschedulable"),
    )


def _count(quantity: Any) -> int:
    """An extended resource's quantity (whole numbers only: GPUs are not divided)."""
    try:
        return int(str(quantity))
    except ValueError:
        return 0


def _blocks(taint: Taint) -> bool:
    return taint.effect in BLOCKING_EFFECTS


def _state(taint: Taint) -> bool:
    """A taint that says what state the node is in: Kubernetes' own, and the operator's
    for a node whose pods answered wrong (`names.TAINT_SUSPECT_ANSWERS`)."""
    return taint.key.startswith(NODE_STATE_TAINTS) or taint.key == TAINT_SUSPECT_ANSWERS


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    """Whether a pod with `tolerations` tolerates `taint` (core/v1's matching: an empty
    effect matches every effect, Exists with no key every taint)."""
    for toleration in tolerations:
        if toleration.effect is not None and toleration.effect != taint.effect:
            continue
        if toleration.operator == "Exists":
            if not toleration.key or toleration.key == taint.key:
                return True
        elif toleration.key == taint.key and (toleration.value or "") == taint.value:
            return True
    return False


def eligible(node: GpuNode, spec: InferenceDeploymentSpec) -> bool:
    """Whether the object's pods may run on `node`: its labels match the node selector, its
    policy taints are tolerated, its product is listed (where any is)."""
    fleet = spec.runtime.gpu_fleet
    listed = {p.name for p in fleet.products} if fleet is not None else set()
    if listed and node.product not in listed:
        return False
    labels = dict(node.labels)
    if any(labels.get(key) != value for key, value in spec.runtime.node_selector.items()):
        return False
    policy = [t for t in node.taints if _blocks(t) and not _state(t)]
    return all(tolerates(spec.runtime.tolerations, taint) for taint in policy)


def eligible_products(
    nodes: Iterable[GpuNode], spec: InferenceDeploymentSpec
) -> tuple[ProductCapacity, ...]:
    """The GPU products the object may run on, in name order, each with its eligible
    nodes and the GPUs of those that are usable now."""
    found: dict[str, list[GpuNode]] = {}
    for node in nodes:
        if eligible(node, spec):
            found.setdefault(node.product, []).append(node)
    return tuple(
        ProductCapacity(product, len(of), sum(n.gpus for n in of if n.usable))
        for product, of in sorted(found.items())
    )
