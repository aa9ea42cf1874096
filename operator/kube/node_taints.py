"""Taints the nodes the known-answer checks named suspect, and removes the operator's
taints from the nodes no longer named (`reconcile.node_taints` decides which), where the
operator's setting `known_answers.taint_suspect_nodes` asks. Thin I/O.

One labelled LIST finds the nodes the operator tainted (its mark); a node to taint that is
not among them is read with one GET. Each is written with a JSON patch guarded by its
resourceVersion, and written again on a fresh read where the node changed meanwhile (the
kubelet and the node controllers write nodes often). The nodes are looked at again only
when the set of suspect nodes changed or `max_age_seconds` (the resync interval) passed,
so a fleet of objects costs one list per interval, not one per pass. A write that fails
(the node kept changing, or the operator may not patch nodes) is logged and retried at
the next sync: the taint keeps new pods off a node and is never what an object's own pass
depends on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from kubeinfer.operator.kube.client import ApiError, JsonPatch, KubeClient, KubeObject
from kubeinfer.operator.kube.resources import NODE
from kubeinfer.operator.reconcile.node_taints import (
    MARK_LABEL,
    TAINT_EFFECT,
    TAINT_KEY,
    plan_taints,
    taint_operations,
    untaint_operations,
)

logger = logging.getLogger(__name__)

WRITE_ATTEMPTS = 3
"""Tries of one node's write, each on a fresh read after the node changed under it."""


class SuspectNodeTaints:
    """Keeps the operator's taint on exactly the suspect nodes, for all objects together."""

    def __init__(
        self,
        client: KubeClient,
        max_age_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self._synced: tuple[frozenset[str], bool, float] | None = None
        """(the suspect nodes, whether complete, when) of the last sync that wrote all."""
        self._lock = asyncio.Lock()

    async def sync(self, suspect: frozenset[str], complete: bool, now: datetime) -> int:
        """Taints `suspect`, untaints the other marked nodes (only when `complete`);
        returns the writes made."""
        async with self._lock:  # passes that end together: one of them writes
            if self._synced is not None:
                last, was_complete, at = self._synced
                fresh = self.clock() - at < self.max_age_seconds
                if fresh and last == suspect and was_complete == complete:
                    return 0
            try:
                marked = await self.client.list(NODE, "", MARK_LABEL)
            except ApiError as error:
                logger.warning("Suspect nodes not listed: error=%s", error)
                return 0
            plan = plan_taints(suspect, marked, complete)
            by_name = {str(n["metadata"]["name"]): n for n in marked}
            writes, failed = 0, False
            for name in plan.taint:
                try:
                    node = by_name.get(name) or await self.client.get(NODE, "", name)
                    if node is None or not await self._patch(
                        node, lambda n: taint_operations(n, now)
                    ):
                        continue  # gone: nothing new lands on it anyway
                except ApiError as error:
                    logger.warning("Node not tainted: node=%s error=%s", name, error)
                    failed = True
                    continue
                logger.warning("Node tainted: node=%s taint=%s:%s (pods of different engines "
                               "answered wrong there)", name, TAINT_KEY, TAINT_EFFECT)  # fmt: skip
                writes += 1
            for name in plan.untaint:
                try:
                    if not await self._patch(by_name[name], untaint_operations):
                        continue
                except ApiError as error:
                    logger.warning("Node not untainted: node=%s error=%s", name, error)
                    failed = True
                    continue
                logger.info("Node untainted: node=%s taint=%s (no InferenceDeployment names "
                            "it suspect any more)", name, TAINT_KEY)  # fmt: skip
                writes += 1
            self._synced = None if failed else (suspect, complete, self.clock())
            return writes

    async def _patch(self, node: KubeObject, operations: Callable[[KubeObject], JsonPatch]) -> bool:
        """Writes `operations(node)`, read again and rebuilt where the node changed since it
        was read (409, or 422: its resourceVersion test failed; the kubelet and the node
        controllers write nodes often), up to WRITE_ATTEMPTS times; False where it is
        gone."""
        name = str(node["metadata"]["name"])
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                await self.client.json_patch(NODE, "", name, operations(node))
                return True
            except ApiError as error:
                if error.status == 404:
                    return False
                if error.status not in (409, 422) or attempt == WRITE_ATTEMPTS:
                    raise
            fresh = await self.client.get(NODE, "", name)
            if fresh is None:
                return False
            node = fresh
        return False
