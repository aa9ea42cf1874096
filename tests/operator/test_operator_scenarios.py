"""The real kopf operator against the real control plane, scenario by scenario.

Each test states a situation, lets the operator converge, and asserts the resulting
objects and status (never the sequence of calls). Build Jobs run real `kubeinfer build`
and runtime pods real `kubeinfer serve`, as containers of the runtime image that the
kubelet runs:
- create → build Job → the build succeeds → ConfigMap, Deployment, Service → the pods are
  ready → Ready=True, with Events for the transitions;
- a failed build → EngineReady=False with the Job's reason and the build's own message,
  then a retry after backoff, which succeeds once the source is fixed;
- a pinned engine (already in the cache) → no Job, straight to the runtime children;
- a version change → a new build while the old engine keeps serving, then the rollout;
- a failed build of a new version → EngineReady=False, the old version still serving;
- a change of engine inputs in the middle of a build → the stale Job is deleted;
- a deleted child is recreated; deleting the InferenceDeployment is not blocked by a
  finalizer and the garbage collector takes its children; `kubectl scale infd` scales
  the Deployment and keeps replicas, readyReplicas and the selector current;
- an operator restarted in the middle of a build adopts the running Job (no duplicate);
- a spec the model refuses never reaches the operator: the API server's CEL rules refuse
  it with the message `kubeinfer validate` prints;
- a reconcile of an unchanged object writes nothing; and the time from create to all
  children existing;
- where the cluster serves PodMonitors (prometheus-operator's own CRD installed), one
  selects exactly the serving pods;
(That the operator's Role grants exactly what these scenarios used is checked at the end,
in `test_rbac_used_exactly.py`.)

A build that must stay in progress reads its model from a claim that does not exist yet:
its pod waits in ContainerCreating, as a kubelet leaves it, until the test creates the
claim.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
from decide_scenarios import tuned
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.operator.controller import Reconciler
from kubeinfer.operator.kube.client import KubeClient
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
from prometheus_operator_crds import installed_crd

pytestmark = pytest.mark.slow

DEPLOYMENTS = ("apps/v1", "deployments")
SERVICES = ("v1", "services")
CONFIGMAPS = ("v1", "configmaps")
PVCS = ("v1", "persistentvolumeclaims")


def status_of(world: World, type_: str, name: str = "resnet") -> str | None:
    found = condition(world.infd(name), type_)
    return found["status"] if found else None


def runtime_children_exist(world: World) -> bool:
    return all(world.children(kind) for kind in (CONFIGMAPS, DEPLOYMENTS, SERVICES))


def deployed_digest(world: World) -> str | None:
    deployment = world.one(*DEPLOYMENTS)
    if deployment is None:
        return None
    annotations = deployment["spec"]["template"]["metadata"].get("annotations") or {}
    return annotations.get(names.ANNOTATION_ENGINE_DIGEST)


def refusals(world: World) -> list[str]:
    """The operator's requests the API server refused for a reason other than absence, a
    conflict or throttling (which the operator retries by design)."""
    return [
        f"{c.verb} {c.resource} {c.code}"
        for c in world.calls()
        if c.code >= 400 and c.code not in (404, 409, 429)
    ]


async def ready(world: World, within: float = 60) -> None:
    await eventually(lambda: status_of(world, "Ready") == "True", within, "Ready=True")


def build_engine(model: Path, cache: Path) -> str:
    """What a known-good engine in the cache is: built once by `kubeinfer build`."""
    cache.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeinfer.cli",
            "build",
            "--model",
            f"file://{model}",
            "--backend",
            "onnxruntime",
            "--precision",
            "fp32",
            "--max-batch-size",
            "8",
            "--cache",
            str(cache),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return str(json.loads(result.stdout)["digest"])


MODEL_CLAIM = "model-store"


def from_missing_claim(tiny: Model) -> dict[str, Any]:
    """A manifest whose model is on a claim that does not exist yet: its build pod waits in
    ContainerCreating (the node cannot mount the claim), so the build stays in progress
    until `provide_claim`."""
    spec = manifest(tiny)
    spec["spec"]["model"]["source"] = {
        "uri": f"pvc://{MODEL_CLAIM}/tiny.onnx",
        "sha256": tiny.sha256,
    }
    return spec


def provide_claim(world: World, tiny: Model) -> None:
    directory = world.cluster.claim_directory(world.namespace, MODEL_CLAIM)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tiny.onnx").write_bytes(tiny.path.read_bytes())
    world.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": MODEL_CLAIM},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )


async def test_create_builds_the_engine_then_deploys_and_reports_ready(
    world: World, tiny: Model
) -> None:
    async with start_operator(world):
        world.create(manifest(tiny, runtime={"replicas": 2}))
        jobs = await eventually(world.jobs, what="the build Job")
        assert len(jobs) == 1
        await ready(world)
        infd = world.infd()

    status = infd["status"]
    assert status["phase"] == "Ready"
    digest = status["engine"]["digest"]
    assert digest.startswith("sha256:") and deployed_digest(world) == digest
    assert status["readyReplicas"] == 2 and status["replicas"] == 2
    assert status["selector"]
    for item in status["conditions"]:
        assert item["observedGeneration"] == infd["metadata"]["generation"]
    (job,) = world.jobs()
    deployment = world.one(*DEPLOYMENTS)
    assert job["status"]["succeeded"] == 1
    assert deployment["metadata"]["creationTimestamp"] >= job["status"]["completionTime"], (
        "nothing is deployed before the engine exists"
    )
    uid = infd["metadata"]["uid"]
    for kind in (CONFIGMAPS, DEPLOYMENTS, SERVICES, PVCS, ("batch/v1", "jobs")):
        for child in world.children(kind):
            if child["metadata"]["name"] == "kube-root-ca.crt":
                continue  # the namespace's own, published by its controller
            assert [ref["uid"] for ref in child["metadata"]["ownerReferences"]] == [uid]
            labels = child["metadata"]["labels"]
            assert labels[names.LABEL_INSTANCE] == "resnet"
            assert labels[names.LABEL_MANAGED_BY] == names.MANAGED_BY
    ours = [e for e in world.events() if e["involvedObject"]["kind"] == "InferenceDeployment"]
    reasons = {event["reason"] for event in ours}
    assert {"EngineBuilding", "EngineBuilt", "Ready"} <= reasons, reasons
    assert len(ours) >= 5, "every Event is posted, not only the first"
    assert all(e["involvedObject"]["uid"] == uid for e in ours)
    assert refusals(world) == []
    assert not any(k.startswith("status") for k in status), "kopf kept out of status"
    applied = manifest(tiny, runtime={"replicas": 2})["metadata"].get("annotations") or {}
    assert (infd["metadata"].get("annotations") or {}) == applied, "kopf wrote on the object"
    # The pods answer: the Service's endpoints are the ready pods' own addresses. The
    # EndpointSlice controller publishes a pod's readiness after the Deployment counts it,
    # so the slice is awaited, not read once.
    service = world.one(*SERVICES)["metadata"]["name"]

    def ready_endpoints() -> bool:
        slices = world.kube.list(
            "discovery.k8s.io/v1", "endpointslices", f"kubernetes.io/service-name={service}"
        )
        endpoints = [e for s in slices for e in s.get("endpoints") or []]
        return len([e for e in endpoints if e["conditions"]["ready"]]) == 2

    await eventually(ready_endpoints, what="both ready pods in the Service's EndpointSlice")


async def test_failed_build_reports_the_reason_and_retries_after_backoff(
    world: World, tiny: Model, model_directory: Path
) -> None:
    broken = Model(model_directory / f"{world.namespace}.onnx")
    broken.path.write_bytes(b"not an ONNX model")
    # Failure times have whole seconds: a 3 s backoff leaves the failure visible for >= 2 s.
    slow_retry = tuned(
        FAST, build={"backoff_seconds": 3, "backoff_max_seconds": 3, "backoff_limit": 0}
    )
    spec = manifest(broken)
    del spec["spec"]["model"]["source"]["sha256"]  # the file will be fixed in place
    try:
        async with start_operator(world, slow_retry):
            world.create(spec)
            await eventually(lambda: status_of(world, "Degraded") == "True", what="Degraded")
            engine = condition(world.infd(), "EngineReady")
            assert engine["status"] == "False"
            assert engine["reason"] == "EngineBuildFailed"
            assert "BackoffLimitExceeded" in engine["message"]
            assert "ONNX" in engine["message"] or "protobuf" in engine["message"], engine
            assert not world.children(DEPLOYMENTS)
            await eventually(lambda: any(e["type"] == "Warning" for e in world.events()))

            broken.path.write_bytes(tiny.path.read_bytes())
            retried = await eventually(lambda: len(world.jobs()) == 2 and world.jobs(), 15)
            labels = [j["metadata"]["labels"][names.LABEL_BUILD_ATTEMPT] for j in retried]
            assert sorted(labels) == ["0", "1"]
            await eventually(lambda: runtime_children_exist(world))
            await eventually(lambda: status_of(world, "EngineReady") == "True")
    finally:
        broken.path.unlink(missing_ok=True)
    assert refusals(world) == []


async def test_pinned_engine_needs_no_job(world: World, tiny: Model) -> None:
    claim = names.cache_claim_name("resnet")
    pin = await asyncio.to_thread(
        build_engine, tiny.path, world.cluster.claim_directory(world.namespace, claim)
    )
    async with start_operator(world):
        world.create(manifest(tiny, engine={"pin": pin}))
        await ready(world)
    assert world.jobs() == []
    assert deployed_digest(world) == pin
    assert condition(world.infd(), "EngineReady")["reason"] == "EnginePinned"


async def test_version_change_builds_first_then_rolls_out(
    world: World, tiny: Model, model_directory: Path
) -> None:
    second = Model(build_tiny_mlp(model_directory / f"{world.namespace}-v2.onnx", seed=2))
    async with start_operator(world):
        world.create(manifest(tiny))
        await ready(world)
        old = world.infd()["status"]["engine"]["digest"]
        world.patch_spec({"model": manifest(second, version="2")["spec"]["model"]})
        await eventually(lambda: len(world.jobs()) == 2, what="the new version's build Job")
        await eventually(lambda: status_of(world, "Ready") == "False")
        assert world.infd()["status"]["serving"]["engineDigest"] == old
        await eventually(lambda: deployed_digest(world) not in (None, old), what="the rollout")
        await ready(world)
    infd = world.infd()
    new = infd["status"]["engine"]["digest"]
    assert new != old
    assert infd["status"]["serving"] == {"version": "2", "engineDigest": new}
    assert condition(infd, "Ready")["observedGeneration"] == infd["metadata"]["generation"] == 2


async def test_failed_build_of_a_new_version_keeps_the_old_one_serving(
    world: World, tiny: Model, model_directory: Path
) -> None:
    broken = model_directory / f"{world.namespace}-broken.onnx"
    broken.write_bytes(b"\x00" * 64)
    no_retry = tuned(
        FAST, build={"backoff_seconds": 60, "backoff_max_seconds": 60, "backoff_limit": 0}
    )
    try:
        async with start_operator(world, no_retry):
            world.create(manifest(tiny))
            await ready(world)
            old = world.infd()["status"]["engine"]["digest"]
            world.patch_spec({"model": manifest(Model(broken), version="2")["spec"]["model"]})
            await eventually(lambda: status_of(world, "Degraded") == "True", what="Degraded")
            infd = world.infd()
    finally:
        broken.unlink(missing_ok=True)
    engine = condition(infd, "EngineReady")
    assert (engine["status"], engine["reason"]) == ("False", "EngineBuildFailed")
    assert deployed_digest(world) == old
    assert infd["status"]["serving"] == {"version": "1", "engineDigest": old}
    assert condition(infd, "Available")["status"] == "True"
    assert len(world.jobs()) == 2, "no retry before the backoff"


async def test_input_change_mid_build_deletes_the_stale_job(world: World, tiny: Model) -> None:
    async with start_operator(world):
        world.create(from_missing_claim(tiny))
        first = (await eventually(world.jobs, what="the first build Job"))[0]
        await eventually(
            lambda: world.pods(f"job-name={first['metadata']['name']}"), what="the build pod"
        )
        world.patch_spec({"engine": {"precision": "fp16"}})
        await eventually(
            lambda: (
                [j["metadata"]["name"] for j in world.jobs()]
                not in ([], [first["metadata"]["name"]])
            ),
            what="the new Job",
        )
        await eventually(lambda: len(world.jobs()) == 1, what="the stale Job's deletion")
    assert world.jobs()[0]["metadata"]["name"] != first["metadata"]["name"]


async def test_deleted_children_are_recreated(world: World, tiny: Model) -> None:
    async with start_operator(world):
        world.create(manifest(tiny))
        await eventually(lambda: runtime_children_exist(world))
        service = world.one(*SERVICES)
        deployment = world.one(*DEPLOYMENTS)
        world.kube.delete("v1", "services", service["metadata"]["name"])
        world.kube.delete("apps/v1", "deployments", deployment["metadata"]["name"])
        await eventually(
            lambda: (
                runtime_children_exist(world)
                and world.one(*SERVICES)["metadata"]["uid"] != service["metadata"]["uid"]
                and world.one(*DEPLOYMENTS)["metadata"]["uid"] != deployment["metadata"]["uid"]
            ),
            what="the recreated children",
        )


async def test_deleting_the_owner_is_not_blocked_and_takes_the_children(
    world: World, tiny: Model
) -> None:
    async with start_operator(world):
        world.create(manifest(tiny))
        await eventually(lambda: runtime_children_exist(world))
        assert not world.infd()["metadata"].get("finalizers"), "no finalizer to block deletes"
        world.kube.delete(*IDS, "resnet")
        assert world.infd() is None

        def left() -> list[str]:
            kinds = (DEPLOYMENTS, SERVICES, PVCS, CONFIGMAPS)
            return [
                f"{kind[1]}/{c['metadata']['name']}"
                for kind in kinds
                for c in world.children(kind)
                if c["metadata"]["name"] != "kube-root-ca.crt"
            ]

        # The claim goes last: its protection finalizer waits for the pods using it to end.
        # A CRD created moments ago is seen by the garbage collector at its next discovery
        # (every 30 s), so a first test of a session may wait that long for the rest too.
        try:
            await eventually(lambda: not left(), 90, "the garbage collector to take every child")
        except AssertionError:
            raise AssertionError(f"left after 90 s: {left()}") from None


async def test_kubectl_scale_scales_the_deployment(world: World, tiny: Model) -> None:
    async with start_operator(world):
        world.create(manifest(tiny))
        await ready(world)
        await asyncio.to_thread(world.kube.kubectl, "scale", "infd/resnet", "--replicas=3")
        await eventually(lambda: world.one(*DEPLOYMENTS)["spec"]["replicas"] == 3)
        await eventually(lambda: world.infd()["status"]["replicas"] == 3)
        await eventually(lambda: world.infd()["status"].get("readyReplicas") == 3, 60)
        await ready(world)
    status = world.infd()["status"]
    assert (status["replicas"], status["readyReplicas"], status["ready"]) == (3, 3, "3/3")
    selector = dict(part.split("=") for part in status["selector"].split(","))
    deployment = world.one(*DEPLOYMENTS)
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    selected = world.pods(status["selector"])
    assert {p["metadata"]["name"] for p in selected} == {
        p["metadata"]["name"]
        for p in world.pods()
        if p["metadata"]["labels"].items() >= deployment["spec"]["selector"]["matchLabels"].items()
    }, "the scale selector is the serving Deployment's pods, and only them"
    running = [p for p in world.pods() if p["status"].get("phase") == "Running"]
    assert len(running) == 3


async def test_restart_in_the_middle_of_a_build_adopts_the_running_job(
    world: World, tiny: Model
) -> None:
    async with start_operator(world):
        world.create(from_missing_claim(tiny))
        job = (await eventually(world.jobs, what="the build Job"))[0]
    async with start_operator(world):
        await eventually(lambda: world.passes_done() >= 1)  # the new operator's first pass
        assert [j["metadata"]["uid"] for j in world.jobs()] == [job["metadata"]["uid"]]
        provide_claim(world, tiny)
        await eventually(lambda: runtime_children_exist(world), 60)
    assert len(world.jobs()) == 1


async def test_a_spec_the_model_refuses_is_refused_by_the_api_server(
    world: World, tiny: Model
) -> None:
    invalid = manifest(tiny, engine={"precision": "int8"})  # int8 needs calibration data
    refusal = await asyncio.to_thread(
        world.kube.kubectl, "create", "-f", "-", stdin=json.dumps(invalid), check=False
    )
    assert "precision int8 needs calibration data unless the engine is pinned" in refusal
    assert "spec.engine.calibration" in refusal
    assert world.infd() is None


async def test_reconcile_of_an_unchanged_object_writes_nothing(world: World, tiny: Model) -> None:
    async with start_operator(world):
        world.create(manifest(tiny))
        await ready(world)
        # Let the events of the last writes settle, then count over resync passes.
        before = world.passes_done()
        await eventually(lambda: world.passes_done() >= before + 2)
        settled = len(world.writes())
        before = world.passes_done()
        await eventually(lambda: world.passes_done() >= before + 3)
        writes = world.writes()[settled:]
        # And one more pass, run directly, next to the operator's.
        connection = kopf.ConnectionInfo(
            server=world.cluster.server, ca_path=str(world.cluster.ca_file), token=world.token()
        )
        async with KubeClient(connection) as client:
            reconciler = Reconciler(client, FAST)
            try:
                outcome = await reconciler.reconcile(world.namespace, "resnet")
            finally:
                await reconciler.close()  # its resync must not outlive this scenario
    assert outcome.writes == 0 and outcome.decision is not None
    assert writes == [], writes
    print(f"\nWrites by reconciles of an unchanged object: {len(writes)}")


async def test_where_the_cluster_serves_pod_monitors_one_scrapes_the_serving_pods(
    world: World, tiny: Model
) -> None:
    with installed_crd(world.cluster, "podmonitors"):
        async with start_operator(world):
            world.create(manifest(tiny))
            monitor = await eventually(
                lambda: world.one("monitoring.coreos.com/v1", "podmonitors"), 60, "a PodMonitor"
            )
            await eventually(lambda: runtime_children_exist(world))
        # Written to the API server, which validated it against prometheus-operator's CRD.
        deployment, service = world.one(*DEPLOYMENTS), world.one(*SERVICES)
    template = deployment["spec"]["template"]["metadata"]
    assert not [k for k in template.get("annotations") or {} if k.startswith("prometheus.io/")]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector == service["spec"]["selector"], "exactly the pods the Service sends to"
    assert selector.items() <= template["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert monitor["metadata"]["ownerReferences"][0]["uid"] == world.infd()["metadata"]["uid"]


async def test_the_create_handler_makes_every_child_without_the_resync(
    world: World, tiny: Model
) -> None:
    pin = "sha256:" + "0" * 64  # never served here: only the children are awaited
    # A resync far beyond the wait: only the create handler and child events can make
    # the children in time, however busy the machine.
    async with start_operator(world, tuned(FAST, requeue={"resync_interval_seconds": 3600})):
        world.create(manifest(tiny, engine={"pin": pin}))
        await eventually(
            lambda: runtime_children_exist(world) and world.children(PVCS),
            within=60,
            what="every child",
        )
