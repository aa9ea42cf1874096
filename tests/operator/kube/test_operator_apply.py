"""The I/O layer on its own (`kube.client`, `kube.apply`, `kube.children`, the Reconciler)
against the session's real API server, each step checked against what the server did:

- a missing object reads as None and deleting it is False (404 is absence);
- server-side apply creates (201), an identical apply leaves the object alone (the same
  resourceVersion), and a field no longer applied is removed;
- deleting the owner in the background removes it at once and the real garbage collector
  takes its children;
- gathering keeps exactly the children both labelled for this object and owned by it;
- the status patch is guarded by resourceVersion: the real server refuses a stale one,
  which the status writer reports as a retryable conflict; a failed JSON-patch `test` is
  a clear, non-retryable ApiError 422 from the client itself;
- Events never fail a pass: a Role without `events/create` makes every Event a logged
  403 while the pass still writes its children and status; several Events with the same
  reason for the same object are all posted (none refused with 409);
- ten triggers arriving together share one pass (one GET of the object);
- a pass reads its object from the watch's index when that is at least as new as what
  the operator wrote and read of it, with a GET otherwise: after its own status write,
  an index still holding the older object is not trusted, one that caught up is;
- with one pass slot (`api.max_concurrent_passes`), three objects' passes run one after
  another (each object's requests contiguous in the audit log), and the triggers that
  arrive while an object's pass waits for the slot join it.

The raw client calls run as a ServiceAccount with every verb in the test's namespace (the
I/O layer, apart from the operator's Role); the Reconciler's as the operator's own
account, bound to its Role.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from cluster_harness import ApiCall
from kubeinfer.operator import rbac
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus, Phase
from kubeinfer.operator.api.v1alpha1.validation import parse_spec
from kubeinfer.operator.controller import Reconciler
from kubeinfer.operator.kube import apply
from kubeinfer.operator.kube.cache import OWNERS_INDEX, CachedReader
from kubeinfer.operator.kube.children import read_children
from kubeinfer.operator.kube.client import CONFIGMAP, INFERENCE_DEPLOYMENT, ApiError, KubeClient
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.decision import Event
from kubeinfer.operator.state.names import children_selector
from kubeinfer.operator.state.observed import owner_ref_from_body
from operator_harness import IDS, Model, World, eventually, manifest

PIN = "sha256:" + "a" * 64
"""A pinned engine: the pass goes straight to the runtime children, no build."""
FULL_ACCESS = "io-layer"
"""The raw calls' ServiceAccount: cluster-admin's rules, in the test's namespace only."""
NO_EVENTS = "operator-without-events"
"""An account with the operator's Role less its Event rule."""


def bind(world: World, account: str, role_kind: str, role: str) -> None:
    kube = world.kube
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}})
    kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": world.namespace}],
        }
    )


def connection(world: World, token: str) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(
        server=world.cluster.server,
        ca_path=str(world.cluster.ca_file),
        token=token,
        default_namespace=world.namespace,
    )


def full_access_token(world: World) -> str:
    """A token of FULL_ACCESS, made on first use (RoleBinding to cluster-admin: every verb,
    in this namespace only)."""
    if world.kube.get("v1", "serviceaccounts", FULL_ACCESS) is None:
        bind(world, FULL_ACCESS, "ClusterRole", "cluster-admin")
    return world.cluster.service_account_token(world.namespace, FULL_ACCESS)


@pytest.fixture
async def client(world: World) -> AsyncIterator[KubeClient]:
    token = await asyncio.to_thread(full_access_token, world)
    async with KubeClient(connection(world, token)) as client:
        yield client


def calls_of(world: World, account: str) -> list[ApiCall]:
    return world.kube.calls(user=f"system:serviceaccount:{world.namespace}:{account}")


async def audited(calls: Callable[[], list[ApiCall]], count: int) -> list[ApiCall]:
    """`calls()` once it holds `count` requests: the API server writes a request's audit
    line as the request completes, which may be just after the client has its answer."""
    await eventually(lambda: len(calls()) >= count, within=10, what=f"{count} audited calls")
    return calls()


def configmap(owner: dict[str, Any], data: dict[str, str], name: str = "resnet-runtime") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": owner["metadata"]["namespace"],
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


