"""The operator under exactly the RBAC `kubeinfer up` (and so `make demo`) installs
(`cli.local.install`), on the session's real API server: it keeps running and follows a
`kubectl scale`.

The harness' own grants (`grant_operator_role`) are taken away first: they are generated
from `kubeinfer.operator.rbac` as the chart's are, and would hide a grant the local
install lacks. One did, the nodes' ClusterRole (read for mixed GPU fleets): kopf's watch
of the nodes was refused, and once its retries ran out (about a minute at its default
backoffs) the whole operator stopped, to be restarted by the kubelet after a growing
back-off. A `make demo` run showed it unavailable twice in its first 2.5 minutes; the
demo's last step, `kubectl scale` with autoscaling off, gives it 90 s, and once timed out
with the object's status still at 1/1. Here kopf retries twice in 0.3 s, so the operator
has stopped, if it stops, before the scale.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kopf
import operator_harness
import pytest
from kubeinfer.cli.local import install
from operator_harness import (
    OPERATOR_ACCOUNT,
    Model,
    World,
    eventually,
    manifest,
    revoke_node_role,
    start_operator,
)

PIN = "sha256:" + "a" * 64
"""A pinned engine: the pass goes straight to the runtime children, no build."""
RBAC_API = "rbac.authorization.k8s.io/v1"
RBAC_KINDS = {
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
}


def as_installed(world: World, obj: dict[str, Any]) -> dict[str, Any]:
    """One of the install's RBAC objects for this scenario: cluster-scoped names made the
    scenario's own, namespaced ones moved into its namespace, bound to its account."""
    renamed = f"{obj['metadata']['name']}-{world.namespace}"
    metadata = {**obj["metadata"], "name": renamed}
    if obj["kind"].startswith("Cluster"):
        metadata.pop("namespace", None)
    else:
        metadata["namespace"] = world.namespace
    moved = {**obj, "metadata": metadata}
    if "roleRef" in obj:
        moved["roleRef"] = {**obj["roleRef"], "name": f"{obj['roleRef']['name']}-{world.namespace}"}
        moved["subjects"] = [
            {"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT, "namespace": world.namespace}
        ]
    return moved


@pytest.fixture
def operator_may_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf SIGKILLs its thread, here the test's, 2 s after an operator stopped by itself
    (`process.ultimate_exiting_timeout` in the harness' kopf settings): not here, where
    the operator stopping is the failure to report."""
    harness_settings = operator_harness.kopf_settings

    def kopf_settings() -> kopf.OperatorSettings:
        settings = harness_settings()
        settings.process.ultimate_exiting_timeout = None
        return settings

    monkeypatch.setattr(operator_harness, "kopf_settings", kopf_settings)


@contextmanager
def granted_as_kubeinfer_up_does(world: World) -> Iterator[None]:
    """The operator's account bound to what `kubeinfer up` installs, and to nothing else,
    for the block: the harness' Role binding and nodes' ClusterRole are taken away."""
    revoke_node_role(world)
    for role in (OPERATOR_ACCOUNT, f"{OPERATOR_ACCOUNT}-lease"):  # bindings named as roles
        world.kube.delete(RBAC_API, "rolebindings", role)
    made = [
        as_installed(world, obj)
        for obj in install.operator_objects(None)
        if obj["kind"] in RBAC_KINDS
    ]
    assert install.OPERATOR_ACCOUNT == OPERATOR_ACCOUNT
    try:
        for obj in made:
            world.kube.create(obj)
        yield
    finally:
        for obj in made:
            namespace = obj["metadata"].get("namespace")
            plural = RBAC_KINDS[obj["kind"]]
            world.kube.delete(RBAC_API, plural, obj["metadata"]["name"], namespace=namespace)


def refused(world: World) -> list[tuple[str, str]]:
    """What the API server refused the operator (403), as (verb, resource)."""
    return sorted({(c.verb, c.resource) for c in world.calls() if c.code == 403})


async def test_the_operator_keeps_running_under_the_rbac_kubeinfer_up_installs(
    world: World, tiny: Model, operator_may_stop: None
) -> None:
    with granted_as_kubeinfer_up_does(world):
        async with start_operator(world):
            world.create(manifest(tiny, engine={"pin": PIN}))
            await eventually(
                lambda: (world.infd().get("status") or {}).get("replicas") == 1,
                what="the first pass' status",
            )
            await asyncio.to_thread(world.kube.kubectl, "scale", "infd/resnet", "--replicas=2")
            try:
                await eventually(
                    lambda: world.infd()["status"]["replicas"] == 2,
                    what="status.replicas 2 after kubectl scale",
                )
            except AssertionError as stuck:
                raise AssertionError(f"{stuck}; refused: {refused(world)}") from None
    assert refused(world) == []
