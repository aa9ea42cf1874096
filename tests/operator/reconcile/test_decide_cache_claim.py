"""The engine cache claim's access mode (the decision: warn, do not pin pods): with the
ReadWriteOnce claim the operator creates and more than one runtime pod that may mount it
(replicas, autoscaling's maximum, a shadow candidate), a CacheAttachRisk condition and a
Warning Event say so and what to change; none with one pod, ReadWriteMany, an existing
claim or pods pinned to one node; the observed claim's modes win over the spec's, and
the condition goes when the risk does. Nothing else changes: no affinity is added."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from decide_scenarios import T0, Cluster, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason

RISK = ConditionType.CACHE_ATTACH_RISK


def risk(cluster: Cluster) -> Any:
    return next((c for c in cluster.status.conditions if c.type == RISK), None)


@pytest.mark.parametrize(
    ("sections", "pods"),
    [
        ({"runtime": {"replicas": 2}}, "up to 2 runtime pods mount it"),
        ({"autoscaling": {"enabled": True, "maxReplicas": 4}}, "up to 4 runtime pods"),
        (
            {"rollout": {"strategy": "Shadow"}},
            "up to 2 runtime pods (serving and shadow candidate)",
        ),
    ],
    ids=["replicas", "autoscaling", "shadow"],
)
def test_several_pods_on_a_read_write_once_claim_are_warned_of(
    sections: dict[str, Any], pods: str
) -> None:
    cluster = Cluster(make_spec(**sections))
    decision = cluster.reconcile(T0)
    condition = risk(cluster)
    assert (condition.status, condition.reason) == (
        ConditionStatus.TRUE, Reason.READ_WRITE_ONCE_ACROSS_NODES,
    )  # fmt: skip
    assert "demo-engine-cache is ReadWriteOnce" in condition.message and pods in condition.message
    assert "accessMode ReadWriteMany" in condition.message
    warnings = [e for e in decision.events if e.reason == Reason.READ_WRITE_ONCE_ACROSS_NODES]
    assert [e.type for e in warnings] == ["Warning"]
    # the decision is a warning only: pods are not pinned to the claim's node
    for child in decision.desired:
        template = child.get("spec", {}).get("template", {}).get("spec", {})
        assert "affinity" not in template
    # and it is stable: a second pass changes nothing in the status
    before = cluster.status
    cluster.reconcile(T0 + timedelta(seconds=15))
    assert cluster.status == before


@pytest.mark.parametrize(
    "sections",
    [
        {},  # one replica
        {"runtime": {"replicas": 3}, "engine": {"cache": {"accessMode": "ReadWriteMany"}}},
        {"runtime": {"replicas": 3}, "engine": {"cache": {"existingClaim": "shared.models"}}},
        {"runtime": {"replicas": 3, "nodeSelector": {"kubernetes.io/hostname": "gpu-7"}}},
    ],
    ids=["one-pod", "read-write-many", "existing-claim", "one-node"],
)
def test_no_warning_where_the_claim_can_be_shared(sections: dict[str, Any]) -> None:
    cluster = Cluster(make_spec(**sections))
    cluster.reconcile(T0)
    assert risk(cluster) is None


def test_the_observed_claim_decides_and_the_condition_goes_with_the_risk() -> None:
    cluster = Cluster(make_spec(runtime={"replicas": 2}))
    cluster.reconcile(T0)
    assert risk(cluster) is not None
    # the claim was created ReadWriteMany earlier: access modes are fixed at creation
    (claim,) = [o for (k, _), o in cluster.objects.items() if k == "PersistentVolumeClaim"]
    claim["spec"]["accessModes"] = ["ReadWriteMany"]
    cluster.reconcile(T0 + timedelta(seconds=15))
    assert risk(cluster) is None
    claim["spec"]["accessModes"] = ["ReadWriteOnce"]
    cluster.reconcile(T0 + timedelta(seconds=30))
    assert risk(cluster) is not None
    cluster.update_spec(make_spec(runtime={"replicas": 1}))
    cluster.reconcile(T0 + timedelta(seconds=45))
    assert risk(cluster) is None