def job(owner: dict[str, Any], name: str) -> dict[str, Any]:
    """A build-Job-shaped child: gather keeps every owned Job it lists (Jobs are not picked
    by name), so Jobs are where the label selector shows. Suspended, so that the Job
    controller starts no pod for it."""
    meta = configmap(owner, {}, name=name)["metadata"]
    container = {"name": "build", "image": "kubeinfer/runtime:test", "command": ["true"]}
    spec = {
        "suspend": True,
        "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


async def test_apply_creates_then_an_identical_apply_changes_nothing(
    world: World, client: KubeClient, tiny: Model
) -> None:
    owner = world.create(manifest(tiny))
    created = await client.apply(configmap(owner, {"a": "1"}))
    again = await client.apply(configmap(owner, {"a": "1"}))
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    changed = await client.apply(configmap(owner, {"b": "2"}))
    assert changed["data"] == {"b": "2"}, "a field no longer applied is removed"
    assert changed["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    managers = {m["manager"] for m in changed["metadata"]["managedFields"]}
    assert managers == {"kubeinfer"}
    applies = await audited(
        lambda: [c for c in calls_of(world, FULL_ACCESS) if c.resource == "configmaps"], 3
    )
    assert [(c.verb, c.code) for c in applies] == [("patch", 201), ("patch", 200), ("patch", 200)]


async def test_absence_is_none_and_deleting_the_absent_is_false(
    world: World, client: KubeClient
) -> None:
    assert await client.get(CONFIGMAP, world.namespace, "missing") is None
    assert await client.delete(CONFIGMAP, world.namespace, "missing") is False
    calls = await audited(
        lambda: [c for c in calls_of(world, FULL_ACCESS) if c.resource == "configmaps"], 2
    )
    assert [c.code for c in calls] == [404, 404], "both answered by the server, as absent"


async def test_deleting_the_owner_in_the_background_collects_its_children(
    world: World, client: KubeClient, tiny: Model
) -> None:
    owner = world.create(manifest(tiny))
    await client.apply(configmap(owner, {"a": "1"}))
    assert await client.delete(INFERENCE_DEPLOYMENT, world.namespace, "resnet") is True
    assert world.infd() is None, "in the background: the owner goes before its children"
    # A CRD created moments ago is seen by the garbage collector at its next discovery
    # (every 30 s), so the session's first test of this may wait that long.
    await eventually(
        lambda: not world.kube.list("v1", "configmaps", children_selector("resnet")),
        within=90,
        what="the garbage collector to take the ConfigMap",
    )


async def test_gather_keeps_children_both_labelled_and_owned(
    world: World, client: KubeClient, tiny: Model
) -> None:
    """Both halves of gather's filter: a child must match the children's label selector
    (an owned but unlabelled Job is left out) and carry an ownerReference to this object's
    uid (a labelled Job owned by another object is left out)."""
    owner = world.create(manifest(tiny))
    other = world.create(manifest(tiny, name="other"))
    await client.apply(configmap(owner, {"a": "1"}))
    await client.apply(job(owner, "resnet-build-1"))
    stranger = job(owner, "not-ours")  # owned by an object that exists, or the GC takes it
    stranger["metadata"]["ownerReferences"][0].update(name="other", uid=other["metadata"]["uid"])
    await client.apply(stranger)
    unlabelled = job(owner, "unlabelled")
    unlabelled["metadata"]["labels"] = {}
    await client.apply(unlabelled)

    observed = await read_children(client, owner, parse_spec(owner["spec"]))
    assert observed.configmap["metadata"]["name"] == names.runtime_name("resnet")
    assert observed.deployment is None and observed.job_pods == ()
    assert [j["metadata"]["name"] for j in observed.jobs] == ["resnet-build-1"], (
        "only the Job both labelled as a child and owned by this object is gathered"
    )
    assert len(world.jobs()) == 3, "the other two exist, and were listed past"


async def test_status_patch_needs_the_current_resource_version(
    world: World, client: KubeClient, tiny: Model
) -> None:
    owner = world.create(manifest(tiny))
    ref = owner_ref_from_body(owner)
    stale = owner["metadata"]["resourceVersion"]
    status = InferenceDeploymentStatus(phase=Phase.BUILDING_ENGINE, observed_generation=1)
    written = await apply.patch_status(client, ref, status, stale)
    assert written["status"]["phase"] == "BuildingEngine"
    assert written["spec"] == owner["spec"], "a status write never touches the spec"
    assert written["metadata"]["generation"] == 1, "a status write bumps no generation"
    with pytest.raises(ApiError) as conflict:
        await apply.patch_status(client, ref, status, stale)
    assert conflict.value.status == 409 and conflict.value.retryable
    assert "test" in conflict.value.message, conflict.value.message
    statuses = await audited(
        lambda: [c for c in calls_of(world, FULL_ACCESS) if c.resource.endswith("/status")], 2
    )
    assert [c.code for c in statuses] == [200, 422], "the real server refused the stale one"


async def test_a_failed_json_patch_test_is_a_clear_refusal(
    world: World, client: KubeClient, tiny: Model
) -> None:
    """The real API server answers a failed `test` operation with 422 Invalid and a message
    that names neither the operation nor the path ("the server rejected our request due
    to an error in our request"); the client says what happened."""
    owner = world.create(manifest(tiny))
    operations = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}},
    ]
    with pytest.raises(ApiError) as refused:
        await client.json_patch(INFERENCE_DEPLOYMENT, world.namespace, "resnet", operations)
    error = refused.value
    assert (error.status, error.reason) == (422, "Invalid")
    assert not error.retryable, "retrying the same patch fails the same way"
    assert "test operation failed" in error.message and "inferencedeployments/resnet" in (
        error.message
    ), error.message
    current = world.infd()
    assert current["metadata"]["resourceVersion"] == owner["metadata"]["resourceVersion"]
    assert "annotations" not in current["metadata"], "nothing of a refused patch is applied"


