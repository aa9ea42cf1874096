"""Simulated GPU nodes in a cluster: KWOK (`sigs.k8s.io/kwok`) keeps them and their pods
alive against the real API server, with no process behind either. `kubeinfer cluster up
--simulated-gpu-nodes H100=2 ...` starts a cluster with them, to rehearse a mixed fleet
on one machine (docs/gpu-fleets.md); the fleet tests and benchmark start them in theirs.

`start(cluster, nodes)` starts the KWOK controller in the cluster's network namespace like
the cluster's other processes (its log in `logs/kwok.log`, its pid in `state.json`, so
`control_plane.down` stops it), with the lifecycle of `fleet_stages`, and creates the
Nodes. The real kube-scheduler places pods on them, the real controllers (Jobs,
ReplicaSets, node lifecycle and its taint-based eviction, disruption budgets) act on them
as on any node; only the kubelet's part is KWOK's.

A simulated node carries what a GPU node carries: `nvidia.com/gpu` capacity, the labels
GPU feature discovery writes (`nvidia.com/gpu.product`, `.memory`, `.count`, `.family`),
a zone and region, an instance type, and a podCIDR of its own for its pods' addresses.
It is tainted `SIMULATED_TAINT` (NoSchedule), so only pods that tolerate it land there
and nothing else a cluster runs does; a pod meant for simulated nodes also selects
`SIMULATED_LABEL`, which the real node lacks. Faults act on the objects as a failed
kubelet or a lost zone would leave them: a node whose Lease another holder takes is left
alone by KWOK (it acts only on the nodes whose Lease it holds) and goes NotReady, as the
fault tests do; `delete_nodes` takes nodes away.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubeinfer.cluster import control_plane, fleet_stages, netns, node_builds, processes

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
"""KWOK manages the nodes annotated `kwok.x-k8s.io/node=fake` (its own convention)."""
SIMULATED_LABEL = ("type", "kwok")
"""The label every simulated node carries: a node selector for pods meant for them."""
SIMULATED_TAINT = {"key": KWOK_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
SIMULATED_TOLERATION = {"key": KWOK_ANNOTATION, "operator": "Exists", "effect": "NoSchedule"}
"""What a pod needs to land on a simulated node."""
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION = "sim-region-1"
NODE_LEASE_SECONDS = 40
"""The Lease KWOK renews for each node (the kubelet's default): a node whose Lease lapses
is marked Unknown by the node lifecycle controller after its grace period."""
POD_NETWORK = "10.128.0.0/10"
"""Simulated pods' addresses, a /24 per node: apart from the real node's pods
(10.244.0.0/24) and Services (10.96.0.0/16); nothing routes to them."""
NODE_NETWORK = "10.64.0.0/16"
MAX_NODES = 16_000
"""As many nodes as POD_NETWORK has a /24 for (16384), rounded down."""
KWOK_LOG = "kwok"


@dataclass(frozen=True)
class GpuProduct:
    """One GPU model as GPU feature discovery labels it, and a node type that has it."""

    product: str
    """`nvidia.com/gpu.product`: the device name with spaces as dashes."""
    memory_mib: int
    family: str
    gpus_per_node: int
    instance_type: str
    cpu: int
    memory: str


PRODUCTS: dict[str, GpuProduct] = {
    "H100": GpuProduct("NVIDIA-H100-80GB-HBM3", 81559, "hopper", 8, "p5.48xlarge", 192, "2Ti"),
    "H200": GpuProduct("NVIDIA-H200", 143771, "hopper", 8, "p5e.48xlarge", 192, "2Ti"),
    "L4": GpuProduct("NVIDIA-L4", 23034, "ada-lovelace", 4, "g6.24xlarge", 96, "384Gi"),
    "A10G": GpuProduct("NVIDIA-A10G", 23028, "ampere", 4, "g5.12xlarge", 48, "192Gi"),
}
"""The GPU products a fleet may mix, by short name."""
ZONES = ("sim-zone-a", "sim-zone-b", "sim-zone-c")


@dataclass(frozen=True)
class SimulatedNode:
    """Where one simulated node sits in the fleet."""

    name: str
    product: str
    """A key of PRODUCTS."""
    zone: str
    index: int
    """Its place in the fleet: picks its addresses."""


def plan_fleet(
    count: int, products: Sequence[str] = tuple(PRODUCTS), zones: Sequence[str] = ZONES,
    prefix: str = "sim",
) -> list[SimulatedNode]:  # fmt: skip
    """`count` nodes, products and zones taken in turn (so every product is in every zone
    once there are enough nodes), named `<prefix>-<product>-<index>`."""
    unknown = [p for p in products if p not in PRODUCTS]
    if unknown or not products or not zones:
        raise ValueError(f"products must be some of {sorted(PRODUCTS)}, zones not empty")
    if count > MAX_NODES:
        raise ValueError(f"at most {MAX_NODES} simulated nodes (a /24 of pods each)")
    turns = itertools.product(zones, products)
    return [
        SimulatedNode(f"{prefix}-{product.lower()}-{index:05d}", product, zone, index)
        for index, (zone, product) in zip(range(count), itertools.cycle(turns), strict=False)
    ]


def plan_products(
    counts: Mapping[str, int], zones: Sequence[str] = ZONES, prefix: str = "sim"
) -> list[SimulatedNode]:
    """`counts[product]` nodes of each product (keys of PRODUCTS), each product's nodes
    spread over `zones` in turn, named `<prefix>-<product>-<index>` as `plan_fleet` names
    them."""
    unknown = [p for p in counts if p not in PRODUCTS]
    if unknown or not zones or any(count < 0 for count in counts.values()):
        raise ValueError(f"products must be some of {sorted(PRODUCTS)}, counts not negative, "
                         "zones not empty")  # fmt: skip
    if sum(counts.values()) > MAX_NODES:
        raise ValueError(f"at most {MAX_NODES} simulated nodes (a /24 of pods each)")
    turns = [(product, k) for product, count in counts.items() for k in range(count)]
    return [
        SimulatedNode(f"{prefix}-{product.lower()}-{index:05d}", product, zones[k % len(zones)],
                      index)
        for index, (product, k) in enumerate(turns)
    ]  # fmt: skip


def product_count(text: str) -> tuple[str, int]:
    """`PRODUCT=COUNT` as a user writes it (`H100=2`, `l4=1`): the key of PRODUCTS and the
    count; ValueError saying what is allowed otherwise."""
    name, _, count = text.partition("=")
    product = next((p for p in PRODUCTS if p.lower() == name.strip().lower()), None)
    if product is None or not count.strip().isdigit():
        raise ValueError(f"{text!r}: expected PRODUCT=COUNT, PRODUCT one of {', '.join(PRODUCTS)}")
    return product, int(count)


def node_manifest(node: SimulatedNode) -> dict[str, Any]:
    """The Node object of `node`, its status as the kubelet and the device plugin would
    first report it (KWOK then keeps it Ready)."""
    gpu = PRODUCTS[node.product]
    capacity = {
        "cpu": str(gpu.cpu), "memory": gpu.memory, "pods": "110",
        "ephemeral-storage": "1Ti", control_plane.GPU_RESOURCE: str(gpu.gpus_per_node),
    }  # fmt: skip
    high, low = divmod(node.index, 256)
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/role": "agent",
        "node.kubernetes.io/instance-type": gpu.instance_type,
        ZONE_LABEL: node.zone,
        "topology.kubernetes.io/region": REGION,
        SIMULATED_LABEL[0]: SIMULATED_LABEL[1],
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": gpu.product,
        "nvidia.com/gpu.memory": str(gpu.memory_mib),
        "nvidia.com/gpu.count": str(gpu.gpus_per_node),
        "nvidia.com/gpu.family": gpu.family,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": labels,
        },
        "spec": {"taints": [SIMULATED_TAINT], "podCIDR": _pod_cidr(node.index)},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": f"10.64.{high}.{low}"},
                {"type": "Hostname", "address": node.name},
            ],
        },
    }


def _pod_cidr(index: int) -> str:
    """The node's /24 inside POD_NETWORK (10.128.0.0/10: 16384 of them)."""
    return f"10.{128 + index // 256}.{index % 256}.0/24"


def kwok_argv(binary: Path, kubeconfig: Path, config: Path) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
        f"--cidr={POD_NETWORK}",
        "--node-ip=10.64.255.254",
        "--v=WARN",  # INFO is a line per pod per stage and per Lease renewed
    ]


