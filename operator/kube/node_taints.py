"""Taints the nodes the known-answer checks named suspect, and removes the operator's
taints from the nodes no longer named (`reconcile.node_taints` decides which), where the
operator's setting `known_answers.taint_suspect_nodes` asks. Thin I/O.

One labelled LIST finds the nodes the operator tainted (its mark); a node to taint that is
not among them is read with one GET. Each is written with a JSON patch guarded by its
resourceVersion. The nodes are looked at again only when the set of suspect nodes changed
or `max_age_seconds` (the resync interval) passed, so a fleet of objects costs one list
per interval, not one per pass. A write that fails (the node changed meanwhile, or is
gone, or the operator may not patch nodes) is logged and retried at the next sync: the
taint keeps new pods off a node and is never what an object's own pass depends on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from kubeinfer.operator.kube.client import ApiError, KubeClient
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
                    if node is None:
                        continue  # gone: nothing new lands on it anyway
                    await self.client.json_patch(NODE, "", name, taint_operations(node, now))
                except ApiError as error:
                    logger.warning("Node not tainted: node=%s error=%s", name, error)
                    failed = True
                    continue
                logger.warning("Node tainted: node=%s taint=%s:%s (pods of different engines "
                               "answered wrong there)", name, TAINT_KEY, TAINT_EFFECT)  # fmt: skip
                writes += 1
            for name in plan.untaint:
                try:
                    await self.client.json_patch(NODE, "", name, untaint_operations(by_name[name]))
                except ApiError as error:
                    if error.status != 404:
                        logger.warning("Node not untainted: node=%s error=%s", name, error)
                        failed = True
                    continue
                logger.info("Node untainted: node=%s taint=%s (no InferenceDeployment names "
                            "it suspect any more)", name, TAINT_KEY)  # fmt: skip
                writes += 1
            self._synced = None if failed else (suspect, complete, self.clock())
            return writes
