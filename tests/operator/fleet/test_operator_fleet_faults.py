"""Faults on a fleet of simulated GPU nodes, on the real control plane: the real kopf
operator, kube-apiserver, kube-scheduler and kube-controller-manager (node lifecycle and
its taint-based eviction, disruption, ReplicaSet controllers), with KWOK playing the
kubelets (`kubeinfer.cluster.fleet`, as in `test_operator_fleet`).

- The default topology spread: the scheduler places the serving pods evenly over zones,
  and over the nodes within them. (Its own default constraints, as a preference, place
  them so too where nothing says otherwise: the operator's keep it so on a scheduler
  configured without them.) A rule in the spec (`DoNotSchedule`) holds over zones of
  uneven size, where the preferences alone put more pods in the larger zone.
- `kubectl drain` goes through the Eviction API, which honours the operator's
  PodDisruptionBudget: the ready serving pods, followed by a watch (every change, not
  samples), never drop below all but one.
- A node that stops reporting (`stop_reporting`) goes NotReady, the taint manager evicts
  its pods, and their replacements run elsewhere; a whole zone that stops reporting
  likewise.

Through a fault the status tells the truth, read from a watch on the object: the engines
stay built (EngineReady True, no build Job added), the object stays Available, nothing is
Degraded or Failed; Ready is False (reason PodsNotReady, not RollingOut: nothing rolls),
with the ready count the status reports, while fewer
pods than wanted are ready, and True again once the replacements are (decided: Ready
means the spec's engine serves on every wanted pod, docs/operating.md). The pods
tolerate the node-state taints for a few seconds, as a user who wants them moved sooner
than Kubernetes' default five minutes sets in `runtime.tolerations`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

import kubernetes
import pytest
from decide_scenarios import tuned
from kubeinfer.cluster import fleet
from kubeinfer.operator.state import names
from operator_harness import FAST, Model, World, condition, eventually, start_operator
from test_operator_fleet import engines, fleet_manifest, gpu_nodes  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.lifecycle]

ZONE_A, ZONE_B, ZONE_C = fleet.ZONES
EVICT_AFTER_SECONDS = 5
"""How long the pods stay on an unreachable or not-ready node (Kubernetes' default: 300)."""
NODE_STATE_TOLERATIONS = [
    {"key": f"node.kubernetes.io/{state}", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": EVICT_AFTER_SECONDS}
    for state in ("unreachable", "not-ready")
]  # fmt: skip
SETTINGS = tuned(FAST, requeue={"resync_interval_seconds": 5})
NOT_READY_WITHIN = 120.0
"""The node lifecycle controller's grace period (50 s) and its monitoring, on a busy host."""


def add_nodes(world: World, added: list[str], *placed: tuple[str, str]) -> list[str]:
    """One simulated node per (short product name, zone), Ready; their names in order."""
    prefix = world.namespace[-6:]
    plan = [
        fleet.SimulatedNode(f"{prefix}-{product.lower()}-{len(added) + i}", product, zone,
                            300 + len(added) + i)
        for i, (product, zone) in enumerate(placed)
    ]  # fmt: skip
    fleet.add_nodes(world.cluster.cluster, plan)
    added += [node.name for node in plan]
    return [node.name for node in plan]


SILENT_HOLDER = "a-silent-kubelet"


def stop_reporting(world: World, nodes: list[str]) -> None:
    """The nodes' kubelets go silent, as KWOK lets them: each node's Lease is taken by
    another holder for an hour with its renewTime left as it was, so KWOK renews it no
    more and leaves the node and its pods alone (it acts only on nodes whose Lease it
    holds), and the node lifecycle controller sees no renewal from then on. (Removing
    KWOK's annotation from the node does not: KWOK's informer drops that update, and
    KWOK v0.8.0 goes on renewing the Lease.)"""
    leases = world.cluster.admin("kube-node-lease")
    for node in nodes:
        taken = {"spec": {"holderIdentity": SILENT_HOLDER, "leaseDurationSeconds": 3600}}
        leases.patch("coordination.k8s.io/v1", "leases", node, taken)


def faults_manifest(model: Model, replicas: int) -> dict[str, Any]:
    body = fleet_manifest(model, replicas)
    body["spec"]["runtime"]["tolerations"] += NODE_STATE_TOLERATIONS
    return body


def serving_selector() -> str:
    return names.selector_string(names.serving_selector("resnet"))


def is_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    found = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in found)


def ready_pods(world: World) -> list[dict[str, Any]]:
    return [p for p in world.pods(serving_selector()) if is_ready(p)]


def zone_of(world: World) -> Callable[[str], str]:
    nodes = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(fleet.ZONE_LABEL, "")
        for n in world.cluster.admin().list("v1", "nodes", namespace=None)
    }
    return lambda node: nodes[node]


