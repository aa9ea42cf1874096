"""The real kopf operator against the emulated API server, scenario by scenario.

Each test states a situation, lets the operator converge, and asserts the resulting
objects and status (never the sequence of calls):

- create → build Job → the build succeeds → ConfigMap, Deployment, Service → the
  Deployment is ready → Ready=True, with Events for the transitions;
- a failed build → EngineReady=False with the Job's reason, then a retry after backoff;
- a pinned engine → no Job, straight to the runtime children;
- a version change → a new build while the old engine keeps serving, then the rollout;
- a failed build of a new version → EngineReady=False, the old version still serving;
- a change of engine inputs in the middle of a build → the stale Job is deleted;
- a deleted child is recreated; deleting the InferenceDeployment is not blocked by a
  finalizer and garbage-collects its children; scaling it scales the Deployment and
  keeps replicas, readyReplicas and the selector current;
- an operator restarted in the middle of a build adopts the running Job (no duplicate);
- a spec the CRD schema accepts but the model refuses → Degraded with the message, not
  retried in a loop, and recovery once the spec is fixed;
- a reconcile of an unchanged object writes nothing; and the time from create to all
  children existing;
- last, the RBAC rules of `kubeinfer.operator.rbac` (with leader election's Lease rules)
  grant exactly the (verb, resource) pairs the operator used across all these scenarios
  and the leader election one, no more, no less; and none of its requests changed a spec.
"""

from __future__ import annotations

import asyncio
import inspect
import tempfile
import time
from pathlib import Path

import kopf
from kubeinfer.operator import rbac
from kubeinfer.operator.kube.client import KubeClient
from kubeinfer.operator.reconcile import names
from kubeinfer.operator.reconciler import Reconciler
from operator_harness import (
    FAST,
    IDS,
    NAMESPACE,
    RECORDED_CALLS,
    SPEC_WRITES,
    World,
    condition,
    digest_of,
    emulated_world,
    eventually,
    manifest,
    pod_monitor_api,
    serves_pod_monitors,
    start_operator,
)
from test_operator_leader_election import (
    test_a_leader_whose_lease_is_taken_stops_requeues_included as leader_election_scenario,
)
from test_operator_shadow_rollout import (
    test_the_manual_gate_acts_only_on_the_digest_it_names as shadow_gate_scenario,
)

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


async def passes(world: World, count: int) -> None:
    """Waits for `count` more reconcile passes (each starts with a GET of the object)."""
    gets = sum(c.verb == "get" for c in world.api.calls)
    await eventually(lambda: sum(c.verb == "get" for c in world.api.calls) >= gets + count)


async def passes_settle(world: World) -> None:
    """Waits until no request has arrived for two resync intervals."""
    quiet_for = 2 * FAST.resync_interval_seconds
    while True:
        calls = len(world.api.calls)
        await asyncio.sleep(quiet_for)
        if len(world.api.calls) == calls:
            return


def events(world: World) -> list[dict]:
    return world.children(("v1", "events"))


async def reach_ready(world: World, digest: str) -> None:
    job = (await eventually(world.jobs, what="a build Job"))[0]
    world.finish_build(job, digest=digest)
    await eventually(lambda: runtime_children_exist(world), what="the runtime children")
    world.make_deployment_ready()
    await eventually(lambda: status_of(world, "Ready") == "True", what="Ready=True")