async def test_several_events_with_the_same_reason_are_all_posted(
    world: World, tiny: Model
) -> None:
    owner = owner_ref_from_body(world.create(manifest(tiny)))
    events = [Event("Normal", "ScaledUp", f"replicas {n}") for n in range(1, 6)]
    now = datetime.now(UTC)
    async with KubeClient(connection(world, world.token())) as client:
        await apply.post_events(client, owner, events, now)
        await apply.post_events(client, owner, events[:1], now)  # the very same, again
    posted = [e for e in world.events() if e["involvedObject"]["uid"] == owner.uid]
    assert sorted(e["message"] for e in posted) == sorted(
        ["replicas 1", *(e.message for e in events)]
    )
    calls = await audited(lambda: [c for c in world.calls() if c.resource == "events"], 6)
    assert [c.code for c in calls] == [201] * 6, "none refused (409 or otherwise)"


async def test_a_refused_event_is_logged_and_the_pass_goes_on(
    world: World, tiny: Model, caplog: pytest.LogCaptureFixture
) -> None:
    """As in a cluster whose operator Role lacks `events/create`: every Event is refused
    (403) by the real RBAC, and the pass still writes its children and its status."""
    without_events = [r.to_dict() for r in rbac.RULES if r.resources != ("events",)]
    assert len(without_events) == len(rbac.RULES) - 1
    world.kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": NO_EVENTS},
            "rules": without_events,
        }
    )
    await asyncio.to_thread(bind, world, NO_EVENTS, "Role", NO_EVENTS)
    token = world.cluster.service_account_token(world.namespace, NO_EVENTS)
    world.create(manifest(tiny, engine={"pin": PIN}))
    async with KubeClient(connection(world, token)) as client:
        reconciler = Reconciler(client, OperatorSettings())
        try:
            with caplog.at_level(logging.WARNING, logger="kubeinfer.operator.kube.apply"):
                outcome = await reconciler.reconcile(world.namespace, "resnet")
        finally:
            await reconciler.close()
    assert outcome.decision is not None and outcome.decision.events
    refused = await audited(
        lambda: [c for c in calls_of(world, NO_EVENTS) if c.resource == "events"],
        len(outcome.decision.events),
    )
    assert [c.code for c in refused] == [403] * len(outcome.decision.events)
    warnings = [r for r in caplog.records if "Event not posted" in r.getMessage()]
    assert len(warnings) == len(outcome.decision.events), "each one logged, none raised"
    assert world.one("apps/v1", "deployments") is not None
    assert (world.infd().get("status") or {}).get("phase"), "the status was written"


async def test_triggers_arriving_together_share_one_pass(world: World, tiny: Model) -> None:
    world.create(manifest(tiny, engine={"pin": PIN}))
    async with KubeClient(connection(world, world.token())) as client:
        reconciler = Reconciler(client, OperatorSettings())
        try:
            outcomes = await asyncio.gather(
                *(reconciler.reconcile(world.namespace, "resnet") for _ in range(10))
            )
        finally:
            await reconciler.close()
    gets = await audited(
        lambda: [c for c in world.calls() if c.verb == "get" and c.resource == IDS[1]], 1
    )
    # not a wait: a second pass's GET would be audited by now
    await asyncio.sleep(0.5)  # a second pass's GET would be written by now
    gets = [c for c in world.calls() if c.verb == "get" and c.resource == IDS[1]]
    assert len(gets) == 1, "one pass for ten triggers"
    assert all(outcome is outcomes[0] for outcome in outcomes)
    assert outcomes[0].writes > 0 and world.children(("apps/v1", "deployments"))


