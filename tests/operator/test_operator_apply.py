"""The I/O layer on its own, against the emulated API server over HTTP: the client's
404-as-absence, concurrent triggers sharing one reconcile pass, server-side apply
creating and then leaving an unchanged object alone, the status patch guarded by
resourceVersion, background deletion with garbage collection, label-selected gathering,
and events that never fail a pass. Also pins the emulator's own API-server semantics
that the scenarios rely on."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import kopf
import pytest
from api_semantics import matches_selector
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus, Phase
from kubeinfer.operator.kube import apply
from kubeinfer.operator.kube.client import CONFIGMAP, INFERENCE_DEPLOYMENT, ApiError, KubeClient
from kubeinfer.operator.kube.gather import children_selector, gather, owner_ref_from_body
from kubeinfer.operator.reconcile import names
from kubeinfer.operator.reconcile.snapshot import Event
from kubeinfer.operator.reconciler import Reconciler
from kubeinfer.operator.settings import OperatorSettings
from operator_harness import NAMESPACE, World, manifest


def configmap(owner: dict, data: dict[str, str], name: str = "resnet-runtime") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {
                names.LABEL_INSTANCE: owner["metadata"]["name"],
                names.LABEL_MANAGED_BY: names.MANAGED_BY,
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubeinfer.io/v1alpha1",
                    "kind": "InferenceDeployment",
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": data,
    }


@pytest.fixture
async def client(world: World):
    async with KubeClient(kopf.ConnectionInfo(server=world.url)) as client:
        yield client


async def test_apply_creates_then_an_identical_apply_changes_nothing(world, client) -> None:
    owner = world.api.create("inferencedeployments", manifest())
    created = await client.apply(configmap(owner, {"a": "1"}))
    again = await client.apply(configmap(owner, {"a": "1"}))
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    changed = await client.apply(configmap(owner, {"b": "2"}))
    assert changed["data"] == {"b": "2"}, "a field no longer applied is removed"
    assert int(changed["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])


async def test_absence_is_none_and_deleting_the_absent_is_false(world, client) -> None:
    assert await client.get(CONFIGMAP, NAMESPACE, "missing") is None
    assert await client.delete(CONFIGMAP, NAMESPACE, "missing") is False


async def test_deleting_the_owner_collects_its_children(world, client) -> None:
    owner = world.api.create("inferencedeployments", manifest())
    await client.apply(configmap(owner, {"a": "1"}))
    assert await client.delete(INFERENCE_DEPLOYMENT, NAMESPACE, "resnet") is True
    assert world.children(("v1", "configmaps")) == []


def job(owner: dict, name: str) -> dict:
    """A build-Job-shaped child: gather keeps every owned Job it lists (Jobs are not
    picked by name), so Jobs are where the label selector shows."""
    meta = configmap(owner, {}, name=name)["metadata"]
    container = {"name": "build", "image": "kubeinfer/runtime:test"}
    spec = {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


async def test_gather_keeps_children_both_labelled_and_owned(world, client) -> None:
    """Pins both halves of gather's filter: a child must match the children's label
    selector (an owned but unlabelled Job is left out) and carry an ownerReference to this
    object's uid (a labelled Job owned by someone else is left out)."""
    owner = world.api.create("inferencedeployments", manifest())
    await client.apply(configmap(owner, {"a": "1"}))
    await client.apply(job(owner, "resnet-build-1"))
    other = world.api.create("inferencedeployments", manifest(name="other"))
    stranger = job(owner, "not-ours")  # the uid must exist, or the GC removes the Job
    stranger["metadata"]["ownerReferences"][0]["uid"] = other["metadata"]["uid"]
    await client.apply(stranger)
    unlabelled = job(owner, "unlabelled")
    unlabelled["metadata"]["labels"] = {}
    await client.apply(unlabelled)
    from kubeinfer.operator.api.v1alpha1.validation import parse_spec

    observed = await gather(client, owner, parse_spec(owner["spec"]))
    assert observed.configmap["metadata"]["name"] == "resnet-runtime"
    assert observed.deployment is None and observed.job_pods == ()
    assert [j["metadata"]["name"] for j in observed.jobs] == ["resnet-build-1"], (
        "only the Job both labelled as a child and owned by this object is gathered"
    )
    assert children_selector("resnet").startswith(names.LABEL_INSTANCE)