async def test_create_builds_the_engine_then_deploys_and_reports_ready(world: World) -> None:
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest())
        jobs = await eventually(world.jobs, what="the build Job")
        assert len(jobs) == 1
        assert not world.children(DEPLOYMENTS), "nothing is deployed before the engine exists"
        await eventually(lambda: status_of(world, "EngineReady") == "False")
        infd = world.infd()
        assert infd["status"]["phase"] == "BuildingEngine"
        assert condition(infd, "EngineReady")["reason"] == "EngineBuilding"

        digest = digest_of("engine-1")
        world.finish_build(jobs[0], digest=digest)
        await eventually(lambda: runtime_children_exist(world), what="the runtime children")
        assert deployed_digest(world) == digest
        await eventually(lambda: status_of(world, "EngineReady") == "True")
        assert status_of(world, "Ready") == "False", "not ready before the pods are"

        world.make_deployment_ready()
        await eventually(lambda: status_of(world, "Ready") == "True", what="Ready=True")

    infd = world.infd()
    status = infd["status"]
    assert status["phase"] == "Ready"
    assert status["engine"]["digest"] == digest
    assert status["readyReplicas"] == 2 and status["replicas"] == 2
    assert status["selector"]
    for item in status["conditions"]:
        assert item["observedGeneration"] == infd["metadata"]["generation"]
    uid = infd["metadata"]["uid"]
    for kind in (CONFIGMAPS, DEPLOYMENTS, SERVICES, PVCS, ("batch/v1", "jobs")):
        for child in world.children(kind):
            assert [ref["uid"] for ref in child["metadata"]["ownerReferences"]] == [uid]
            labels = child["metadata"]["labels"]
            assert labels[names.LABEL_INSTANCE] == "resnet"
            assert labels[names.LABEL_MANAGED_BY] == names.MANAGED_BY
    reasons = {event["reason"] for event in events(world)}
    assert {"EngineBuilding", "EngineBuilt", "Ready"} <= reasons, reasons
    assert all(e["involvedObject"]["uid"] == uid for e in events(world))
    assert world.api.rejections == []
    assert not any(k.startswith("status") for k in infd["status"]), "kopf kept out of status"
    annotations = infd["metadata"].get("annotations") or {}
    assert any(key.startswith("kubeinfer.io/") for key in annotations), annotations


async def test_failed_build_reports_the_reason_and_retries_after_backoff(world: World) -> None:
    # Failure times have whole seconds: a 3 s backoff leaves the failure visible for >= 2 s.
    slow_retry = FAST.model_copy(
        update={"build_backoff_seconds": 3, "build_backoff_max_seconds": 3}
    )
    async with start_operator(world, slow_retry):
        world.api.create("inferencedeployments", manifest())
        job = (await eventually(world.jobs, what="the build Job"))[0]
        world.finish_build(job, digest=None, exit_code=1, message="CUDA out of memory")
        await eventually(lambda: status_of(world, "Degraded") == "True", what="Degraded")
        engine = condition(world.infd(), "EngineReady")
        assert engine["status"] == "False"
        assert engine["reason"] == "EngineBuildFailed"
        assert "BackoffLimitExceeded" in engine["message"]
        assert "CUDA out of memory" in engine["message"]
        assert not world.children(DEPLOYMENTS)
        await eventually(lambda: any(e["type"] == "Warning" for e in events(world)))

        retried = await eventually(lambda: len(world.jobs()) == 2 and world.jobs(), within=10)
        labels = [j["metadata"]["labels"][names.LABEL_BUILD_ATTEMPT] for j in retried]
        assert sorted(labels) == ["0", "1"]
        newest = max(retried, key=lambda j: j["metadata"]["labels"][names.LABEL_BUILD_ATTEMPT])
        world.finish_build(newest, digest=digest_of("second try"))
        await eventually(lambda: runtime_children_exist(world))
        await eventually(lambda: status_of(world, "EngineReady") == "True")
    assert world.api.rejections == []


async def test_pinned_engine_needs_no_job(world: World) -> None:
    pin = digest_of("known good")
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest(engine={"pin": pin}))
        await eventually(lambda: runtime_children_exist(world), what="the runtime children")
        world.make_deployment_ready()
        await eventually(lambda: status_of(world, "Ready") == "True")
    assert world.jobs() == []
    assert deployed_digest(world) == pin
    assert condition(world.infd(), "EngineReady")["reason"] == "EnginePinned"


