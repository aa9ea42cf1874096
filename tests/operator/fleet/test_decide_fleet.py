"""A mixed GPU fleet, as the pure decision sees it: which GPU products an object may run
on (node labels, selector, taints, the listed products), the replica split's rule, and
whole passes over the in-memory cluster of `decide_scenarios` with GPU nodes of several
products: one engine and build Job per product on a node of that product, pods only where
their engine was built, status per product, a new product's engine built without
touching the others, a product whose nodes went has its pods removed, a single engine's
Deployment kept until the products serve."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import yaml
from decide_scenarios import DIGEST_A, T0, Cluster, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.api.v1alpha1.enums import Phase
from kubeinfer.operator.api.v1alpha1.gpu_fleet import GpuFleetSpec
from kubeinfer.operator.reconcile.desired import CONFIG_KEY
from kubeinfer.operator.reconcile.replica_split import (
    hold_while_moving,
    largest_remainder,
    product_weights,
)
from kubeinfer.operator.state import names
from kubeinfer.operator.state.gpu_nodes import ProductCapacity, eligible_products, gpu_node
from kubeinfer.operator.state.observed import KubeObject, ObservedState
from kubeinfer.operator.state.scaling_inputs import ScalingSignals, ServingPods

H100, L4, A10G = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L4", "NVIDIA-A10G"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATES_GPUS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
TRUE = ConditionStatus.TRUE


def node(
    name: str,
    product: str | None,
    gpus: int = 8,
    *,
    ready: bool = True,
    taints: tuple[dict[str, str], ...] = (GPU_TAINT,),
    labels: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> KubeObject:
    """A Node object as the API server returns it, labelled as GPU feature discovery does."""
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if product is not None:
        all_labels["nvidia.com/gpu.product"] = product
    return {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"taints": list(taints), **({"unschedulable": True} if unschedulable else {})},
        "status": {
            "allocatable": {"cpu": "32", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def fleet_spec(**runtime: Any) -> Any:
    sections: dict[str, Any] = {
        "engine": {"backend": "tensorrt", "precision": "fp16"},
        "runtime": {"resources": {"gpus": 1}, "tolerations": TOLERATES_GPUS, **runtime},
    }
    return make_spec(**sections)


class FleetCluster(Cluster):
    """`decide_scenarios.Cluster` with GPU nodes, and the fleet's product children read
    back as the gather step reads them (by their product label)."""

    def __init__(self, spec: Any, nodes: list[KubeObject]) -> None:
        super().__init__(spec)
        self.nodes = nodes

    def observe(self) -> ObservedState:
        observed = super().observe()

        def labelled(kind: str) -> tuple[KubeObject, ...]:
            return tuple(
                copy.deepcopy(o)
                for (k, _), o in sorted(self.objects.items())
                if k == kind and names.LABEL_GPU_PRODUCT in o["metadata"]["labels"]
            )

        found = tuple(n for n in (gpu_node(each) for each in self.nodes) if n is not None)
        return replace(
            observed,
            product_configmaps=labelled("ConfigMap"),
            product_deployments=labelled("Deployment"),
            gpu_nodes=found,
        )

    def unbuilt(self) -> dict[str, KubeObject]:
        """The Jobs still running, by the GPU product their node selector names."""
        return {
            job["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"]: job
            for job in self.jobs()
            if "status" not in job
        }

    def build(self, product: str, digest: str, at: Any = T0) -> None:
        job = self.unbuilt()[product]
        message = json.dumps({"digest": digest, "target": f"trt-{product}"})
        self.succeed_job(job["metadata"]["name"], message, at=at)

    def runtime(self, product: str) -> KubeObject:
        return self.get("Deployment", names.product_runtime_name(self.name, product))

    def has_runtime(self, product: str) -> bool:
        return self.has("Deployment", names.product_runtime_name(self.name, product))

    def replicas(self) -> dict[str, int]:
        return {
            o["metadata"]["labels"][names.LABEL_GPU_PRODUCT]: o["spec"]["replicas"]
            for (k, _), o in self.objects.items()
            if k == "Deployment" and names.LABEL_GPU_PRODUCT in o["metadata"]["labels"]
        }

    def engines(self) -> dict[str, tuple[str, str | None]]:
        return {e.gpu_product: (str(e.phase), e.digest) for e in self.status.engines}


DIGEST_H100 = "sha256:" + "1" * 64
DIGEST_L4 = "sha256:" + "4" * 64
DIGEST_A10G = "sha256:" + "0" * 64


def two_products(**runtime: Any) -> FleetCluster:
    """Two H100 nodes of 8 GPUs and two L4 nodes of 4 (so GPUs split 2:1)."""
    nodes = [node("h1", H100), node("h2", H100), node("l1", L4, 4), node("l2", L4, 4)]
    return FleetCluster(fleet_spec(**runtime), nodes)


def served(cluster: FleetCluster) -> FleetCluster:
    """Both engines built and every Deployment rolled out."""
    cluster.reconcile()
    cluster.build(H100, DIGEST_H100)
    cluster.build(L4, DIGEST_L4)
    cluster.reconcile(T0 + timedelta(seconds=60))
    for product in (H100, L4):
        cluster.roll_out(name=names.product_runtime_name(cluster.name, product))
    cluster.reconcile(T0 + timedelta(seconds=90))
    return cluster


# --- which products an object may run on ------------------------------------------------


@pytest.mark.parametrize(
    ("sentence", "nodes", "runtime", "expected"),
    [
        (
            "every labelled product with GPUs, in name order",
            [node("h", H100), node("l", L4, 4), node("cpu", None)],
            {},
            [ProductCapacity(H100, 1, 8), ProductCapacity(L4, 1, 4)],
        ),
        (
            "a node with no allocatable GPU counts for nothing",
            [node("h", H100, 0), node("l", L4, 4)],
            {},
            [ProductCapacity(L4, 1, 4)],
        ),
        (
            "a listed product only",
            [node("h", H100), node("l", L4, 4)],
            {"gpuFleet": {"products": [{"name": L4}, {"name": A10G}]}},
            [ProductCapacity(L4, 1, 4)],
        ),
        (
            "nodes the node selector leaves out are not eligible",
            [node("h", H100, labels={"pool": "a"}), node("l", L4, 4, labels={"pool": "b"})],
            {"nodeSelector": {"pool": "b"}},
            [ProductCapacity(L4, 1, 4)],
        ),
        (
            "a taint not tolerated leaves its node out",
            [node("h", H100, taints=(GPU_TAINT, {"key": "team", "effect": "NoExecute"}))],
            {},
            [],
        ),
        (
            "a PreferNoSchedule taint does not",
            [node("h", H100, taints=({"key": "team", "effect": "PreferNoSchedule"},))],
            {},
            [ProductCapacity(H100, 1, 8)],
        ),
        (
            "a not ready, cordoned or unreachable node keeps its product, without its GPUs",
            [
                node("h1", H100, ready=False),
                node("h2", H100, unschedulable=True),
                node(
                    "h3",
                    H100,
                    taints=(
                        GPU_TAINT,
                        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                    ),
                ),
                node("h4", H100, 2),
            ],
            {},
            [ProductCapacity(H100, 4, 2)],
        ),
        (
            "a node tainted for suspect answers keeps its product, without its GPUs",
            [
                node(
                    "h1",
                    H100,
                    taints=(
                        GPU_TAINT,
                        {"key": "kubeinfer.io/suspect-answers", "effect": "NoSchedule"},
                    ),
                ),
                node(
                    "a1",
                    L4,
                    4,
                    taints=(
                        GPU_TAINT,
                        {"key": "kubeinfer.io/suspect-answers", "effect": "NoSchedule"},
                    ),
                ),
                node("h2", H100, 2),
            ],
            {},
            [ProductCapacity(H100, 2, 2), ProductCapacity(L4, 1, 0)],
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_eligible_products(sentence, nodes, runtime, expected):
    spec = fleet_spec(**runtime)
    found = [n for n in (gpu_node(each) for each in nodes) if n is not None]
    assert list(eligible_products(found, spec)) == expected, sentence


def test_without_tolerations_a_tainted_gpu_node_is_not_eligible():
    spec = make_spec(engine={"backend": "tensorrt"}, runtime={"resources": {"gpus": 1}})
    (found,) = [gpu_node(node("h", H100))]
    assert eligible_products([found], spec) == ()


# --- the split ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "weights", "expected"),
    [
        (3, {"a": 16, "b": 8}, {"a": 2, "b": 1}),
        (4, {"a": 75, "b": 25}, {"a": 3, "b": 1}),
        (1, {"a": 1, "b": 1}, {"a": 1, "b": 0}),  # a tie goes to the first name
        (5, {"a": 1, "b": 1, "c": 1}, {"a": 2, "b": 2, "c": 1}),
        (2, {"a": 0, "b": 0}, {"a": 1, "b": 1}),  # no GPU usable: equal shares
        (4, {"a": 0, "b": 3}, {"a": 0, "b": 4}),
        (0, {"a": 5, "b": 5}, {"a": 0, "b": 0}),
        (7, {}, {}),
    ],
)
def test_largest_remainder_adds_up_to_the_total(total, weights, expected):
    shares = largest_remainder(total, weights)
    assert shares == expected
    assert sum(shares.values()) == (total if weights else 0)


def test_weights_are_gpus_or_the_specs_percentages_of_the_serving_products():
    capacities = [ProductCapacity(H100, 2, 16), ProductCapacity(L4, 2, 8)]
    assert product_weights(None, capacities, [H100, L4]) == {H100: 16.0, L4: 8.0}
    assert product_weights(None, capacities, [L4]) == {L4: 8.0}
    fleet = GpuFleetSpec.model_validate(
        {
            "replicaSplit": "Weights",
            "products": [
                {"name": H100, "replicaWeightPercent": 25},
                {"name": L4, "replicaWeightPercent": 75},
            ],
        }
    )
    assert product_weights(fleet, capacities, [H100, L4]) == {H100: 25.0, L4: 75.0}


@pytest.mark.parametrize(
    ("sentence", "shares", "current", "expected"),
    [
        ("steady: the shares", {"a": 2, "b": 1}, {"a": (2, 2), "b": (1, 1)}, {"a": 2, "b": 1}),
        (
            "b's pod is not ready yet: a keeps what it had",
            {"a": 2, "b": 2},
            {"a": (4, 4), "b": (2, 0)},
            {"a": 4, "b": 2},
        ),
        (
            "b has one of two ready: a keeps one more than its share",
            {"a": 2, "b": 2},
            {"a": (4, 4), "b": (2, 1)},
            {"a": 3, "b": 2},
        ),
        ("a new product with no Deployment yet", {"a": 1, "b": 1}, {"a": (2, 2)}, {"a": 2, "b": 1}),
        ("growing needs no hold", {"a": 3, "b": 1}, {"a": (2, 2), "b": (1, 1)}, {"a": 3, "b": 1}),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_shrinking_product_keeps_its_pods_while_others_lack_ready_ones(
    sentence, shares, current, expected
):
    assert hold_while_moving(shares, current) == expected, sentence


# --- passes ---------------------------------------------------------------------------


def test_each_product_gets_its_own_build_job_on_a_node_of_that_product_and_no_runtime_yet():
    cluster = two_products(replicas=3)
    decision = cluster.reconcile()
    jobs = cluster.unbuilt()
    assert set(jobs) == {H100, L4}
    keys = {j["metadata"]["labels"][names.LABEL_BUILD_KEY] for j in jobs.values()}
    assert len(keys) == 2, "the engine inputs differ by GPU product"
    for product, job in jobs.items():
        pod = job["spec"]["template"]["spec"]
        assert pod["tolerations"] == TOLERATES_GPUS
        (container,) = pod["containers"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": product}
    kinds = {child["kind"] for child in decision.desired}
    assert kinds == {"PersistentVolumeClaim", "Job"}, "nothing serves before an engine exists"
    assert cluster.engines() == {H100: ("Building", None), L4: ("Building", None)}
    assert cluster.status.engines_ready == "0/2"
    building = {e.message.split(":")[0] for e in decision.events if e.reason == "EngineBuilding"}
    assert {H100, L4} <= building, "an Event per product"
    assert cluster.condition(ConditionType.READY).status == ConditionStatus.FALSE
    assert cluster.status.phase == Phase.BUILDING_ENGINE


def test_a_product_with_no_engine_yet_runs_no_pods_and_its_share_goes_to_the_others():
    cluster = two_products(replicas=3)
    cluster.reconcile()
    cluster.build(H100, DIGEST_H100)
    decision = cluster.reconcile(T0 + timedelta(seconds=60))
    assert not cluster.has_runtime(L4), "no Deployment, so no pod of L4 behind the Service"
    assert cluster.replicas() == {H100: 3}
    deployment = cluster.runtime(H100)
    template = deployment["spec"]["template"]
    assert template["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": H100}
    assert template["metadata"]["labels"][names.LABEL_GPU_PRODUCT] == H100
    assert template["metadata"]["annotations"][names.ANNOTATION_ENGINE_DIGEST] == DIGEST_H100
    assert deployment["spec"]["selector"]["matchLabels"] == names.product_selector(
        cluster.name, H100
    )
    service = cluster.get("Service", names.service_name(cluster.name))
    selector = service["spec"]["selector"]
    assert selector == names.serving_selector(cluster.name), "every product's serving pods"
    assert set(selector.items()) <= set(template["metadata"]["labels"].items())
    config = yaml.safe_load(
        cluster.get("ConfigMap", names.product_runtime_name(cluster.name, H100))["data"][CONFIG_KEY]
    )
    assert config["engine"]["digest"] == DIGEST_H100
    assert cluster.engines() == {H100: ("Built", DIGEST_H100), L4: ("Building", None)}
    assert cluster.condition(ConditionType.AVAILABLE).status == ConditionStatus.FALSE
    built = {e.message.split(":")[0] for e in decision.events if e.reason == Reason.ENGINE_BUILT}
    assert H100 in built and L4 not in built, "an Event names the product"
    cluster.roll_out(name=names.product_runtime_name(cluster.name, H100))
    cluster.reconcile(T0 + timedelta(seconds=70))
    assert cluster.condition(ConditionType.AVAILABLE).status == TRUE
    assert cluster.condition(ConditionType.READY).status == ConditionStatus.FALSE
    assert cluster.condition(ConditionType.ENGINE_READY).reason == Reason.ENGINE_BUILDING


def test_once_every_engine_serves_the_pods_are_split_by_gpus_and_the_object_is_ready():
    cluster = two_products(replicas=3)
    cluster.reconcile()
    cluster.build(H100, DIGEST_H100)
    cluster.reconcile(T0 + timedelta(seconds=30))
    cluster.roll_out(name=names.product_runtime_name(cluster.name, H100))
    cluster.build(L4, DIGEST_L4)
    cluster.reconcile(T0 + timedelta(seconds=60))
    assert cluster.replicas() == {H100: 3, L4: 1}, "H100 keeps its pods until L4's is ready"
    assert cluster.status.replicas == 3, "the pods wanted, not those held while they move"
    cluster.roll_out(name=names.product_runtime_name(cluster.name, L4))
    cluster.reconcile(T0 + timedelta(seconds=70))
    assert cluster.replicas() == {H100: 2, L4: 1}, "16 GPUs against 8"
    cluster.roll_out(name=names.product_runtime_name(cluster.name, H100))
    cluster.reconcile(T0 + timedelta(seconds=80))
    assert cluster.condition(ConditionType.READY).status == TRUE
    assert cluster.status.phase == Phase.READY
    assert cluster.status.ready == "3/3" and cluster.status.engines_ready == "2/2"
    assert cluster.engines() == {H100: ("Built", DIGEST_H100), L4: ("Built", DIGEST_L4)}
    records = {e.gpu_product: e for e in cluster.status.engines}
    assert (records[H100].nodes, records[H100].gpus, records[H100].replicas) == (2, 16, 2)
    assert (records[L4].target, records[L4].ready_replicas) == (f"trt-{L4}", 1)
    assert cluster.status.engine is None and cluster.status.serving.version == "1"


def test_an_unchanged_fleet_writes_nothing():
    cluster = served(two_products(replicas=3))
    cluster.roll_out(name=names.product_runtime_name(cluster.name, H100))
    cluster.reconcile(T0 + timedelta(seconds=100))
    before = cluster.writes
    decision = cluster.reconcile(T0 + timedelta(seconds=200))
    assert (decision.apply, decision.delete, cluster.writes) == ((), (), before)


def test_replica_weights_split_the_pods_as_the_spec_says():
    fleet = {
        "replicaSplit": "Weights",
        "products": [
            {"name": H100, "replicaWeightPercent": 25},
            {"name": L4, "replicaWeightPercent": 75},
        ],
    }
    cluster = served(two_products(replicas=4, gpuFleet=fleet))
    for product in (H100, L4):
        cluster.roll_out(name=names.product_runtime_name(cluster.name, product))
    cluster.reconcile(T0 + timedelta(seconds=120))
    assert cluster.replicas() == {H100: 1, L4: 3}


def test_a_new_product_gets_an_engine_and_the_others_are_not_touched():
    cluster = served(two_products(replicas=3))
    for product in (H100, L4):
        cluster.roll_out(name=names.product_runtime_name(cluster.name, product))
    cluster.reconcile(T0 + timedelta(seconds=100))
    before = {
        p: copy.deepcopy(cluster.get(kind, names.product_runtime_name(cluster.name, p)))
        for p in (H100, L4)
        for kind in ("ConfigMap",)
    }
    templates = {p: copy.deepcopy(cluster.runtime(p)["spec"]["template"]) for p in (H100, L4)}
    jobs = len(cluster.jobs())
    cluster.nodes.append(node("a1", A10G, 4))
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert list(cluster.unbuilt()) == [A10G] and len(cluster.jobs()) == jobs + 1
    for product in (H100, L4):
        configmap = cluster.get("ConfigMap", names.product_runtime_name(cluster.name, product))
        assert configmap == before[product]
        assert cluster.runtime(product)["spec"]["template"] == templates[product], "no roll"
    assert cluster.engines()[A10G] == ("Building", None)
    cluster.build(A10G, DIGEST_A10G, at=T0 + timedelta(minutes=6))
    cluster.reconcile(T0 + timedelta(minutes=7))
    assert cluster.runtime(A10G)["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": A10G
    }
    assert cluster.engines()[H100] == ("Built", DIGEST_H100), "no rebuild"


def test_a_product_whose_nodes_are_gone_has_its_runtime_removed():
    cluster = served(two_products(replicas=3))
    cluster.nodes[:] = [n for n in cluster.nodes if n["metadata"]["name"].startswith("h")]
    decision = cluster.reconcile(T0 + timedelta(minutes=5))
    gone = names.product_runtime_name(cluster.name, L4)
    assert ("Deployment", gone) in decision.delete and ("ConfigMap", gone) in decision.delete
    assert list(cluster.engines()) == [H100]
    assert cluster.replicas() == {H100: 3}


def test_a_product_with_no_usable_gpu_keeps_its_engine_and_hands_over_its_pods():
    cluster = served(two_products(replicas=3))
    for each in cluster.nodes:
        if each["metadata"]["name"].startswith("l"):
            each["spec"]["unschedulable"] = True  # drained
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert cluster.engines()[L4] == ("Built", DIGEST_L4)
    assert cluster.replicas()[H100] == 3 and cluster.unbuilt() == {}


def test_without_an_eligible_gpu_node_nothing_is_built_and_the_status_says_why():
    cluster = FleetCluster(fleet_spec(replicas=2), [node("cpu", None)])
    decision = cluster.reconcile()
    assert cluster.jobs() == [] and {c["kind"] for c in decision.desired} == {
        "PersistentVolumeClaim"
    }
    ready = cluster.condition(ConditionType.READY)
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, Reason.NO_GPU_NODES)
    assert "nvidia.com/gpu.product" in ready.message
    assert cluster.condition(ConditionType.STALLED).status == TRUE
    assert cluster.status.phase == Phase.PENDING and cluster.status.engines_ready == "0/0"


def test_a_failed_build_on_one_product_leaves_the_other_serving():
    cluster = two_products(replicas=2)
    cluster.reconcile()
    cluster.build(H100, DIGEST_H100)
    job = cluster.unbuilt()[L4]
    failed_at = T0 + timedelta(seconds=50)
    cluster.fail_job(job["metadata"]["name"], "BackoffLimitExceeded", "failed", "OOM", failed_at)
    cluster.reconcile(T0 + timedelta(seconds=60))
    assert cluster.replicas() == {H100: 2}
    degraded = cluster.condition(ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (TRUE, Reason.ENGINE_BUILD_FAILED)
    assert L4 in degraded.message
    assert cluster.engines()[L4][0] == "Failed"
    assert cluster.status.phase == Phase.DEGRADED


def test_a_new_engine_builds_per_product_while_each_keeps_its_old_one():
    cluster = served(two_products(replicas=3))
    changed = fleet_spec(replicas=3).model_dump(by_alias=True, exclude_none=True)
    changed["model"]["version"], changed["engine"]["maxBatchSize"] = "2", 64
    cluster.update_spec(type(cluster.spec).model_validate(changed))
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert set(cluster.unbuilt()) == {H100, L4}
    for product, digest in ((H100, DIGEST_H100), (L4, DIGEST_L4)):
        template = cluster.runtime(product)["spec"]["template"]
        assert template["metadata"]["annotations"][names.ANNOTATION_ENGINE_DIGEST] == digest
    cluster.build(L4, "sha256:" + "5" * 64, at=T0 + timedelta(minutes=6))
    cluster.reconcile(T0 + timedelta(minutes=7))
    l4 = cluster.runtime(L4)["spec"]["template"]["metadata"]
    assert l4["annotations"][names.ANNOTATION_ENGINE_DIGEST] == "sha256:" + "5" * 64
    h100 = cluster.runtime(H100)["spec"]["template"]["metadata"]
    assert h100["annotations"][names.ANNOTATION_ENGINE_DIGEST] == DIGEST_H100
    assert "Version 1 keeps serving" in cluster.condition(ConditionType.READY).message


def test_a_single_engine_deployment_moves_to_the_fleet_keeping_its_engine_and_pods():
    single = make_spec(
        engine={"backend": "tensorrt", "precision": "fp16"},
        runtime={
            "replicas": 2,
            "resources": {"gpus": 1},
            "tolerations": TOLERATES_GPUS,
            "gpuProduct": H100,
        },
    )
    cluster = FleetCluster(single, [node("h1", H100), node("l1", L4, 8)])
    cluster.build_to_ready(DIGEST_A)
    old = names.runtime_name(cluster.name)
    cluster.update_spec(fleet_spec(replicas=2))
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert list(cluster.unbuilt()) == [L4], "H100's engine is the single engine: kept"
    assert cluster.engines()[H100] == ("Built", DIGEST_A)
    assert cluster.has("Deployment", old), "the single Deployment serves until the fleet does"
    cluster.roll_out(name=names.product_runtime_name(cluster.name, H100))
    decision = cluster.reconcile(T0 + timedelta(minutes=6))
    assert ("Deployment", old) in decision.delete and ("ConfigMap", old) in decision.delete


def test_a_fleet_back_to_one_product_removes_the_products_once_the_single_one_serves():
    cluster = served(two_products(replicas=2))
    cluster.update_spec(
        make_spec(
            engine={"backend": "tensorrt", "precision": "fp16"},
            runtime={"replicas": 2, "resources": {"gpus": 1}, "gpuProduct": H100},
        )
    )
    decision = cluster.reconcile(T0 + timedelta(minutes=5))
    assert not any(kind == "Deployment" for kind, _ in decision.delete)
    cluster.roll_out()
    decision = cluster.reconcile(T0 + timedelta(minutes=6))
    removed = {name for kind, name in decision.delete if kind == "Deployment"}
    assert removed == {names.product_runtime_name(cluster.name, p) for p in (H100, L4)}


def test_the_cpu_path_reads_no_nodes_and_renders_as_before():
    cluster = FleetCluster(make_spec(), [node("h", H100)])
    cluster.build_to_ready(DIGEST_A)
    assert cluster.status.engines == [] and cluster.status.engines_ready is None
    assert cluster.get("Deployment")["metadata"]["name"] == names.runtime_name(cluster.name)


def test_the_autoscalers_count_is_split_across_the_products():
    """The autoscaler reads every product's serving pods as one count and its total is
    split as runtime.replicas would be."""
    cluster = two_products(replicas=1)
    spec = cluster.spec.model_dump(by_alias=True, exclude_none=True)
    spec["autoscaling"] = {
        "enabled": True, "minReplicas": 2, "maxReplicas": 12,
        "targetRequestsInProgressPerReplica": 4, "scaleUpStabilizationSeconds": 0,
    }  # fmt: skip
    cluster.update_spec(type(cluster.spec).model_validate(spec))
    served(cluster)
    assert sum(cluster.replicas().values()) == 2, "minReplicas before any signal"
    cluster.serving_pods = ServingPods(desired=2, ready=2, starting=0)
    cluster.signals = ScalingSignals(requests_in_progress_per_replica=12.0)
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert cluster.status.replicas == 6, "2 pods x 12 in progress / 4"
    for product in (H100, L4):
        cluster.roll_out(name=names.product_runtime_name(cluster.name, product))
    cluster.serving_pods = ServingPods(desired=6, ready=6, starting=0)
    cluster.signals = ScalingSignals(requests_in_progress_per_replica=4.0)
    cluster.reconcile(T0 + timedelta(minutes=6))
    assert cluster.replicas() == {H100: 4, L4: 2}
    assert cluster.condition(ConditionType.SCALING_ACTIVE).status == TRUE
