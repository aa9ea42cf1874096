"""A mixed GPU fleet on the real control plane: the real kopf operator, kube-apiserver,
kube-controller-manager (Job, ReplicaSet, EndpointSlice, node lifecycle controllers) and
kube-scheduler, with simulated GPU nodes of several products kept by KWOK
(`kubeinfer.cluster.fleet`: Node objects labelled as GPU feature discovery labels them,
with `nvidia.com/gpu` allocatable and a taint only the fleet's pods tolerate).

Nothing runs behind the simulated nodes; KWOK's stages play the kubelet: a build Job's
pod completes with the termination message `kubeinfer build --json` writes (a digest of
its container and node selector, so one per GPU product: TensorRT cannot run here, and
the engine is unverified on a GPU), a runtime pod starts and becomes Ready, a claim of
the simulated StorageClass is bound. The real scheduler places every pod, and what is
asserted is where: each build Job's pod on a node of its product, each runtime pod on a
node of the product its engine was built for, no pod at all on a product whose engine
does not exist yet, and the Service's endpoints only the ready pods of built products.
A node of a new product added later gets its own engine through the operator's node
watch (the resync is a minute here), and the others are left as they were.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from decide_scenarios import tuned
from kubeinfer.cluster import fleet
from kubeinfer.cluster.fleet_stages import STORAGE_CLASS
from kubeinfer.operator.state import names
from operator_harness import (
    FAST,
    IDS,
    Model,
    World,
    condition,
    eventually,
    manifest,
    start_operator,
)

pytestmark = [pytest.mark.slow, pytest.mark.lifecycle]

H100, L4, A10G = (fleet.PRODUCTS[p].product for p in ("H100", "L4", "A10G"))
SLOW_RESYNC = tuned(FAST, requeue={"resync_interval_seconds": 60})
"""A minute between resyncs: a new node is seen within seconds only through the watch."""


@pytest.fixture
def gpu_nodes(world: World) -> Iterator[list[str]]:
    """KWOK running in the session's cluster (for this test), and the names of the
    simulated nodes the test adds, deleted at its end."""
    cluster = world.cluster.cluster
    fleet.start(cluster, start_seconds=0.5, build_seconds=1.0)
    added: list[str] = []
    try:
        yield added
    finally:
        fleet.delete_nodes(cluster, added)
        fleet.stop(cluster)
        for pod in world.pods():  # bound to nodes no kubelet runs: nobody else ends them
            world.kube.delete("v1", "pods", pod["metadata"]["name"], gracePeriodSeconds=0)


def add_nodes(world: World, added: list[str], *products: str) -> list[str]:
    """One simulated node of each short product name (fleet.PRODUCTS), Ready."""
    prefix = world.namespace[-6:]
    plan = [
        fleet.SimulatedNode(f"{prefix}-{p.lower()}-{len(added) + i}", p, fleet.ZONES[0],
                            200 + len(added) + i)
        for i, p in enumerate(products)
    ]  # fmt: skip
    found = fleet.add_nodes(world.cluster.cluster, plan)
    added += found
    return found


def fleet_manifest(model: Model, replicas: int) -> dict[str, Any]:
    body = manifest(
        model,
        engine={"backend": "tensorrt", "precision": "fp16", "maxBatchSize": 8},
        runtime={
            "replicas": replicas,
            "resources": {"gpus": 1},
            "nodeSelector": dict([fleet.SIMULATED_LABEL]),
            "tolerations": [fleet.SIMULATED_TOLERATION],
        },
    )
    body["spec"]["engine"]["cache"] = {"storageClassName": STORAGE_CLASS}
    return body


def product_of_node(world: World, node: str | None) -> str | None:
    found = world.cluster.admin().get("v1", "nodes", node, namespace=None) if node else None
    return ((found or {}).get("metadata") or {}).get("labels", {}).get("nvidia.com/gpu.product")


def build_pods(world: World) -> list[dict[str, Any]]:
    return [p for p in world.pods(names.build_pods_selector("resnet")) if p["spec"].get("nodeName")]


def runtime_pods(world: World) -> list[dict[str, Any]]:
    pods = world.pods(names.selector_string(names.runtime_selector("resnet")))
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def status_of(world: World, type_: str) -> str | None:
    return (condition(world.infd(), type_) or {}).get("status")


def ready_endpoints(world: World) -> list[dict[str, Any]]:
    """The ready endpoints of the serving Service (every product's, as it selects)."""
    slices = world.kube.list(
        "discovery.k8s.io/v1", "endpointslices", "kubernetes.io/service-name=resnet"
    )
    return [e for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready")]


def engines(world: World) -> dict[str, dict[str, Any]]:
    status = (world.infd() or {}).get("status") or {}
    return {e["gpuProduct"]: e for e in status.get("engines") or []}


def product_configmaps(world: World) -> dict[str, str]:
    """The products' runtime ConfigMaps, each with its resourceVersion."""
    return {
        c["metadata"]["name"]: c["metadata"]["resourceVersion"]
        for c in world.children(("v1", "configmaps"))
        if names.LABEL_GPU_PRODUCT in c["metadata"].get("labels", {})
    }


def deployed_after_built(world: World) -> dict[str, bool]:
    """For each product's Deployment: was it created once its build Job had completed?"""
    completed = {
        job["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"]: (
            job["status"].get("completionTime") or "~"
        )
        for job in world.jobs()
    }
    return {
        d["metadata"]["labels"][names.LABEL_GPU_PRODUCT]: (
            d["metadata"]["creationTimestamp"]
            >= completed[d["metadata"]["labels"][names.LABEL_GPU_PRODUCT]]
        )
        for d in world.children(("apps/v1", "deployments"))
    }


async def test_a_mixed_fleet_builds_and_serves_one_engine_per_gpu_product(
    world: World, tiny: Model, gpu_nodes: list[str]
) -> None:
    add_nodes(world, gpu_nodes, "H100", "L4")
    async with start_operator(world, SLOW_RESYNC):
        world.create(fleet_manifest(tiny, replicas=4))
        builds = await eventually(
            lambda: len(found := build_pods(world)) == 2 and found, 60, "a build pod per product"
        )
        for pod in builds:
            product = pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"]
            assert product_of_node(world, pod["spec"]["nodeName"]) == product
        assert {p["spec"]["nodeSelector"]["nvidia.com/gpu.product"] for p in builds} == {H100, L4}
        await eventually(lambda: status_of(world, "Ready") == "True", 120, "Ready")

        status = world.infd()["status"]
        assert status["enginesReady"] == "2/2" and status["ready"] == "4/4"
        found = engines(world)
        assert {p: e["phase"] for p, e in found.items()} == {H100: "Built", L4: "Built"}
        assert found[H100]["digest"] != found[L4]["digest"], "an engine per product"
        assert (found[H100]["replicas"], found[L4]["replicas"]) == (3, 1), "8 GPUs against 4"
        assert (found[H100]["target"], found[L4]["target"]) == (H100, L4), "built where asked"
        for pod in runtime_pods(world):
            product = pod["metadata"]["labels"][names.LABEL_GPU_PRODUCT]
            assert product_of_node(world, pod["spec"]["nodeName"]) == product
            digest = pod["metadata"]["annotations"][names.ANNOTATION_ENGINE_DIGEST]
            assert digest == found[product]["digest"], "each pod runs its node's GPU's engine"
        endpoints = await eventually(
            lambda: len(ready := ready_endpoints(world)) == 4 and ready, 30, "4 endpoints"
        )
        assert {product_of_node(world, e["nodeName"]) for e in endpoints} == {H100, L4}
        assert deployed_after_built(world) == {H100: True, L4: True}

        # A node of a new product: its own engine, the others untouched.
        configmaps = product_configmaps(world)
        templates = {
            d["metadata"]["name"]: d["spec"]["template"]
            for d in world.children(("apps/v1", "deployments"))
        }
        jobs = {j["metadata"]["name"] for j in world.jobs()}
        add_nodes(world, gpu_nodes, "A10G")
        new = await eventually(
            lambda: [j for j in world.jobs() if j["metadata"]["name"] not in jobs],
            within=30, what="a build Job for the new product, through the node watch",
        )  # fmt: skip
        (job,) = new
        assert job["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == A10G
        await eventually(lambda: engines(world).get(A10G), 30, "the new product's status")

        def all_three() -> bool:
            status = world.infd()["status"]
            return status_of(world, "Ready") == "True" and status["enginesReady"] == "3/3"

        await eventually(all_three, 120, "Ready with three products")
        assert deployed_after_built(world) == {H100: True, L4: True, A10G: True}, (
            "nothing ran on the new product before its engine existed"
        )
        after = product_configmaps(world)
        assert {n: after[n] for n in configmaps} == configmaps, "the others' configs unchanged"
        for deployment in world.children(("apps/v1", "deployments")):
            name = deployment["metadata"]["name"]
            if name in templates:
                assert deployment["spec"]["template"] == templates[name], f"{name} rolled"
        assert {p: e["digest"] for p, e in engines(world).items() if p != A10G} == {
            H100: found[H100]["digest"],
            L4: found[L4]["digest"],
        }, "no other engine rebuilt"
        assert {j["metadata"]["name"] for j in world.jobs()} - jobs == {job["metadata"]["name"]}


async def test_weights_that_do_not_sum_to_100_are_refused_by_the_api_server(
    world: World, tiny: Model
) -> None:
    body = fleet_manifest(tiny, replicas=2)
    body["spec"]["runtime"]["gpuFleet"] = {
        "replicaSplit": "Weights",
        "products": [
            {"name": H100, "replicaWeightPercent": 60},
            {"name": L4, "replicaWeightPercent": 30},
        ],
    }
    refused = world.kube.kubectl("apply", "-f", "-", stdin=json.dumps(body), check=False)
    assert "summing to 100" in refused, refused
    body["spec"]["runtime"]["gpuFleet"]["products"][1]["replicaWeightPercent"] = 40
    world.kube.kubectl("apply", "-f", "-", stdin=json.dumps(body))
    assert world.kube.get(*IDS, "resnet") is not None
