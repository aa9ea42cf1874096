"""A verb missing from the operator's Role shows in the object's status, not only in the
operator's log: on the real API server with RBAC on, the operator's ServiceAccount is bound
to the generated Role less `create` on Jobs (what a stale chart would install); the build
Job cannot be created, and the InferenceDeployment says so (Degraded and Ready False with
reason Forbidden and the API server's own words, and a Warning Event). Once the Role is
whole again, the next pass builds and the condition clears."""

from __future__ import annotations

import pytest
from kubeinfer.operator import rbac
from operator_harness import (
    OPERATOR_ACCOUNT,
    ROLE_TAKEN_AWAY,
    Model,
    World,
    condition,
    eventually,
    manifest,
    start_operator,
)

pytestmark = pytest.mark.slow


def role_without(verb: str, plural: str, namespace: str) -> dict:
    role = rbac.role_document(OPERATOR_ACCOUNT, namespace)
    for rule in role["rules"]:
        if plural in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    return role


async def test_a_verb_the_role_lacks_is_reported_in_the_status(world: World, tiny: Model) -> None:
    kube = world.kube
    ROLE_TAKEN_AWAY.add(world.namespace)
    kube.request(
        "PUT",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{world.namespace}/roles/{OPERATOR_ACCOUNT}",
        body=role_without("create", "jobs", world.namespace),
    )
    async with start_operator(world):
        world.create(manifest(tiny))
        await eventually(
            lambda: (condition(world.infd(), "Degraded") or {}).get("reason") == "Forbidden",
            60,
            "Degraded with reason Forbidden",
        )
        degraded = condition(world.infd(), "Degraded")
        assert degraded["status"] == "True"
        assert 'cannot create resource "jobs"' in degraded["message"], degraded["message"]
        assert condition(world.infd(), "Ready")["reason"] == "Forbidden"
        # The pass posts its Events after the status write the condition above came from.
        warnings = await eventually(
            lambda: [e for e in world.events() if e["reason"] == "Forbidden"],
            30,
            "the Forbidden Event",
        )
        assert warnings[0]["type"] == "Warning"

        kube.request(
            "PUT",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{world.namespace}/"
            f"roles/{OPERATOR_ACCOUNT}",
            body=rbac.role_document(OPERATOR_ACCOUNT, world.namespace),
        )
        await eventually(world.jobs, 60, "the build Job once the Role is whole")
        await eventually(
            lambda: (condition(world.infd(), "Degraded") or {}).get("reason") != "Forbidden",
            60,
            "the Forbidden condition to clear",
        )
