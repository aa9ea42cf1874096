"""What the cost of 1,000 inferences (`status.cost`, `kubeinfer.contract.cost`) is computed
from: the nodes and their prices, each serving pod's run on its node, the operator's
memory of the pods of the window, and the inferences read. Pure.

A pod runs from its `status.startTime` (the kubelet took it: its node is held, image pull
and engine load included) for as long as it is listed and neither Succeeded nor Failed
(a terminating pod holds its node until it is gone). Its share of its node and the node's
price (`price_per_node_hour`: its `nvidia.com/gpu.product` label's, else `cpu`'s) are
read when it is seen; a pod whose node has no price, or whose share is not known (no CPU
request on a CPU node), is not priced, and is left out of the figure with its inferences.

The pods of the window outlive their pod objects in `CostHistory.runs`, which the
controller keeps between passes (as the autoscaler's history): a pod gone counts until
the last pass that saw it. Its error: a gone pod ran for up to one pass interval longer
than counted; after a restart of the operator the pods gone before it are not known, so
the first window after it counts only the pods still there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from kubeinfer.contract.cost import CPU_NODES, PodUsage, node_share
from kubeinfer.operator.state.gpu_nodes import GPU_PRODUCT_LABEL, GPU_RESOURCE

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PricedNode:
    """What the cost reads of one node."""

    name: str
    gpu_product: str | None
    """Its `nvidia.com/gpu.product` label (None: a node without one, priced as `cpu`)."""
    gpus: float
    """Allocatable nvidia.com/gpu."""
    cpu_cores: float
    """Allocatable CPU, in cores."""

    def price_per_hour(self, prices: Mapping[str, float]) -> float | None:
        """The node's price per node-hour: its GPU product's, else `cpu`'s; None without."""
        return prices.get(self.gpu_product or CPU_NODES)


@dataclass(frozen=True)
class PodRun:
    """One serving pod's run on its node, as the passes saw it."""

    pod: str
    node: str
    started: datetime
    last_seen: datetime
    node_share: float | None
    node_price_per_hour: float | None
    running: bool = True
    """Listed and running at `last_seen` (the latest pass); False once a pass no longer
    finds it running: it counts until `last_seen`."""

    @property
    def priced(self) -> bool:
        return self.node_share is not None and self.node_price_per_hour is not None

    @property
    def price_per_hour(self) -> float | None:
        """Its share of its node's price per hour (None: not priced)."""
        if self.node_share is None or self.node_price_per_hour is None:
            return None
        return self.node_share * self.node_price_per_hour


@dataclass(frozen=True)
class InferenceSnapshot:
    """One direct read of the serving pods' answered requests: each pod's count, since it
    started."""

    time: datetime
    by_pod: Mapping[str, float]


@dataclass(frozen=True)
class CostHistory:
    """What the controller keeps between passes: the pods of the window, and (for a direct
    read, which has no past) the earlier counts of answered requests."""

    runs: tuple[PodRun, ...] = ()
    snapshots: tuple[InferenceSnapshot, ...] = ()


@dataclass(frozen=True)
class CostReading:
    """The inferences each pod answered over the window, as read this pass, or why they
    could not be."""

    inferences: Mapping[str, float] | None = None
    """Answered requests (HTTP 200) in the window, by pod."""
    covered_seconds: float = 0.0
    """The seconds the counts cover: the window, or (a direct read whose past is younger)
    less."""
    error: str = ""


