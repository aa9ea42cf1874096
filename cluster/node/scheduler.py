"""The node as the cluster's scheduler: a pending pod with the default scheduler is
bound to the node when it fits (`scheduling.unschedulable_reason`, the scheduler's
filters for one node); otherwise its PodScheduled condition and a FailedScheduling
Event say why, as kube-scheduler words it, and it waits to be tried again. The requests
of pods bound but not yet seen bound through the watch count as taken, so two pods bound
in one pass never overcommit the node."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from kubeinfer.cluster.node.api import STRATEGIC, ApiError, KubeObject, NodeApi
from kubeinfer.cluster.node.pods import rfc3339
from kubeinfer.cluster.node.scheduling import unschedulable_reason

SCHEDULE_RETRY_SECONDS = 2.0


class Scheduler:
    """`running()` gives the specs of the pods the node runs; `record_event` posts one."""

    def __init__(
        self,
        api: NodeApi,
        node_name: str,
        labels: Mapping[str, str],
        allocatable: Mapping[str, str],
        running: Callable[[], Iterable[Mapping[str, Any]]],
        record_event: Callable[..., Any],
    ) -> None:
        self.api, self.name, self.labels = api, node_name, labels
        self.allocatable, self.running, self.record_event = allocatable, running, record_event
        self.pending: dict[str, KubeObject] = {}
        """Pods to try to schedule now."""
        self.waiting: dict[str, tuple[KubeObject, float]] = {}
        """Pods that did not fit, and when to try them again."""
        self.reserved: dict[str, KubeObject] = {}
        """Pods bound but not yet seen bound through the watch: their requests count."""
        self.unschedulable_said: dict[str, str] = {}

    def consider(self, pod: KubeObject) -> None:
        """An unbound pod, as the watch shows it now."""
        uid = pod["metadata"]["uid"]
        scheduler = pod["spec"].get("schedulerName") or "default-scheduler"
        if scheduler != "default-scheduler" or pod["metadata"].get("deletionTimestamp"):
            return
        if uid in self.waiting:
            self.waiting[uid] = (pod, self.waiting[uid][1])  # its newest form
        else:
            self.pending[uid] = pod

    def bound(self, uid: str) -> None:
        """The watch shows the pod bound (to this node or another)."""
        self.pending.pop(uid, None)
        self.waiting.pop(uid, None)
        self.reserved.pop(uid, None)

    def forget(self, uid: str) -> None:
        self.bound(uid)
        self.unschedulable_said.pop(uid, None)

    def resync(self, current: Iterable[str]) -> None:
        """After a fresh list: what no longer exists is forgotten."""
        live = set(current)
        self.pending = {}
        self.waiting = {u: w for u, w in self.waiting.items() if u in live}
        self.reserved = {u: r for u, r in self.reserved.items() if u in live}

    async def run(self) -> None:
        while True:
            now = time.monotonic()
            for uid, (pod, retry_at) in list(self.waiting.items()):
                if retry_at <= now:
                    del self.waiting[uid]
                    self.pending.setdefault(uid, pod)
            for uid, pod in sorted(
                self.pending.items(), key=lambda kv: kv[1]["metadata"]["creationTimestamp"]
            ):
                if uid in self.pending:
                    await self._schedule(pod)
            await asyncio.sleep(0.05 if self.pending else 0.2)

    async def _schedule(self, pod: KubeObject) -> None:
        meta = pod["metadata"]
        running = [*self.running(), *(reserved["spec"] for reserved in self.reserved.values())]
        allocatable = {
            k: Decimal(str(v)) if k != "memory" else Decimal(v)
            for k, v in self.allocatable.items()
            if k != "ephemeral-storage"
        }
        reason = unschedulable_reason(pod["spec"], self.labels, allocatable, running)
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        if reason is None:
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": meta["name"], "uid": meta["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.name},
            }
            self.pending.pop(meta["uid"], None)
            try:
                await self.api.request("POST", f"{path}/binding", body=binding)
            except ApiError as error:
                if error.status in (404, 409):
                    return  # gone, or bound already: nothing to announce
                # Refused for now (403 while its namespace is being deleted, say): tried
                # again later, as kube-scheduler requeues a failed binding, never fatal.
                self.waiting[meta["uid"]] = (pod, time.monotonic() + SCHEDULE_RETRY_SECONDS)
                return
            self.reserved[meta["uid"]] = pod
            await self._set_scheduled(path, True, None)
            self.record_event(
                pod,
                "Normal",
                "Scheduled",
                f"Successfully assigned {meta['namespace']}/{meta['name']} to {self.name}",
                source="default-scheduler",
            )
            return
        if self.unschedulable_said.get(meta["uid"]) != reason:
            self.unschedulable_said[meta["uid"]] = reason
            await self._set_scheduled(path, False, reason)
            self.record_event(
                pod, "Warning", "FailedScheduling", reason, source="default-scheduler"
            )
        self.pending.pop(meta["uid"], None)
        self.waiting[meta["uid"]] = (pod, time.monotonic() + SCHEDULE_RETRY_SECONDS)

    async def _set_scheduled(self, path: str, scheduled: bool, message: str | None) -> None:
        condition = {
            "type": "PodScheduled",
            "status": "True" if scheduled else "False",
            "lastProbeTime": None,
            "lastTransitionTime": rfc3339(),
        }
        if message:
            condition.update(reason="Unschedulable", message=message)
        with contextlib.suppress(ApiError):
            await self.api.request(
                "PATCH",
                f"{path}/status",
                body={"status": {"conditions": [condition]}},
                content_type=STRATEGIC,
            )
