"""The operator's Role grants exactly what it uses, and it writes nothing on an
InferenceDeployment but its status.

Every operator scenario of the session ran under a ServiceAccount bound to the Role that
`kubeinfer rbac` generates (with leader election's Lease rules), on the real API server
with RBAC on. From the API server's audit log: no request of the operator was refused
with 403 (a verb the Role lacks); the (verb, group, resource) pairs it used are exactly
those the rules grant (no rule nobody needs; a server-side apply that creates an object, 201,
uses `create` as well as `patch`); and it wrote nothing on an InferenceDeployment but
its status subresource: neither the spec nor the metadata, which GitOps tools own (kopf,
with no create or update handler, keeps no annotations there). This module's name sorts
after every operator scenario's, so pytest runs it last.
"""

from __future__ import annotations

import pytest
from cluster_harness import ApiCall, LocalCluster
from kubeinfer.operator import rbac
from operator_harness import OPERATOR_ACCOUNT, ROLE_TAKEN_AWAY, SCENARIOS_RUN

NEEDED = [
    "test_create_builds_the_engine_then_deploys_and_reports_ready",
    "test_input_change_mid_build_deletes_the_stale_job",
    "test_deleted_children_are_recreated",
    "test_where_the_cluster_serves_pod_monitors_one_scrapes_the_serving_pods",
    "test_the_manual_gate_acts_only_on_the_digest_it_names",
    "test_a_leader_whose_lease_is_taken_stops_requeues_included",
    "test_a_replica_that_goes_wrong_is_taken_out_and_replaced",
    "test_idle_goes_to_zero_and_100_first_requests_are_all_answered",
]
"""Scenarios whose calls together use every rule."""


def operator_calls(cluster: LocalCluster) -> list[ApiCall]:
    """The operator's requests for resources (discovery, which every authenticated user
    may read, names none), in every namespace whose Role was left whole."""
    return cluster.audit.calls(
        lambda c: (
            c.user.startswith("system:serviceaccount:")
            and c.user.endswith(f":{OPERATOR_ACCOUNT}")
            and c.user.split(":")[2] not in ROLE_TAKEN_AWAY
            and bool(c.resource)
        )
    )


def test_the_operator_was_refused_nothing_and_wrote_nothing_but_the_status(
    local_cluster: LocalCluster,
) -> None:
    calls = operator_calls(local_cluster)
    if not calls:
        pytest.skip("no operator scenario ran in this session")
    refused = sorted({f"{c.verb} {c.group}/{c.resource}" for c in calls if c.code == 403})
    assert refused == [], "the API server refused the operator verbs its Role lacks"
    owner_writes = [
        (c.verb, c.body)
        for c in calls
        if c.resource == "inferencedeployments" and c.verb in ("patch", "update", "delete")
    ]
    assert owner_writes == [], "the operator wrote on the InferenceDeployment, not its status"
    status_writes = [c for c in calls if c.resource == "inferencedeployments/status"]
    assert status_writes, "the scenarios' statuses were written"


def test_the_rules_grant_exactly_the_calls_the_operator_made(
    local_cluster: LocalCluster,
) -> None:
    missing = [name for name in NEEDED if name not in SCENARIOS_RUN]
    if missing:
        pytest.skip(f"needs the scenarios that use every rule to run first: {missing}")
    used = set()
    for call in operator_calls(local_cluster):
        if call.code < 400 or call.code in (404, 409):
            used.add((call.verb, call.group, call.resource))
            if call.verb == "patch" and call.code == 201:  # an apply that created the object
                used.add(("create", call.group, call.resource))
    granted = rbac.granted((*rbac.RULES, *rbac.NODE_RULES, *rbac.lease_rules()))
    assert used - granted == set(), "the operator used verbs its Role does not grant"
    assert granted - used == set(), "the Role grants verbs the operator never used"