async def test_passes_share_the_slots_and_waiting_passes_join_triggers(
    world: World, tiny: Model
) -> None:
    owners = ("alpha", "bravo", "charlie")
    for owner in owners:
        world.create(manifest(tiny, name=owner, engine={"pin": PIN}))
    settings = OperatorSettings().model_copy(update={"api": {"max_concurrent_passes": 1}})
    async with KubeClient(connection(world, world.token())) as client:
        reconciler = Reconciler(client, settings)
        read, reading_alpha, go_on = client.get, asyncio.Event(), asyncio.Event()

        async def get(resource: Any, namespace: str, name: str) -> Any:
            if name == "alpha":  # alpha's pass holds the slot until charlie's triggers came
                reading_alpha.set()
                await go_on.wait()
            return await read(resource, namespace, name)

        client.get = get  # type: ignore[method-assign]
        try:
            first = [asyncio.ensure_future(reconciler.reconcile(world.namespace, owner))
                     for owner in owners]  # fmt: skip
            await reading_alpha.wait()
            joining = [asyncio.ensure_future(reconciler.reconcile(world.namespace, "charlie"))
                       for _ in range(10)]  # fmt: skip
            # not a wait: one loop turn: charlie's ten triggers join before alpha goes on
            await asyncio.sleep(0)
            go_on.set()
            await asyncio.gather(*first, *joining)
        finally:
            await reconciler.close()

    def owner_of(call: ApiCall) -> str:
        return next(o for o in owners if call.name == o or call.name.startswith((o + "-", o + ".")))

    def named() -> list[ApiCall]:
        return [c for c in world.calls() if c.name]

    await eventually(  # each pass: its GET, its children, its status and its Events
        lambda: (
            {(c.name, c.resource) for c in named() if c.resource == IDS[1] + "/status"}
            >= {(o, IDS[1] + "/status") for o in owners}
        ),
        within=10,
        what="three status writes audited",
    )
    await asyncio.sleep(0.5)  # not a wait: a late request would be audited by now
    order = [owner_of(c) for c in named()]
    runs = [o for i, o in enumerate(order) if i == 0 or order[i - 1] != o]
    assert sorted(runs) == sorted(owners), f"one pass at a time, not interleaved: {order}"
    gets = [c.name for c in named() if c.verb == "get" and c.resource == IDS[1]]
    assert sorted(gets) == sorted(owners), "charlie's ten triggers joined its waiting pass"


async def test_a_pass_reads_its_object_from_the_index_only_when_it_is_fresh_enough(
    world: World, tiny: Model
) -> None:
    world.create(manifest(tiny, engine={"pin": PIN}))
    index: dict[tuple[str, str], list[dict[str, Any]]] = {}
    key = (world.namespace, "resnet")

    async with KubeClient(connection(world, world.token())) as client:
        cache = CachedReader(client)
        cache.attach({OWNERS_INDEX: index})
        reconciler = Reconciler(client, OperatorSettings(), reader=cache)  # no child index:
        # the children are listed from the API
        reads = reconciler.board.activity.owner_reads
        try:
            index[key] = [world.infd()]  # as the watch delivered it
            first = await reconciler.reconcile(*key)
            assert first.writes > 0 and reads == {"cache": 1}, "read from the index"
            await reconciler.reconcile(*key)  # the index still holds the object unwritten
            assert reads == {"cache": 1, "api": 1}, "an index behind its own write: a GET"
            index[key] = [world.infd()]  # the watch delivered the status write
            await reconciler.reconcile(*key)
            assert reads == {"cache": 2, "api": 1}
            stale = index[key][0]
            world.kube.patch(*IDS, "resnet", {"spec": {"runtime": {"replicas": 2}}})
            index[key] = [world.infd()]
            await reconciler.reconcile(*key)  # reads generation 2 (and writes its status)
            index[key] = [stale]  # an index older than the generation a pass read
            await reconciler.reconcile(*key)
            assert reads["api"] == 2, "an index behind a generation already acted on: a GET"
        finally:
            await reconciler.close()
    calls = await audited(
        lambda: [c for c in world.calls() if c.verb == "get" and c.resource == IDS[1]], 2
    )
    assert len(calls) == 2, "the passes' two GETs, and no other"
