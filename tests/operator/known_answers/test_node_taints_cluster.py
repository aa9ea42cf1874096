"""The suspect nodes' taint on the real API server (`kube.node_taints`), logged in as a
ServiceAccount holding only the nodes' read ClusterRole and the taint ClusterRole that
`kubeinfer rbac --taint-suspect-nodes` prints (`patch` on nodes, nothing more):

- a suspect node ends with the operator's taint and mark, every other taint and label it
  had kept (the API server's own `node.kubernetes.io/not-ready` among them: the node is a
  Node object with no kubelet behind it, so nothing is ever scheduled there);
- once no object names it, the operator's taint and mark are gone, the others stay;
- an account without the taint ClusterRole changes nothing (the server's 403, logged);
- the account's calls were reads and patches of nodes only.

Its own namespace and account (not the scenarios' `kubeinfer-operator`): the scenarios'
RBAC comparison (`test_rbac_used_exactly`) covers the operator without the setting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from cluster_harness import LocalCluster
from kubeinfer.operator import rbac
from kubeinfer.operator.kube.client import KubeClient
from kubeinfer.operator.kube.node_taints import SuspectNodeTaints
from kubeinfer.operator.reconcile.node_taints import MARK_LABEL, TAINT_EFFECT, TAINT_KEY

NOW = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
ACCOUNT = "answers-taints"
RBAC = "rbac.authorization.k8s.io"


def bind(admin: Any, name: str, namespace: str, account: str, document: dict) -> None:
    admin.create({**document, "metadata": {**document["metadata"], "name": name}})
    admin.create({
        "apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    })  # fmt: skip


@pytest.fixture
def place(local_cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    """A namespace with the account (bound to both ClusterRoles) and a Node object; all
    removed after."""
    namespace = local_cluster.new_namespace("node-taints")
    admin, node = local_cluster.admin(namespace), f"suspect-{namespace}"
    admin.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}})
    admin.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}})
    roles = [(f"{namespace}-nodes", ACCOUNT, rbac.node_role_document()),
             (f"{namespace}-taints", ACCOUNT, rbac.node_taint_role_document()),
             (f"{namespace}-reader", "reader", rbac.node_role_document())]  # fmt: skip
    for name, account, document in roles:
        bind(admin, name, namespace, account, document)
    admin.create({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {"example.com/pool": "gpu"}},
        "spec": {"unschedulable": True, "taints": [OTHER]},
    })  # fmt: skip
    try:
        yield namespace, node
    finally:
        cluster = local_cluster.admin()
        cluster.delete("v1", "nodes", node, namespace=None)
        for name, _, _ in roles:
            for plural in ("clusterrolebindings", "clusterroles"):
                cluster.delete(f"{RBAC}/v1", plural, name, namespace=None)
        cluster.delete("v1", "namespaces", namespace, namespace=None)


def client_as(cluster: LocalCluster, namespace: str, account: str) -> KubeClient:
    token = cluster.service_account_token(namespace, account)
    return KubeClient(kopf.ConnectionInfo(server=cluster.server, ca_path=str(cluster.ca_file),
                                          token=token, default_namespace=namespace))  # fmt: skip


@pytest.mark.slow
async def test_a_suspect_node_is_tainted_then_untainted_keeping_the_rest(
    local_cluster: LocalCluster, place: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    namespace, name = place
    admin = local_cluster.admin()

    def node() -> dict[str, Any]:
        found = admin.get("v1", "nodes", name, namespace=None)
        assert found is not None
        return found

    def ours(found: dict[str, Any]) -> bool:
        return any(t["key"] == TAINT_KEY and t["effect"] == TAINT_EFFECT
                   for t in found["spec"].get("taints") or [])  # fmt: skip

    # The account that may only read: refused, nothing changed, the refusal logged.
    reader = client_as(local_cluster, namespace, "reader")
    async with reader:
        with caplog.at_level(logging.WARNING, logger="kubeinfer.operator.kube.node_taints"):
            written = await SuspectNodeTaints(reader, 60).sync(frozenset({name}), True, NOW)
    assert written == 0 and not ours(await asyncio.to_thread(node))
    assert any("Node not tainted" in r.message and "403" in r.message for r in caplog.records)

    client = client_as(local_cluster, namespace, ACCOUNT)
    async with client:
        taints = SuspectNodeTaints(client, 0)  # every sync reads afresh
        assert await taints.sync(frozenset({name}), True, NOW) == 1
        tainted = await asyncio.to_thread(node)
        assert ours(tainted)
        assert OTHER in tainted["spec"]["taints"]
        assert tainted["metadata"]["labels"][MARK_LABEL] == "true"
        assert tainted["metadata"]["labels"]["example.com/pool"] == "gpu"
        assert await taints.sync(frozenset({name}), True, NOW) == 0, "already as decided"
        assert await taints.sync(frozenset(), True, NOW) == 1
    cleared = await asyncio.to_thread(node)
    assert not ours(cleared) and OTHER in cleared["spec"]["taints"]
    assert MARK_LABEL not in cleared["metadata"]["labels"]
    assert cleared["metadata"]["labels"]["example.com/pool"] == "gpu"
    assert cleared["spec"]["unschedulable"] is True

    user = f"system:serviceaccount:{namespace}:{ACCOUNT}"
    calls = local_cluster.audit.calls(lambda c: c.user == user and bool(c.resource))
    assert calls and {(c.verb, c.resource) for c in calls} <= {
        ("list", "nodes"),
        ("get", "nodes"),
        ("patch", "nodes"),
    }