LEASE_WORKERS = 16
"""KWOK's workers renewing node Leases (its default is 4: with hundreds of nodes on a busy
machine, renewals fell behind the node lifecycle controller's grace period and healthy
nodes went NotReady, their pods with them)."""


def write_config(directory: Path, start_seconds: float = 1.0, build_seconds: float = 2.0) -> Path:
    """KWOK's configuration (its options and Stages), as `directory/kwok.yaml`."""
    path = directory / "kwok.yaml"
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "nodeLeaseParallelism": LEASE_WORKERS,  # the rest: KWOK's defaults,
            "nodePlayStageParallelism": 4,
            "podPlayStageParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
        },
    }  # which a partial set would zero
    documents = [options, *fleet_stages.stages(start_seconds, build_seconds)]
    path.write_text(yaml.safe_dump_all(documents))
    return path


def start(
    cluster: control_plane.Cluster,
    nodes: Iterable[SimulatedNode] = (),
    *,
    start_seconds: float = 1.0,
    build_seconds: float = 2.0,
    timeout_seconds: float = 120.0,
) -> None:
    """Starts KWOK in `cluster` (recorded in its state file, so `down` stops it), creates
    the StorageClass whose claims it binds, and `add_nodes(nodes)`. ClusterError when KWOK
    exits or the nodes are not Ready in time (KWOK stopped again)."""
    directory = cluster.directory
    binary = node_builds.ensure_kwok()  # only fleets need it: make demo never builds it
    config = write_config(directory, start_seconds, build_seconds)
    argv = kwok_argv(binary, directory / "kubeconfigs" / "admin.kubeconfig", config)
    command = netns.NodeNetwork(cluster.namespace_path).command(argv)
    started, _ = processes.spawn(KWOK_LOG, command, directory / "logs" / f"{KWOK_LOG}.log")
    _record(directory, started)
    try:
        control_plane.kubectl(cluster, "apply", "--server-side", "-f", "-",
                              stdin=yaml.safe_dump(fleet_stages.storage_class()))  # fmt: skip
        add_nodes(cluster, nodes, timeout_seconds)
    except BaseException:
        stop(cluster)
        raise


