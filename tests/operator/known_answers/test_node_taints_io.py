"""The suspect nodes' taints applied (`kube.node_taints`) over an in-memory stand-in for
the API server's nodes, which applies the JSON patches it gets (a stale resourceVersion
refused with 422, as the server refuses a failed `test`): the suspect nodes end tainted
and marked, a node no longer suspect ends untainted, another's taint stays; an unchanged
set of suspects within the interval reads nothing; a refused write is tried again at the
next sync; a node changed under a write is read again and written; a node that is
gone is skipped."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from kubeinfer.operator.kube.client import ApiError
from kubeinfer.operator.kube.node_taints import SuspectNodeTaints
from kubeinfer.operator.reconcile.node_taints import MARK_LABEL, TAINT_KEY

NOW = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


class Nodes:
    """Nodes by name; `list` by one label's existence, `json_patch` with `test` and `add`."""

    def __init__(self, *names: str) -> None:
        self.nodes = {
            n: {"metadata": {"name": n, "resourceVersion": "1", "labels": {}},
                "spec": {"taints": [OTHER]}}
            for n in names
        }  # fmt: skip
        self.reads = 0
        self.refuse: set[str] = set()

    async def list(self, resource: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.reads += 1
        return [
            copy.deepcopy(n) for n in self.nodes.values() if selector in n["metadata"]["labels"]
        ]

    async def get(self, resource: Any, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.nodes.get(name))

    async def json_patch(self, resource: Any, namespace: str, name: str, operations: list,
                         *, subresource: str | None = None) -> dict[str, Any]:  # fmt: skip
        if name in self.refuse:
            raise ApiError(403, "Forbidden", "nodes is forbidden")
        node = self.nodes.get(name)
        if node is None:
            raise ApiError(404, "NotFound", name)
        updated = copy.deepcopy(node)
        for op in operations:
            parent, key = op["path"].rsplit("/", 1)
            target = updated
            for part in filter(None, parent.split("/")):
                target = target[part]
            if op["op"] == "test":
                if target.get(key) != op["value"]:
                    raise ApiError(422, "Invalid", "test failed")
            else:
                target[key] = op["value"]
        updated["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
        self.nodes[name] = updated
        return updated

    def ours(self, name: str) -> bool:
        node = self.nodes[name]
        keys = [t["key"] for t in node["spec"]["taints"]]
        assert "dedicated" in keys, "another's taint is kept"
        return TAINT_KEY in keys and node["metadata"]["labels"].get(MARK_LABEL) == "true"


async def test_the_suspect_nodes_end_tainted_and_the_others_untainted() -> None:
    api = Nodes("n1", "n2", "n3")
    clock = [0.0]
    taints = SuspectNodeTaints(api, 60, lambda: clock[0])  # type: ignore[arg-type]
    assert await taints.sync(frozenset({"n1", "n2", "gone"}), True, NOW) == 2
    assert [api.ours(n) for n in ("n1", "n2", "n3")] == [True, True, False]
    reads = api.reads
    assert await taints.sync(frozenset({"n1", "n2", "gone"}), True, NOW) == 0
    assert api.reads == reads, "nothing changed within the interval: nothing read"
    # n2 named no more: untainted at once; without every status known, nothing is removed.
    assert await taints.sync(frozenset({"n1"}), False, NOW) == 0
    assert api.ours("n2")
    assert await taints.sync(frozenset({"n1"}), True, NOW) == 1
    assert [api.ours(n) for n in ("n1", "n2")] == [True, False]
    # Someone removed the taint from n1 by hand: put back after the interval.
    api.nodes["n1"]["spec"]["taints"] = [OTHER]
    clock[0] = 61.0
    assert await taints.sync(frozenset({"n1"}), True, NOW) == 1
    assert api.ours("n1")


async def test_a_refused_write_is_tried_again_at_the_next_sync() -> None:
    api = Nodes("n1")
    api.refuse.add("n1")
    taints = SuspectNodeTaints(api, 60, lambda: 0.0)  # type: ignore[arg-type]
    assert await taints.sync(frozenset({"n1"}), True, NOW) == 0
    assert not api.ours("n1")
    api.refuse.clear()
    assert await taints.sync(frozenset({"n1"}), True, NOW) == 1, "not waiting for the interval"
    assert api.ours("n1")


async def test_a_node_changed_under_the_write_is_read_again_and_written() -> None:
    api = Nodes("n1")
    taints = SuspectNodeTaints(api, 60, lambda: 0.0)  # type: ignore[arg-type]
    listed = api.list

    async def stale(resource: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
        found = await listed(resource, namespace, selector)
        api.nodes["n1"]["metadata"]["resourceVersion"] = "9"  # the node controller wrote it
        return found

    assert await taints.sync(frozenset({"n1"}), True, NOW) == 1
    api.list = stale  # type: ignore[method-assign]
    assert await taints.sync(frozenset(), True, NOW) == 1, "written on a fresh read"
    assert not api.ours("n1")


async def test_the_reconciler_taints_the_nodes_any_object_names_its_own_last_status_first() -> None:
    """The controller's union: the watch's copies of every object, this operator's last
    status of each over them (fresher), a deleted object's nodes not counted."""
    from kubeinfer.operator.api.v1alpha1.status import InferenceDeploymentStatus
    from kubeinfer.operator.controller import Reconciler
    from kubeinfer.operator.kube.cache import OWNERS_INDEX, CachedReader
    from kubeinfer.operator.settings import OperatorSettings
    from kubeinfer.operator.telemetry.exporter import Report

    def body(namespace: str, name: str, nodes: list[str], deleting: bool = False) -> dict:
        meta = {"namespace": namespace, "name": name}
        if deleting:
            meta["deletionTimestamp"] = "2026-12-02T13:59:00Z"
        return {"metadata": meta, "status": {"suspectNodes": nodes}}

    api = Nodes("n1", "n2", "n3", "n4")
    api.nodes["n4"]["metadata"]["labels"][MARK_LABEL] = "true"  # tainted by an earlier pass
    api.nodes["n4"]["spec"]["taints"].append({"key": TAINT_KEY, "effect": "NoSchedule"})
    reader = CachedReader(api)  # type: ignore[arg-type]
    owners = {
        ("a", "x"): [body("a", "x", ["n1"])],
        ("b", "y"): [body("b", "y", ["n2"])],
        ("c", "z"): [body("c", "z", ["n3"], deleting=True)],
    }
    reader.attach({OWNERS_INDEX: owners})
    settings = OperatorSettings.model_validate({"known_answers": {"taint_suspect_nodes": True}})
    reconciler = Reconciler(api, settings, reader=reader)  # type: ignore[arg-type]
    reconciler.board.record(("b", "y"), Report(InferenceDeploymentStatus(suspect_nodes=[])))
    try:
        await reconciler._sync_taints()
    finally:
        await reconciler.close()
    assert [api.ours(n) for n in ("n1", "n2", "n3", "n4")] == [True, False, False, False]