async def test_version_change_builds_first_then_rolls_out(world: World) -> None:
    old, new = digest_of("v1"), digest_of("v2")
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest())
        await reach_ready(world, old)
        spec = manifest(version="2")["spec"]
        world.api.patch(*IDS, NAMESPACE, "resnet", {"spec": {"model": spec["model"]}})
        await eventually(lambda: len(world.jobs()) == 2, what="the new version's build Job")
        await eventually(lambda: status_of(world, "Ready") == "False")
        assert deployed_digest(world) == old, "the old engine serves during the build"
        assert world.infd()["status"]["serving"]["engineDigest"] == old

        newest = next(j for j in world.jobs() if "status" not in j)
        world.finish_build(newest, digest=new)
        await eventually(lambda: deployed_digest(world) == new, what="the rollout")
        world.make_deployment_ready()
        await eventually(lambda: status_of(world, "Ready") == "True")
    infd = world.infd()
    assert infd["status"]["serving"] == {"version": "2", "engineDigest": new}
    assert condition(infd, "Ready")["observedGeneration"] == infd["metadata"]["generation"] == 2


async def test_failed_build_of_a_new_version_keeps_the_old_one_serving(world: World) -> None:
    old = digest_of("v1")
    no_retry = FAST.model_copy(
        update={"build_backoff_seconds": 60, "build_backoff_max_seconds": 60}
    )
    async with start_operator(world, no_retry):
        world.api.create("inferencedeployments", manifest())
        await reach_ready(world, old)
        spec = manifest(version="2")["spec"]
        world.api.patch(*IDS, NAMESPACE, "resnet", {"spec": {"model": spec["model"]}})
        await eventually(lambda: len(world.jobs()) == 2, what="the new version's build Job")
        newest = next(j for j in world.jobs() if "status" not in j)
        world.finish_build(newest, digest=None, exit_code=1, message="out of memory")
        await eventually(lambda: status_of(world, "Degraded") == "True", what="Degraded")
        infd = world.infd()
    engine = condition(infd, "EngineReady")
    assert (engine["status"], engine["reason"]) == ("False", "EngineBuildFailed")
    assert "out of memory" in engine["message"]
    assert deployed_digest(world) == old
    assert infd["status"]["serving"] == {"version": "1", "engineDigest": old}
    assert condition(infd, "Available")["status"] == "True"
    assert len(world.jobs()) == 2, "no retry before the backoff"


async def test_input_change_mid_build_deletes_the_stale_job(world: World) -> None:
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest())
        first = (await eventually(world.jobs, what="the first build Job"))[0]
        world.api.patch(*IDS, NAMESPACE, "resnet", {"spec": {"engine": {"precision": "fp16"}}})
        await eventually(
            lambda: (
                [j["metadata"]["name"] for j in world.jobs()]
                not in ([], [first["metadata"]["name"]])
            ),
            what="the new Job",
        )
        await eventually(lambda: len(world.jobs()) == 1, what="the stale Job's deletion")
    assert world.jobs()[0]["metadata"]["name"] != first["metadata"]["name"]


async def test_deleted_children_are_recreated(world: World) -> None:
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest(engine={"pin": digest_of("p")}))
        await eventually(lambda: runtime_children_exist(world))
        service = world.one(*SERVICES)
        deployment = world.one(*DEPLOYMENTS)
        world.api.delete("v1", "services", NAMESPACE, service["metadata"]["name"])
        world.api.delete("apps/v1", "deployments", NAMESPACE, deployment["metadata"]["name"])
        await eventually(lambda: runtime_children_exist(world), what="the recreated children")
    assert world.one(*SERVICES)["metadata"]["uid"] != service["metadata"]["uid"]
    assert world.one(*DEPLOYMENTS)["metadata"]["uid"] != deployment["metadata"]["uid"]


async def test_deleting_the_owner_is_not_blocked_and_takes_the_children(world: World) -> None:
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest(engine={"pin": digest_of("d")}))
        await eventually(lambda: runtime_children_exist(world))
        assert not world.infd()["metadata"].get("finalizers"), "no finalizer to block deletes"
        world.api.delete(*IDS, NAMESPACE, "resnet")
        assert world.infd() is None
        await passes_settle(world)
    assert not any(world.children(kind) for kind in (CONFIGMAPS, DEPLOYMENTS, SERVICES, PVCS))