async def test_status_patch_needs_the_current_resource_version(world, client) -> None:
    owner = world.api.create("inferencedeployments", manifest())
    ref = owner_ref_from_body(owner)
    status = InferenceDeploymentStatus(phase=Phase.BUILDING_ENGINE, observed_generation=1)
    written = await apply.patch_status(client, ref, status, owner["metadata"]["resourceVersion"])
    assert written["status"]["phase"] == "BuildingEngine"
    assert written["spec"] == owner["spec"], "a status write never touches the spec"
    assert written["metadata"]["generation"] == 1, "a status write bumps no generation"
    with pytest.raises(ApiError) as conflict:
        await apply.patch_status(client, ref, status, owner["metadata"]["resourceVersion"])
    assert conflict.value.status == 409 and conflict.value.retryable


class ForbiddenEvents(KubeClient):
    """The API server of a cluster whose Role lacks events/create."""

    async def create(self, obj: dict) -> dict:
        if obj["kind"] == "Event" and obj["reason"] == "Forbidden":
            raise ApiError(403, "Forbidden", "events is forbidden")
        return await super().create(obj)


async def test_a_refused_event_is_logged_not_raised(world, caplog) -> None:
    owner = owner_ref_from_body(world.api.create("inferencedeployments", manifest()))
    events = [Event("Warning", "Forbidden", "refused"), Event("Normal", "Ready", "fine")]
    async with ForbiddenEvents(kopf.ConnectionInfo(server=world.url)) as client:
        with caplog.at_level(logging.WARNING):
            await apply.post_events(client, owner, events, datetime.now(UTC))
    posted = world.children(("v1", "events"))
    assert [e["reason"] for e in posted] == ["Ready"]
    assert posted[0]["involvedObject"]["uid"] == owner.uid
    assert "Event not posted" in caplog.text


async def test_a_server_side_apply_needs_a_field_manager(world) -> None:
    async with world.api.clients[0].patch(
        "/api/v1/namespaces/ml/configmaps/x",
        json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
        headers={"Content-Type": "application/apply-patch+yaml"},
    ) as response:
        assert response.status == 400


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1,b", {"a": "1"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),!c", {"a": "2"}, True),
        ("a notin (1,2)", {"a": "2"}, False),
        ("job-name in (x-0,x-1)", {"job-name": "x-1"}, True),
        ("", {}, True),
    ],
)
def test_emulated_label_selectors(selector, labels, matches) -> None:
    assert matches_selector({"metadata": {"labels": labels}}, selector) is matches


async def test_triggers_arriving_together_share_one_pass(world, client) -> None:
    world.api.create("inferencedeployments", manifest(engine={"pin": "sha256:" + "a" * 64}))
    reconciler = Reconciler(client, OperatorSettings())
    try:
        outcomes = await asyncio.gather(
            *(reconciler.reconcile(NAMESPACE, "resnet") for _ in range(10))
        )
    finally:
        await reconciler.close()
    assert sum(c.verb == "get" for c in world.api.calls) == 1, "one pass for ten triggers"
    assert all(outcome is outcomes[0] for outcome in outcomes)
    assert outcomes[0].writes > 0 and world.children(("apps/v1", "deployments"))


async def test_the_emulator_notices_a_spec_written_over_http(world, client) -> None:
    world.api.create("inferencedeployments", manifest())
    await client.json_patch(
        INFERENCE_DEPLOYMENT,
        NAMESPACE,
        "resnet",
        [{"op": "replace", "path": "/spec/runtime/replicas", "value": 3}],
    )
    assert world.api.spec_writes == [
        "PATCH /apis/kubeinfer.io/v1alpha1/namespaces/ml/inferencedeployments/resnet"
    ]
    assert world.infd()["metadata"]["generation"] == 2