def add_nodes(
    cluster: control_plane.Cluster, nodes: Iterable[SimulatedNode], timeout_seconds: float = 120.0
) -> list[str]:
    """Creates the nodes and waits until every one is Ready (KWOK initialises them);
    returns their names."""
    manifests = [node_manifest(node) for node in nodes]
    if not manifests:
        return []
    document = {"apiVersion": "v1", "kind": "List", "items": manifests}
    control_plane.kubectl(cluster, "create", "-f", "-", stdin=json.dumps(document),
                          timeout=max(60.0, len(manifests) / 5))  # fmt: skip
    wanted = {m["metadata"]["name"] for m in manifests}
    deadline = time.monotonic() + timeout_seconds
    while (missing := wanted - ready_nodes(cluster)) and time.monotonic() < deadline:
        _check_running(cluster.directory)
        time.sleep(0.5)
    if missing:
        raise control_plane.ClusterError(
            f"{len(missing)} simulated nodes not Ready after {timeout_seconds:.0f} s "
            f"(e.g. {sorted(missing)[0]}); see {cluster.directory / 'logs' / 'kwok.log'}"
        )
    return sorted(wanted)


def ready_nodes(cluster: control_plane.Cluster) -> set[str]:
    """The simulated nodes whose Ready condition is True."""
    status, body = cluster.get(f"/api/v1/nodes?labelSelector={'='.join(SIMULATED_LABEL)}")
    if status != 200:
        return set()
    return {
        node["metadata"]["name"]
        for node in json.loads(body)["items"]
        if any(c["type"] == "Ready" and c["status"] == "True"
               for c in (node.get("status") or {}).get("conditions") or [])
    }  # fmt: skip


def delete_nodes(cluster: control_plane.Cluster, names: Sequence[str]) -> None:
    """The nodes are gone (a zone lost, instances terminated): the Node objects are
    deleted, and the pod garbage collector removes the pods bound to them."""
    if names:
        control_plane.kubectl(cluster, "delete", "node", "--wait=false", *names)


def stop(cluster: control_plane.Cluster | Path, grace_seconds: float = 10.0) -> list[str]:
    """Stops KWOK (the nodes stay, as after a kubelet stops) and drops it from the state
    file; returns what needed SIGKILL."""
    directory = cluster if isinstance(cluster, Path) else cluster.directory
    state = directory / control_plane.STATE_FILE
    if not state.exists():
        return []
    started, extra = processes.read_state(state)
    mine = [p for p in started if p.name == KWOK_LOG]
    killed = processes.stop(mine, grace_seconds)
    processes.write_state(state, [p for p in started if p.name != KWOK_LOG], **extra)
    return killed


def _record(directory: Path, started: processes.Started) -> None:
    """Adds KWOK to the cluster's state file, after the processes already in it (so
    `down`, stopping them in reverse, stops it first)."""
    state = directory / control_plane.STATE_FILE
    if not state.exists():
        with contextlib.suppress(Exception):
            processes.stop([started])
        raise control_plane.ClusterError(f"no cluster runs from {directory}")
    running, extra = processes.read_state(state)
    processes.write_state(state, [*running, started], **extra)


def _check_running(directory: Path) -> None:
    started, _ = processes.read_state(directory / control_plane.STATE_FILE)
    for process in started:
        if process.name == KWOK_LOG and not processes.is_running(process):
            tail = Path(process.log).read_text(errors="replace")[-3000:]
            raise control_plane.ClusterError(f"kwok exited:\n{tail}")