def node_ready(world: World, node: str) -> str | None:
    found = world.cluster.admin().get("v1", "nodes", node, namespace=None) or {}
    conditions = (found.get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), None)


def status_of(world: World) -> dict[str, Any]:
    return (world.infd() or {}).get("status") or {}


def serves_all(world: World, replicas: int) -> bool:
    status = status_of(world)
    ready = condition(world.infd(), "Ready") or {}
    return ready.get("status") == "True" and status.get("ready") == f"{replicas}/{replicas}"


def serving_on(
    world: World, replicas: int, off: Collection[str] = ()
) -> list[dict[str, Any]] | None:
    """The ready serving pods once there are `replicas` of them, none on the nodes `off`,
    and the status says so (None until then). Both are read: the status can still show
    the pods of before a drain, and a pod can be marked not Ready a moment while a
    simulated node's Lease renews late."""
    pods = ready_pods(world)
    placed = {p["spec"]["nodeName"] for p in pods}
    if len(pods) == replicas and not placed & set(off) and serves_all(world, replicas):
        return pods
    return None


class Watcher:
    """A watch on objects of one kind in the test's namespace, in a thread: `seen` gets
    every version of every object as the API server sends it, from a list onwards."""

    def __init__(self, world: World, list_call: str, label_selector: str | None = None):
        api = kubernetes.client.CoreV1Api(world.cluster.api_client)
        custom = kubernetes.client.CustomObjectsApi(world.cluster.api_client)
        namespace = world.namespace
        if list_call == "pods":
            self._list = lambda **kw: api.list_namespaced_pod(
                namespace, label_selector=label_selector, **kw
            )
        else:
            self._list = lambda **kw: custom.list_namespaced_custom_object(
                "kubeinfer.io", "v1alpha1", namespace, "inferencedeployments", **kw
            )
        self.current: dict[str, dict[str, Any]] = {}
        self.states: list[dict[str, dict[str, Any]]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watcher:
        body = json.loads(self._list(_preload_content=False).data)
        for item in body.get("items") or []:
            self.current[item["metadata"]["name"]] = item
        self.states.append(dict(self.current))
        self._version = body["metadata"]["resourceVersion"]
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        assert self.error is None, f"the watch failed: {self.error!r}"

    def _run(self) -> None:
        try:
            self._follow()
        except BaseException as error:  # the test asserts on it in __exit__
            self.error = error

    def _follow(self) -> None:
        while not self._stop.is_set():
            stream = kubernetes.watch.Watch().stream(
                self._list, resource_version=self._version, timeout_seconds=2,
                allow_watch_bookmarks=True,
            )  # fmt: skip
            for event in stream:
                obj = event["raw_object"]
                self._version = obj["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                if event["type"] == "DELETED":
                    self.current.pop(name, None)
                else:
                    self.current[name] = obj
                self.states.append(dict(self.current))


def min_ready(states: list[dict[str, dict[str, Any]]]) -> int:
    return min(sum(1 for pod in state.values() if is_ready(pod)) for state in states)


def statuses(watcher: Watcher) -> list[dict[str, Any]]:
    return [s["resnet"]["status"] for s in watcher.states if "status" in s.get("resnet", {})]


def conditions_of(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status.get("conditions") or []}


def assert_status_told_the_truth(seen: list[dict[str, Any]], replicas: int) -> None:
    """Every status written through the fault: engines built, still available, nothing
    degraded or failed; Ready True only with every wanted pod ready; and the loss seen."""
    assert seen
    for status in seen:
        found = conditions_of(status)
        assert found["EngineReady"] == "True", status
        assert found["Available"] == "True", status
        assert found.get("Degraded") != "True" and status["phase"] != "Failed", status
        if found["Ready"] == "True":
            assert status["ready"] == f"{replicas}/{replicas}", status
    lows = [s for s in seen if conditions_of(s)["Ready"] == "False"]
    assert lows and min(s["readyReplicas"] for s in lows) < replicas, "no pods said missing"
    reasons = {c["reason"] for s in lows for c in s["conditions"] if c["type"] == "Ready"}
    assert "PodsNotReady" in reasons, f"the loss is not named a rollout: {reasons}"


async def serving(world: World, model: Model, replicas: int) -> None:
    """Creates the object and waits until it serves on every pod."""
    world.create(faults_manifest(model, replicas))
    await eventually(lambda: serving_on(world, replicas), 120, f"Ready with {replicas} pods")


async def test_the_pods_spread_over_zones_and_nodes_and_a_drain_keeps_all_but_one_serving(
    world: World,
    tiny: Model,
    gpu_nodes: list[str],  # noqa: F811 (the fixture)
) -> None:
    added = gpu_nodes
    add_nodes(world, added, ("H100", ZONE_A), ("H100", ZONE_A), ("H100", ZONE_B),
              ("H100", ZONE_C))  # fmt: skip
    async with start_operator(world, SETTINGS):
        await serving(world, tiny, 6)
        zone = zone_of(world)
        pods = await eventually(lambda: serving_on(world, 6), 60, "6 pods serving")
        by_zone = Counter(zone(p["spec"]["nodeName"]) for p in pods)
        by_node = Counter(p["spec"]["nodeName"] for p in pods)
        assert by_zone == {ZONE_A: 2, ZONE_B: 2, ZONE_C: 2}, by_zone
        assert sorted(by_node.values()) == [1, 1, 2, 2], by_node

        def budget() -> dict[str, Any] | None:
            """The operator's budget, once the disruption controller has counted its pods."""
            name = names.runtime_name("resnet")
            found = world.kube.get("policy/v1", "poddisruptionbudgets", name) or {}
            status = found.get("status") or {}
            return found if status.get("expectedPods") == 6 else None

        await eventually(budget, 30, "the disruption budget counted by its controller")
        drained = next(node for node, count in by_node.items() if count == 2)
        with Watcher(world, "pods", serving_selector()) as pods_seen:
            await asyncio.to_thread(
                world.cluster.kubectl,
                "drain", drained, "--ignore-daemonsets", "--delete-emptydir-data",
                "--timeout=90s", timeout=120,
            )  # fmt: skip
            await eventually(
                lambda: serving_on(world, 6, {drained}), 60, "6 pods serving off the node"
            )
        assert min_ready(pods_seen.states) == 5, "a drain took more than one serving pod"
        assert (budget() or {}).get("spec", {}).get("maxUnavailable") == 1
        assert len(pods_seen.states) > 4, "the watch saw the drain"


async def test_a_node_that_stops_reporting_has_its_pods_replaced_elsewhere(
    world: World,
    tiny: Model,
    gpu_nodes: list[str],  # noqa: F811 (the fixture)
) -> None:
    added = gpu_nodes
    add_nodes(world, added, ("H100", ZONE_A), ("H100", ZONE_B), ("H100", ZONE_C))
    async with start_operator(world, SETTINGS):
        await serving(world, tiny, 3)
        jobs, built = len(world.jobs()), engines(world)
        (pod, *_) = ready_pods(world)
        lost = pod["spec"]["nodeName"]
        with Watcher(world, "inferencedeployments") as seen:
            stop_reporting(world, [lost])
            await eventually(lambda: node_ready(world, lost) == "Unknown", NOT_READY_WITHIN,
                             "the node lifecycle controller to mark the node")  # fmt: skip
            await eventually(
                lambda: world.kube.get("v1", "pods", pod["metadata"]["name"]) is None
                or world.kube.get("v1", "pods", pod["metadata"]["name"])["metadata"].get(
                    "deletionTimestamp"
                ),
                30, "the taint manager to evict the node's pod",
            )  # fmt: skip
            await eventually(
                lambda: serving_on(world, 3, {lost}), 60, "3 pods serving off the lost node"
            )
        assert len(world.jobs()) == jobs, "an engine was rebuilt"
        assert {p: e["digest"] for p, e in engines(world).items()} == {
            p: e["digest"] for p, e in built.items()
        }
        assert_status_told_the_truth(statuses(seen), 3)


async def test_a_lost_zone_keeps_the_engines_and_serving_comes_back_in_the_others(
    world: World,
    tiny: Model,
    gpu_nodes: list[str],  # noqa: F811 (the fixture)
) -> None:
    added = gpu_nodes
    nodes = add_nodes(world, added, *((p, z) for z in fleet.ZONES for p in ("H100", "L4")))
    async with start_operator(world, SETTINGS):
        await serving(world, tiny, 6)
        jobs, built = len(world.jobs()), engines(world)
        assert len(built) == 2 and jobs == 2
        zone = zone_of(world)
        gone = [n for n in nodes if zone(n) == ZONE_A]
        on_gone = [p for p in ready_pods(world) if p["spec"]["nodeName"] in gone]
        assert on_gone, "the spread put pods in every zone"
        with Watcher(world, "inferencedeployments") as seen:
            stop_reporting(world, gone)
            await eventually(
                lambda: all(node_ready(world, n) == "Unknown" for n in gone),
                NOT_READY_WITHIN, "the zone's nodes marked Unknown",
            )  # fmt: skip
            await eventually(
                lambda: serving_on(world, 6, gone), 90, "6 pods serving outside the lost zone"
            )
        assert len(world.jobs()) == jobs, "an engine was rebuilt"
        assert {p: e["digest"] for p, e in engines(world).items()} == {
            p: e["digest"] for p, e in built.items()
        }
        assert {zone(p["spec"]["nodeName"]) for p in ready_pods(world)} == {ZONE_B, ZONE_C}
        assert_status_told_the_truth(statuses(seen), 6)


async def test_a_zone_spread_rule_in_the_spec_holds_over_uneven_zones(
    world: World,
    tiny: Model,
    gpu_nodes: list[str],  # noqa: F811 (the fixture)
) -> None:
    """Three nodes in one zone, one in each other: the scheduler's own preferences put
    about a pod per node (more in the zone with more nodes); the spec's rule
    (DoNotSchedule) holds the zones within one pod of each other."""
    add_nodes(world, gpu_nodes, ("H100", ZONE_A), ("H100", ZONE_A), ("H100", ZONE_A),
              ("H100", ZONE_B), ("H100", ZONE_C))  # fmt: skip
    body = faults_manifest(tiny, 6)
    body["spec"]["runtime"]["topologySpread"] = {
        "topologyKeys": [fleet.ZONE_LABEL],
        "maxSkew": 1,
        "whenUnsatisfiable": "DoNotSchedule",
    }
    async with start_operator(world, SETTINGS):
        world.create(body)
        pods = await eventually(lambda: serving_on(world, 6), 120, "Ready with 6 pods")
        zone = zone_of(world)
        by_zone = Counter(zone(p["spec"]["nodeName"]) for p in pods)
        assert by_zone == {ZONE_A: 2, ZONE_B: 2, ZONE_C: 2}, by_zone