async def test_scaling_the_owner_scales_the_deployment(world: World) -> None:
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest(engine={"pin": digest_of("s")}))
        await eventually(lambda: runtime_children_exist(world))
        world.make_deployment_ready()
        await eventually(lambda: status_of(world, "Ready") == "True")
        # What `kubectl scale infd/resnet --replicas=3` writes through the scale subresource.
        world.api.patch(*IDS, NAMESPACE, "resnet", {"spec": {"runtime": {"replicas": 3}}})
        await eventually(lambda: world.one(*DEPLOYMENTS)["spec"]["replicas"] == 3)
        await eventually(lambda: world.infd()["status"]["replicas"] == 3)
        assert status_of(world, "Ready") == "False", "not ready until the third pod is"
        world.make_deployment_ready()
        await eventually(lambda: status_of(world, "Ready") == "True")
    status = world.infd()["status"]
    assert (status["replicas"], status["readyReplicas"], status["ready"]) == (3, 3, "3/3")
    selector = dict(part.split("=") for part in status["selector"].split(","))
    deployment = world.one(*DEPLOYMENTS)
    assert deployment["spec"]["selector"]["matchLabels"].items() <= selector.items()
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


async def test_restart_in_the_middle_of_a_build_adopts_the_running_job(world: World) -> None:
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest())
        job = (await eventually(world.jobs, what="the build Job"))[0]
    gets_before = sum(c.verb == "get" for c in world.api.calls)
    async with start_operator(world):
        # A pass GETs the object under its lock: two GETs mean one full pass is done.
        await eventually(lambda: sum(c.verb == "get" for c in world.api.calls) >= gets_before + 2)
        assert [j["metadata"]["uid"] for j in world.jobs()] == [job["metadata"]["uid"]]
        world.finish_build(world.jobs()[0], digest=digest_of("after restart"))
        await eventually(lambda: runtime_children_exist(world))
    assert len(world.jobs()) == 1


async def test_spec_refused_by_the_model_is_degraded_and_not_retried(world: World) -> None:
    # int8 without calibration: the CRD's CEL rule would refuse it, but a cluster without
    # CEL (the emulator evaluates none) lets it through to the operator.
    invalid = manifest(engine={"precision": "int8"})
    async with start_operator(world):
        world.api.create("inferencedeployments", invalid)
        await eventually(lambda: status_of(world, "Degraded") == "True", what="Degraded")
        degraded = condition(world.infd(), "Degraded")
        assert degraded["reason"] == "InvalidSpec"
        assert "spec.engine.calibration" in degraded["message"]
        assert status_of(world, "Ready") == "False"
        # kopf records the permanent failure in its annotations; then all is quiet: no
        # resync, no retry. Asserting that nothing happens needs a window of time.
        await asyncio.sleep(2 * FAST.resync_interval_seconds)
        calls = len(world.api.calls)
        await asyncio.sleep(4 * FAST.resync_interval_seconds)
        assert world.api.calls[calls:] == [], "an invalid spec is not retried in a loop"
        assert world.jobs() == [] and not world.children(DEPLOYMENTS)

        world.api.patch(*IDS, NAMESPACE, "resnet", {"spec": {"engine": {"precision": "fp16"}}})
        await eventually(world.jobs, what="a build Job once the spec is fixed")
        await eventually(lambda: status_of(world, "Degraded") == "False")


async def test_reconcile_of_an_unchanged_object_writes_nothing(world: World) -> None:
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest())
        await reach_ready(world, digest_of("steady"))
        # Let the events of the last writes settle, then count over resync passes.
        await passes(world, 2)
        settled = len(world.api.writes())
        gets = sum(c.verb == "get" for c in world.api.calls)
        await eventually(lambda: sum(c.verb == "get" for c in world.api.calls) >= gets + 3)
        writes = world.api.writes()[settled:]
        # And one more pass, run directly, next to the operator's.
        connection = kopf.ConnectionInfo(server=world.url)
        async with KubeClient(connection) as client:
            reconciler = Reconciler(client, FAST)
            try:
                outcome = await reconciler.reconcile(NAMESPACE, "resnet")
            finally:
                await reconciler.close()  # its resync must not outlive this scenario
        assert world.api.writes()[settled:] == []
    assert outcome.writes == 0 and outcome.decision is not None
    assert writes == [], writes
    print(f"\nWrites by reconciles of an unchanged object: {len(writes)}")


