"""The cluster's GPU nodes, read for the passes over InferenceDeployments on a mixed GPU
fleet (`state.gpu_nodes`), and the watch events that say when to read them again.

One LIST of the nodes labelled `nvidia.com/gpu.product` serves every pass that needs
them for `max_age_seconds` (the resync interval): a cluster of hundreds of nodes and
objects costs one list per interval, not one per pass. The node watch (`handlers`)
reports each event to `observe`, which compares the node as the decisions read it with
what was last seen: a new node, a removed one, or a change of product, GPUs, readiness,
cordon, labels or taints makes the next pass list again, and asks for a pass over every
object that read the nodes since the last such change (the heartbeats that change nothing
of this cost nothing). The list, not the events, is what passes decide from: an event
missed or reordered cannot leave a product out for longer than one interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubeinfer.operator.kube.client import KubeClient
from kubeinfer.operator.kube.resources import NODE
from kubeinfer.operator.state.gpu_nodes import GPU_PRODUCT_LABEL, GpuNode, gpu_node

ObjectKey = tuple[str, str]
"""(namespace, name) of an InferenceDeployment."""

RELIST_AFTER_CHANGE_SECONDS = 1.0
"""The least time between two lists after changes: a burst of node events (a node pool
scaling up) is read in one list."""


class GpuNodes:
    """The GPU nodes, listed at most once per `max_age_seconds` (sooner after a change a
    watch event reported), for all passes together."""

    def __init__(
        self,
        client: KubeClient,
        max_age_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self._listed: tuple[GpuNode, ...] | None = None
        self._listed_at = 0.0
        self._stale = False
        self._lock = asyncio.Lock()
        self._readers: set[ObjectKey] = set()
        self._seen: dict[str, GpuNode | None] = {}

    async def read(self, reader: ObjectKey) -> tuple[GpuNode, ...]:
        """The GPU nodes (by name), for a pass over `reader`, which a change will trigger."""
        self._readers.add(reader)
        async with self._lock:  # passes waiting here share the list one of them makes
            age = self.clock() - self._listed_at
            due = age >= self.max_age_seconds or (
                self._stale and age >= RELIST_AFTER_CHANGE_SECONDS
            )
            if self._listed is None or due:
                self._stale = False  # before the list: a change during it marks it again
                listed = await self.client.list(NODE, "", GPU_PRODUCT_LABEL)
                found = (gpu_node(each) for each in listed)
                self._listed = tuple(sorted((n for n in found if n), key=lambda n: n.name))
                self._listed_at = self.clock()
            return self._listed

    def observe(self, body: Mapping[str, Any], deleted: bool) -> set[ObjectKey]:
        """A node watch event: the objects to reconcile when it changed what the decisions
        read (they are forgotten until they read the nodes again), else none."""
        name = str((body.get("metadata") or {}).get("name") or "")
        now = None if deleted else gpu_node(body)
        if name in self._seen and self._seen[name] == now:
            return set()
        first = name not in self._seen
        self._seen[name] = now
        if deleted:
            del self._seen[name]
        if first and self._listed is not None and now in self._listed:
            return set()  # the watch's first sight of a node the list already has
        self._stale = True
        readers, self._readers = self._readers, set()
        return readers
