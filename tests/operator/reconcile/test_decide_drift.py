"""Hand-edited children are reverted, and only they: a pass re-applies a child that lost or
changed a field the operator owns (an image, a selector, replicas, a ConfigMap's data, a
label), while what the API server and other managers add (defaults, clusterIP, other
labels, status, empty fields dropped, quantities rewritten canonically) writes nothing;
claims and Jobs are created once and never re-applied."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from decide_scenarios import T0, Cluster, make_spec
from kubeinfer.operator.reconcile.desired import CONFIG_KEY
from kubeinfer.operator.reconcile.drift import carries, quantity_value
from kubeinfer.operator.state import names

LATER = T0 + timedelta(minutes=5)


def ready_cluster() -> Cluster:
    spec = make_spec(runtime={"replicas": 2, "resources": {"cpu": "1500m", "memory": "1024Mi"}})
    cluster = Cluster(spec)
    cluster.build_to_ready()
    assert cluster.reconcile(LATER).apply == ()
    return cluster


def container(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]["containers"][0]


HAND_EDITS: dict[str, tuple[str, str, Callable[[dict[str, Any]], None]]] = {
    "image": ("Deployment", "demo-runtime", lambda d: container(d).update(image="evil:latest")),
    "replicas": ("Deployment", "demo-runtime", lambda d: d["spec"].update(replicas=7)),
    "a removed volume mount": (
        "Deployment", "demo-runtime", lambda d: container(d)["volumeMounts"].pop(),
    ),
    "read-only root off": (
        "Deployment", "demo-runtime",
        lambda d: container(d)["securityContext"].update(readOnlyRootFilesystem=False),
    ),
    "config data": (
        "ConfigMap", "demo-runtime", lambda c: c["data"].update({CONFIG_KEY: "modelName: x\n"}),
    ),
    "service selector": (
        "Service", "demo",
        lambda s: s["spec"]["selector"].update({names.LABEL_ROLE: names.ROLE_CANDIDATE}),
    ),
    "an owned label removed": (
        "Service", "demo", lambda s: s["metadata"]["labels"].pop(names.LABEL_INSTANCE),
    ),
}  # fmt: skip


@pytest.mark.parametrize("edit", HAND_EDITS, ids=str)
def test_a_hand_edited_child_is_reapplied_and_only_it(edit: str) -> None:
    cluster = ready_cluster()
    kind, name, change = HAND_EDITS[edit]
    before = owned(cluster.get(kind, name))
    change(cluster.objects[(kind, name)])
    decision = cluster.reconcile(LATER + timedelta(seconds=15))
    assert [(c["kind"], c["metadata"]["name"]) for c in decision.apply] == [(kind, name)]
    assert owned(cluster.get(kind, name)) == before
    assert cluster.reconcile(LATER + timedelta(seconds=30)).apply == ()


def owned(obj: dict[str, Any]) -> dict[str, Any]:
    """The object less what the (emulated) API server sets: status and generation."""
    obj = copy.deepcopy(obj)
    obj.pop("status", None)
    obj["metadata"].pop("generation", None)
    return obj


def server_side_additions(cluster: Cluster) -> None:
    """What a real API server and other managers leave on stored objects."""
    deployment = cluster.objects[("Deployment", "demo-runtime")]
    deployment["metadata"].update(uid="1234", resourceVersion="99", generation=2)
    deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
    deployment["metadata"]["labels"]["team"] = "vision"  # another manager's label
    deployment["spec"]["progressDeadlineSeconds"] = 600
    pod = deployment["spec"]["template"]["spec"]
    pod.update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
    pod["containers"][0].update(terminationMessagePath="/dev/termination-log")
    pod["containers"][0]["ports"][0]["hostPort"] = 0
    resources = pod["containers"][0]["resources"]
    resources["requests"] = {"cpu": "1500m", "memory": "1Gi"}  # 1024Mi, canonical
    resources["limits"] = {"cpu": "1.5", "memory": "1Gi"}
    pod["volumes"][0]["configMap"]["defaultMode"] = 420
    template = deployment["spec"]["template"]["metadata"]["annotations"]
    template["kubectl.kubernetes.io/restartedAt"] = "2026-01-01T00:00:00Z"
    service = cluster.objects[("Service", "demo")]
    service["spec"].update(clusterIP="10.0.0.7", clusterIPs=["10.0.0.7"], sessionAffinity="None")
    for port in service["spec"]["ports"]:
        port["appProtocol"] = "http"


def test_what_the_api_server_and_others_add_writes_nothing() -> None:
    cluster = ready_cluster()
    server_side_additions(cluster)
    assert cluster.reconcile(LATER + timedelta(seconds=15)).apply == ()


def test_a_quantity_is_the_same_whatever_its_spelling_but_not_another_value() -> None:
    assert quantity_value("1500m") == quantity_value("1.5")
    assert quantity_value("1024Mi") == quantity_value("1Gi")
    assert quantity_value("1e3") == quantity_value("1k") == quantity_value("1E3")
    assert quantity_value("2Gi") != quantity_value("2G")
    assert quantity_value("lots") is None
    desired = {"resources": {"requests": {"cpu": "1500m"}}}
    assert carries({"resources": {"requests": {"cpu": "1.5"}}}, desired)
    assert not carries({"resources": {"requests": {"cpu": "2"}}}, desired)
    # only where Kubernetes keeps quantities: elsewhere a string is a string
    assert not carries({"data": {"cpu": "1.5"}}, {"data": {"cpu": "1500m"}})


def test_an_absent_field_matches_only_an_empty_or_zero_desired_value() -> None:
    assert carries({}, {"env": [], "labels": {}, "readOnly": False, "port": 0, "name": ""})
    assert not carries({}, {"readOnly": True})
    assert not carries({"replicas": True}, {"replicas": 1})
    assert not carries({"args": ["a", "b", "c"]}, {"args": ["a", "b"]})
    # a mapping replaced by a scalar or a list by hand is not carried
    assert not carries({"resources": "none"}, {"resources": {"limits": {}}})
    assert not carries({"resources": []}, {"resources": {}})


def test_claims_and_jobs_are_created_once_and_never_reapplied() -> None:
    cluster = ready_cluster()
    claim = cluster.objects[("PersistentVolumeClaim", names.cache_claim_name("demo"))]
    claim["spec"]["resources"]["requests"]["storage"] = "20Gi"  # resized on the claim
    (job,) = cluster.jobs()
    job["spec"]["template"]["spec"]["containers"][0]["image"] = "edited"
    assert cluster.reconcile(LATER + timedelta(seconds=15)).apply == ()
