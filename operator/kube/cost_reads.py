"""The cost's reads for one pass (`reconcile.reads.CostRead`): the serving pods and the
nodes they run on, the pods of the window remembered (`state.cost_readings`), and when the
figure is due the inferences they answered (`metrics_sources.cost`).

The nodes come from one LIST of every node, shared by every pass that prices pods, for
`max_age_seconds` (the resync interval), so a cluster of hundreds of nodes and objects
costs one list per interval (`PricedNodes`). A node's price changes only with its GPU
product label or its allocatable resources, which change rarely; a pod on a node the list
does not have yet (a node just added) is not priced until the next list.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from kubeinfer.operator.kube.cache import Lister
from kubeinfer.operator.kube.client import POD, KubeClient
from kubeinfer.operator.kube.resources import NODE
from kubeinfer.operator.metrics_sources.cost import read_inferences
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.metrics_sources.source import MetricsSource
from kubeinfer.operator.reconcile.reads import CostRead
from kubeinfer.operator.settings import Cost
from kubeinfer.operator.state import names
from kubeinfer.operator.state.cost_readings import (
    CostHistory,
    PricedNode,
    pod_runs,
    priced_node,
    remember_runs,
)
from kubeinfer.operator.state.observed import ObservedState

Nodes = Callable[[], Awaitable[Mapping[str, PricedNode]]]


class PricedNodes:
    """Every node by name, listed at most once per `max_age_seconds` for all passes."""

    def __init__(
        self,
        client: KubeClient,
        max_age_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self._listed: dict[str, PricedNode] | None = None
        self._listed_at = 0.0
        self._lock = asyncio.Lock()

    async def read(self) -> Mapping[str, PricedNode]:
        async with self._lock:  # passes waiting here share the list one of them makes
            if self._listed is None or self.clock() - self._listed_at >= self.max_age_seconds:
                listed = await self.client.list(NODE, "", "")
                self._listed = {node.name: node for node in map(priced_node, listed)}
                self._listed_at = self.clock()
            return self._listed


@dataclass(frozen=True)
class CostInputs:
    """What the controller hands the gather for the cost: the settings (with prices), the
    shared node list, and its memory of this object's window."""

    settings: Cost
    nodes: Nodes
    history: CostHistory = field(default_factory=CostHistory)


async def read_cost(
    client: Lister,
    source: MetricsSource,
    observed: ObservedState,
    wanted: CostRead,
    inputs: CostInputs,
    now: datetime,
) -> dict[str, object]:
    """The observed state's `cost_history` (the window's pods, this pass' runs among them)
    and, when due, its `cost` (the inferences the priced ones answered)."""
    owner = observed.owner
    selector = names.selector_string(names.serving_selector(owner.name))
    pods = await client.list(POD, owner.namespace, selector)
    prices = inputs.settings.price_per_node_hour
    seen = pod_runs(pods, await inputs.nodes(), prices, now)
    runs = remember_runs(inputs.history.runs, seen, now, wanted.window_seconds)
    history = replace(inputs.history, runs=runs)
    if not wanted.inferences:
        return {"cost_history": history}
    priced = [run.pod for run in runs if run.priced]
    scope = Scope(owner.namespace, owner.name)
    reading, snapshots = await read_inferences(
        source, scope, priced, wanted.window_seconds, now, history.snapshots
    )
    return {"cost": reading, "cost_history": replace(history, snapshots=snapshots)}