def _time(value: Any) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339) as an aware datetime, or None."""
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def cpu_cores(quantity: Any) -> float | None:
    """A CPU quantity (`500m`, `2`, `1.5`) in cores; None where it is not one."""
    text = str(quantity).strip() if quantity is not None else ""
    scale = Decimal(1)
    if text.endswith("m"):
        text, scale = text[:-1], Decimal("0.001")
    try:
        value = Decimal(text) * scale
    except InvalidOperation:
        return None
    return float(value) if value.is_finite() and value >= 0 else None


def _count(quantity: Any) -> float:
    try:
        return max(0.0, float(str(quantity)))
    except ValueError:
        return 0.0


def priced_node(node: Mapping[str, Any]) -> PricedNode:
    """The node a Node object describes."""
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    allocatable = status.get("allocatable") or {}
    product = (meta.get("labels") or {}).get(GPU_PRODUCT_LABEL)
    return PricedNode(
        name=str(meta.get("name") or ""),
        gpu_product=str(product) if product else None,
        gpus=_count(allocatable.get(GPU_RESOURCE)),
        cpu_cores=cpu_cores(allocatable.get("cpu")) or 0.0,
    )


def _requested(pod: Mapping[str, Any], resource: str, cpu: bool) -> float:
    """A resource the pod's containers request (their limit where no request is set, as
    Kubernetes defaults it), summed."""
    total = 0.0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(resource)
        if amount is None:
            amount = (resources.get("limits") or {}).get(resource)
        if amount is not None:
            total += (cpu_cores(amount) or 0.0) if cpu else _count(amount)
    return total


def pod_run(
    pod: Mapping[str, Any],
    nodes: Mapping[str, PricedNode],
    prices: Mapping[str, float],
    now: datetime,
) -> PodRun | None:
    """The pod's run as seen now, or None where it does not run: not on a node yet, not
    started, or finished. Its node unknown (not listed): running, but not priced."""
    meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
    node_name, started = spec.get("nodeName"), _time(status.get("startTime"))
    if not node_name or started is None or status.get("phase") in FINISHED_PHASES:
        return None
    node = nodes.get(str(node_name))
    share = price = None
    if node is not None:
        share = node_share(
            _requested(pod, GPU_RESOURCE, cpu=False),
            node.gpus,
            _requested(pod, "cpu", cpu=True),
            node.cpu_cores,
        )
        price = node.price_per_hour(prices)
    return PodRun(
        pod=str(meta.get("name") or ""),
        node=str(node_name),
        started=min(started, now),
        last_seen=now,
        node_share=share,
        node_price_per_hour=price,
    )


def pod_runs(
    pods: Iterable[Mapping[str, Any]],
    nodes: Mapping[str, PricedNode],
    prices: Mapping[str, float],
    now: datetime,
) -> tuple[PodRun, ...]:
    """`pod_run` of each pod that runs, by name."""
    runs = (pod_run(pod, nodes, prices, now) for pod in pods)
    return tuple(sorted((r for r in runs if r is not None), key=lambda r: r.pod))


def remember_runs(
    kept: Sequence[PodRun], seen: Sequence[PodRun], now: datetime, window_seconds: int
) -> tuple[PodRun, ...]:
    """The pods of the window after a pass that saw `seen` running: those replace their
    earlier entries; a pod kept but not seen now has stopped, at its last sight; one that
    stopped before the window is forgotten."""
    start = now - timedelta(seconds=window_seconds)
    runs = {run.pod: run for run in kept}
    for run in runs.values():
        if run.running:
            runs[run.pod] = replace(run, running=False)
    runs.update({run.pod: run for run in seen})
    return tuple(
        sorted((r for r in runs.values() if r.running or r.last_seen > start), key=lambda r: r.pod)
    )


def running_seconds(run: PodRun, now: datetime, window_seconds: float) -> float:
    """The seconds of the window (the last `window_seconds` up to `now`) the pod ran."""
    start = max(run.started, now - timedelta(seconds=window_seconds))
    end = now if run.running else min(run.last_seen, now)
    return max(0.0, (end - start).total_seconds())


def usages(runs: Iterable[PodRun], now: datetime, window_seconds: float) -> dict[str, PodUsage]:
    """The priced pods of the window, each as the formula reads it, by pod."""
    return {
        run.pod: PodUsage(
            run.node_share, run.node_price_per_hour, running_seconds(run, now, window_seconds)
        )
        for run in runs
        if run.node_share is not None and run.node_price_per_hour is not None
    }
