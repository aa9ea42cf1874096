"""Defects found by trying the operator from the outside, each fixed and pinned here on the
real control plane:

- a metric reading that makes no sense (a GPU memory used ratio of 40, as a mislabelled
  series gives) used to fail every pass, since the status cannot hold it, so nothing
  scaled, not even on the requests in progress: now that one figure is set aside, ScalingActive says
  so, and the requests in progress still scale the runtime. A real Prometheus evaluates the
  object's query overrides, which stand for the mislabelled series (`vector(40)`);
- moving the engine cache to another claim (`engine.cache.existingClaim`) used to strand
  the engine: the claim was not part of the build key, so the new pods mounted a claim
  without the engine, crashed, and nothing rebuilt it. Now the new claim gets its build
  and the pods come up on it;
- build pods are found by the Job controller's label in both its forms (the legacy
  `job-name` too), so a build's termination message is read from either.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_harness import restricted
from decide_scenarios import tuned
from kubeinfer.operator.state import names
from operator_harness import FAST, Model, World, condition, eventually, manifest, start_operator
from prometheus_harness import running_prometheus

pytestmark = pytest.mark.slow


async def test_a_reading_out_of_range_is_set_aside_and_the_others_still_scale(
    world: World, tiny: Model, tmp_path: Path
) -> None:
    (tmp_path / "prometheus").mkdir()
    with running_prometheus([], tmp_path / "prometheus") as prometheus:
        spec = manifest(
            tiny,
            autoscaling={
                "enabled": True,
                "minReplicas": 1,
                "maxReplicas": 2,
                "targetRequestsInProgressPerReplica": 3,
            },
            monitoring={
                "prometheus": {"url": prometheus.url},
                "queries": {
                    "requestsInProgressPerReplica": "vector(6)",
                    "gpuMemoryUsedRatio": "vector(40)",
                },
            },
        )
        async with start_operator(world, tuned(FAST, requeue={"autoscale_poll_seconds": 0.5})):
            world.create(spec)
            await eventually(
                lambda: (
                    ((world.infd().get("status") or {}).get("autoscaling") or {}).get(
                        "desiredReplicas"
                    )
                    == 2
                ),
                90,
                "the requests in progress to call for 2 pods",
            )
            infd = world.infd()
    active = condition(infd, "ScalingActive")
    assert active["status"] == "True", active
    assert "GPU memory used ratio of 40" in active["message"], active["message"]
    assert "set aside" in active["message"]
    metrics = infd["status"]["metrics"]
    assert metrics["requestsInProgressPerReplica"] == 6
    assert metrics.get("gpuMemoryUsedRatio") is None
    deployment = world.kube.get("apps/v1", "deployments", names.runtime_name("resnet"))
    assert deployment["spec"]["replicas"] == 2


def ready_at(world: World, generation: int) -> bool:
    ready = condition(world.infd(), "Ready") or {}
    return ready.get("status") == "True" and ready.get("observedGeneration") == generation


def claim(world: World, name: str) -> None:
    world.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )


async def test_moving_the_cache_to_another_claim_builds_the_engine_there(
    world: World, tiny: Model
) -> None:
    claim(world, "cache-a")
    claim(world, "cache-b")
    async with start_operator(world):
        world.create(manifest(tiny, engine={"cache": {"existingClaim": "cache-a"}}))
        await eventually(lambda: ready_at(world, 1), 90, "Ready")
        world.patch_spec({"engine": {"cache": {"existingClaim": "cache-b"}}})
        await eventually(lambda: len(world.jobs()) == 2, 60, "a build into the new claim")
        await eventually(lambda: ready_at(world, 2), 120, "Ready on the new claim")
    engines_b = list((world.cluster.claim_directory(world.namespace, "cache-b")).rglob("*"))
    assert engines_b, "the engine was built into the new claim"
    # A pod of the old claim may still be terminating (out of the Service's endpoints,
    # its phase still Running through its grace period): only the live ones count.
    pods = [
        p
        for p in world.pods()
        if p["metadata"]["labels"].get(names.LABEL_ROLE)
        and not p["metadata"].get("deletionTimestamp")
    ]
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for p in pods
        if p["status"].get("phase") == "Running"
        for v in p["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims == {"cache-b"}
    restarts = [s["restartCount"] for p in pods for s in p["status"].get("containerStatuses", [])]
    assert not any(restarts), "no runtime pod crashed for want of its engine"


async def test_a_build_pod_with_only_the_legacy_job_label_is_gathered(
    world: World, tiny: Model
) -> None:
    import kopf
    from kubeinfer.operator.api.v1alpha1.validation import parse_spec
    from kubeinfer.operator.kube.children import read_children
    from kubeinfer.operator.kube.client import KubeClient

    async with start_operator(world):
        world.create(from_missing_claim_spec(tiny))
        (job,) = await eventually(world.jobs, 60, "the build Job")
    template = job["spec"]["template"]["metadata"]["labels"]
    # As a Job controller before Kubernetes 1.27 labelled its pods: `job-name` only.
    world.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "legacy-build-pod",
                "labels": {**template, "job-name": job["metadata"]["name"]},
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    restricted({"name": "build", "image": "example.com/never-pulled:1"})
                ],
            },
        }
    )
    body = world.infd()
    connection = kopf.ConnectionInfo(
        server=world.cluster.server, ca_path=str(world.cluster.ca_file), token=world.token()
    )
    async with KubeClient(connection) as client:
        observed = await read_children(client, body, parse_spec(body["spec"]))
    assert "legacy-build-pod" in [p["metadata"]["name"] for p in observed.job_pods]


def from_missing_claim_spec(tiny: Model) -> dict:
    """A build that waits (its model's claim does not exist), so the Job stays."""
    spec = manifest(tiny)
    spec["spec"]["model"]["source"] = {"uri": "pvc://nowhere/tiny.onnx", "sha256": tiny.sha256}
    return spec