@serves_pod_monitors
async def test_where_the_cluster_serves_pod_monitors_one_scrapes_the_serving_pods(
    world: World,
) -> None:
    async with start_operator(world):
        world.api.create("inferencedeployments", manifest(engine={"pin": digest_of("pm")}))
        monitor = await eventually(
            lambda: world.one("monitoring.coreos.com/v1", "podmonitors"), what="a PodMonitor"
        )
        await eventually(lambda: runtime_children_exist(world))
    # Written through the emulator, which validated it against prometheus-operator's schema.
    deployment, service = world.one(*DEPLOYMENTS), world.one(*SERVICES)
    template = deployment["spec"]["template"]["metadata"]
    assert not [k for k in template.get("annotations") or {} if k.startswith("prometheus.io/")]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector == service["spec"]["selector"], "exactly the pods the Service sends to"
    assert selector.items() <= template["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert monitor["metadata"]["ownerReferences"][0]["uid"] == world.infd()["metadata"]["uid"]


async def test_all_children_exist_within_a_second_of_create(world: World) -> None:
    # A slow resync: only the create handler and child events can make it fast.
    async with start_operator(world, FAST.model_copy(update={"resync_interval_seconds": 60})):
        started = time.monotonic()
        world.api.create("inferencedeployments", manifest(engine={"pin": digest_of("fast")}))
        await eventually(lambda: runtime_children_exist(world) and world.children(PVCS), within=5)
        elapsed = time.monotonic() - started
    print(f"\nCreate to all children existing: {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0


SCENARIOS = [
    shadow_gate_scenario,  # deletes a candidate's children (the other shadow scenarios need
    # real processes; their calls are a subset of these plus builds and pods)
    test_create_builds_the_engine_then_deploys_and_reports_ready,
    test_failed_build_reports_the_reason_and_retries_after_backoff,
    test_pinned_engine_needs_no_job,
    test_version_change_builds_first_then_rolls_out,
    test_failed_build_of_a_new_version_keeps_the_old_one_serving,
    test_input_change_mid_build_deletes_the_stale_job,
    test_deleted_children_are_recreated,
    test_deleting_the_owner_is_not_blocked_and_takes_the_children,
    test_scaling_the_owner_scales_the_deployment,
    test_restart_in_the_middle_of_a_build_adopts_the_running_job,
    test_spec_refused_by_the_model_is_degraded_and_not_retried,
    test_reconcile_of_an_unchanged_object_writes_nothing,
    test_all_children_exist_within_a_second_of_create,
    test_where_the_cluster_serves_pod_monitors_one_scrapes_the_serving_pods,
    leader_election_scenario,  # the Lease: create, get, renew and release (update)
]


async def test_rbac_rules_grant_exactly_the_calls_the_operator_made() -> None:
    # Runs after the scenarios above (pytest keeps a module's order); a scenario that
    # did not run in this session (e.g. under -k) is run here.
    for scenario in SCENARIOS:
        if scenario.__name__ not in RECORDED_CALLS:
            extra = pod_monitor_api() if getattr(scenario, "serves_pod_monitors", False) else None
            async with emulated_world(extra) as world:
                if "tmp_path" in inspect.signature(scenario).parameters:
                    with tempfile.TemporaryDirectory() as directory:
                        await scenario(world, Path(directory))
                else:
                    await scenario(world)
            RECORDED_CALLS[scenario.__name__] = set(world.api.calls)
            SPEC_WRITES[scenario.__name__] = list(world.api.spec_writes)
    assert [w for s in SCENARIOS for w in SPEC_WRITES[s.__name__]] == [], "spec written"
    used = {
        (call.verb, call.group, call.resource)
        for scenario in SCENARIOS
        for call in RECORDED_CALLS[scenario.__name__]
    }
    granted = rbac.granted((*rbac.RULES, *rbac.lease_rules()))
    assert used - granted == set(), "the operator used verbs its Role does not grant"
    assert granted - used == set(), "the Role grants verbs the operator never used"
