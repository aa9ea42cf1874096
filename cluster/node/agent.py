"""The node agent: one Node, its scheduler and its kubelet, for a cluster on one machine.

- **Node**: registers a Node with the machine's CPUs and memory as allocatable (and
  `nvidia.com/gpu` when asked, so GPU manifests schedule), reports Ready, and renews its
  Lease in `kube-node-lease` as a kubelet's heartbeat.
- **Scheduler** (`scheduler`): binds a pending pod to the node when it fits.
- **Kubelet**: each pod bound to the node gets a `PodWorker` (`pods`) with its own address
  in the node's /24 of the pod network, handed out round-robin so an address is not
  reused while clients may still hold it; the logs endpoint (`kubelet_server`).
- **Storage** (`provisioner`): claims of the default StorageClass `local` as directories.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import itertools
import logging
import os
import platform
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubeinfer.cluster.node import images
from kubeinfer.cluster.node.api import STRATEGIC, ApiError, KubeObject, NodeApi
from kubeinfer.cluster.node.kubelet_server import KubeletServer
from kubeinfer.cluster.node.pods import NodeContext, PodWorker, rfc3339
from kubeinfer.cluster.node.provisioner import LocalPathProvisioner
from kubeinfer.cluster.node.scheduler import Scheduler
from kubeinfer.cluster.node.volumes import Endpoints

log = logging.getLogger(__name__)
HEARTBEAT_SECONDS = 10.0
LEASE_SECONDS = 40
GPU_RESOURCE = "nvidia.com/gpu"


class Addresses:
    """Pod addresses in the pod CIDR, handed out round-robin so that an address is not
    reused while a client may still hold a connection to its last pod. In the loopback
    range, 127.0.0.0/24 (the node's own 127.0.0.1) is left out."""

    def __init__(self, cidr: str) -> None:
        network = ipaddress.ip_network(cidr)
        skip = ipaddress.ip_network("127.0.0.0/24")
        usable = (str(a) for a in network.hosts() if a not in skip and a.packed[-1] not in (0, 255))
        self._cycle = itertools.cycle(usable)
        self.used: set[str] = set()

    def allocate(self) -> str:
        while True:
            address = next(self._cycle)
            if address not in self.used:
                self.used.add(address)
                return address

    def release(self, address: str) -> None:
        self.used.discard(address)


def memory_bytes() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 8 * 2**30


class NodeAgent:
    def __init__(
        self,
        api: NodeApi,
        *,
        name: str,
        directory: Path,
        server: str,
        ca_file: Path,
        kubernetes_version: str,
        pod_cidr: str,
        gpus: int = 0,
        cpus: str | None = None,
        extra_images: Mapping[str, images.ImageConfig] | None = None,
        backoff_initial_seconds: float = 10.0,
        kubelet_tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        self.api, self.name, self.directory = api, name, directory
        self.version = kubernetes_version
        self.allocatable = {
            "cpu": str(cpus or os.cpu_count() or 1),
            "memory": str(memory_bytes()),
            "pods": "110",
            "ephemeral-storage": "100Gi",
        }
        if gpus:
            self.allocatable[GPU_RESOURCE] = str(gpus)
        self.labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                platform.machine(), platform.machine()
            ),
        }
        self.context = NodeContext(
            api=api,
            node_name=name,
            host_ip="127.0.0.1",
            directory=directory,
            server=server,
            ca_file=ca_file,
            endpoints=Endpoints(api),
            extra_images=extra_images or {},
            backoff_initial_seconds=backoff_initial_seconds,
            record_event=self.record_event,
        )
        self.pod_cidr = pod_cidr
        self.addresses = Addresses(pod_cidr)
        self.workers: dict[str, PodWorker] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.finished: set[str] = set()
        self.scheduler = Scheduler(
            api,
            name,
            self.labels,
            self.allocatable,
            lambda: [w.pod["spec"] for w in self.workers.values() if not w.finished],
            self.record_event,
        )
        self.provisioner = LocalPathProvisioner(api, directory)
        self._events: set[asyncio.Task[None]] = set()
        self.kubelet = (
            KubeletServer(self.pod_directory, self.container_running, *kubelet_tls)
            if kubelet_tls
            else None
        )
        """The logs endpoint the API server proxies `kubectl logs` to."""

    # -- running -----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        if self.kubelet is not None:
            await self.kubelet.start()
        await self.register()
        await self.provisioner.ensure_storage_class()
        loops = [
            asyncio.create_task(self._watch_pods()),
            asyncio.create_task(self._heartbeat()),
            asyncio.create_task(self.scheduler.run()),
            asyncio.create_task(self.provisioner.run()),
        ]
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([*loops, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopping and task.exception():
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in [*loops, stopping]:
                task.cancel()
            await self.shutdown()
            if self.kubelet is not None:
                await self.kubelet.close()

    async def shutdown(self) -> None:
        """Stops every pod's containers (the node goes away; the pods are not deleted)."""
        for worker in self.workers.values():
            worker.is_gone = worker.deleting = True
            worker.wake.set()
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=60)
        for task in self.tasks.values():
            task.cancel()

    # -- the Node ----------------------------------------------------------------------------
    def _node_status(self) -> dict[str, Any]:
        now = rfc3339()
        return {
            "capacity": self.allocatable,
            "allocatable": self.allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubeinfer node agent is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": self._ready_since,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {
                "kubeletEndpoint": {"Port": self.kubelet.port if self.kubelet else 0}
            },
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": platform.release(),
                "osImage": platform.platform(),
                "containerRuntimeVersion": "kubeinfer-process://0.1",
                "kubeletVersion": self.version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": self.labels["kubernetes.io/arch"],
            },
        }

    async def register(self) -> None:
        self._ready_since = rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self.labels},
            "spec": {"podCIDR": self.pod_cidr, "podCIDRs": [self.pod_cidr]},
        }
        try:
            await self.api.request("POST", "/api/v1/nodes", body=body)
        except ApiError as error:
            if error.status != 409:
                raise
        await self.api.request(
            "PATCH",
            f"/api/v1/nodes/{self.name}/status",
            body={"status": self._node_status()},
            content_type=STRATEGIC,
        )

    async def _heartbeat(self) -> None:
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        while True:
            with contextlib.suppress(ApiError):
                await self.api.request(
                    "PATCH",
                    f"/api/v1/nodes/{self.name}/status",
                    body={"status": self._node_status()},
                    content_type=STRATEGIC,
                )
                now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
                lease = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": "kube-node-lease"},
                    "spec": {
                        "holderIdentity": self.name,
                        "renewTime": now,
                        "leaseDurationSeconds": LEASE_SECONDS,
                    },
                }
                if await self.api.get(lease_path) is None:
                    await self.api.request("POST", lease_path.rsplit("/", 1)[0], body=lease)
                else:
                    await self.api.request(
                        "PATCH", lease_path, body={"spec": lease["spec"]}, content_type=STRATEGIC
                    )
            await asyncio.sleep(HEARTBEAT_SECONDS)

    # -- for the kubelet endpoint ------------------------------------------------------------
    def pod_directory(self, namespace: str, name: str) -> Path | None:
        """The newest pod of that name's files (a finished pod's are kept)."""
        for worker in self.workers.values():
            if (worker.namespace, worker.name) == (namespace, name):
                return worker.directory
        found = sorted(
            (self.directory / "pods").glob(f"{namespace}_{name}_*"),
            key=lambda path: path.stat().st_mtime,
        )
        return found[-1] if found else None

    def container_running(self, namespace: str, name: str, container: str) -> bool:
        for worker in self.workers.values():
            if (worker.namespace, worker.name) == (namespace, name) and not worker.finished:
                return any(
                    c.name == container and c.process is not None
                    for c in worker.init + worker.containers
                )
        return False

    # -- pods --------------------------------------------------------------------------------
    async def _watch_pods(self) -> None:
        async for kind, obj in self.api.watch("/api/v1/pods"):
            if kind == "SYNC":
                current = {p["metadata"]["uid"]: p for p in obj.get("items") or []}
                for uid in list(self.workers):
                    if uid not in current:
                        self.workers[uid].gone()
                self.scheduler.resync(current)
                for pod in current.values():
                    self._observe(pod)
            elif kind == "DELETED":
                uid = obj["metadata"]["uid"]
                self.scheduler.forget(uid)
                if uid in self.workers:
                    self.workers[uid].gone()
            else:
                self._observe(obj)

    def _observe(self, pod: KubeObject) -> None:
        uid = pod["metadata"]["uid"]
        node = pod["spec"].get("nodeName")
        if not node:
            self.scheduler.consider(pod)
            return
        self.scheduler.bound(uid)
        if node != self.name:
            return
        if uid in self.workers:
            self.workers[uid].update(pod)
            return
        if pod["metadata"].get("deletionTimestamp"):
            # Nothing runs for it (never started, or finished): the kubelet's final delete,
            # without which the object would wait for ever.
            task = asyncio.create_task(self._delete_unstarted(pod))
            self._events.add(task)  # kept until done, as a pending Event is
            task.add_done_callback(self._events.discard)
            return
        if uid not in self.finished and (pod.get("status") or {}).get("phase") not in (
            "Succeeded",
            "Failed",
        ):
            worker = PodWorker(self.context, pod, self.addresses.allocate())
            self.workers[uid] = worker
            task = asyncio.create_task(worker.run())
            self.tasks[uid] = task
            task.add_done_callback(functools.partial(self._worker_done, uid))

    def _worker_done(self, uid: str, task: asyncio.Task[None]) -> None:
        worker = self.workers.pop(uid)
        self.tasks.pop(uid, None)
        self.addresses.release(worker.ip)
        self.finished.add(uid)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "Pod worker failed: pod=%s/%s",
                worker.namespace,
                worker.name,
                exc_info=task.exception(),
            )

    async def _delete_unstarted(self, pod: KubeObject) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):
            await self.api.request(
                "DELETE",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )

    # -- events ------------------------------------------------------------------------------
    def record_event(
        self, obj: KubeObject, type_: str, reason: str, message: str, source: str = "kubelet"
    ) -> None:
        task = asyncio.create_task(self._post_event(obj, type_, reason, message, source))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def _post_event(
        self, obj: KubeObject, type_: str, reason: str, message: str, source: str
    ) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace", "default")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", "Pod"),
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": source, "host": self.name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": source,
            "reportingInstance": self.name,
        }
        with contextlib.suppress(ApiError):
            await self.api.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)
