"""Which nodes the operator taints for suspect answers and which of its taints it removes
(`reconcile.node_taints`), pure: a suspect node is tainted and marked once, a person's
taint of the same key is never removed, a marked node no longer suspect is untainted only
when every object's status is known, a taint removed by hand from a node still suspect
comes back; the patches keep every other taint and label and are guarded by the node's
resourceVersion."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kubeinfer.operator.reconcile.node_taints import (
    MARK_LABEL,
    TAINT_EFFECT,
    TAINT_KEY,
    TaintPlan,
    plan_taints,
    suspects,
    taint_operations,
    untaint_operations,
)

NOW = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
OURS = {"key": TAINT_KEY, "effect": TAINT_EFFECT, "timeAdded": "2026-12-02T13:00:00Z"}
OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def node(name: str, mark: bool = False, taints: tuple[dict[str, Any], ...] = ()) -> dict:
    labels = {"kubernetes.io/hostname": name, **({MARK_LABEL: "true"} if mark else {})}
    return {"metadata": {"name": name, "resourceVersion": "41", "labels": labels},
            "spec": {"taints": list(taints)}}  # fmt: skip


PLANS = [
    ("a suspect node nobody tainted is tainted", {"n1"}, [], True, TaintPlan(("n1",), ())),
    ("a suspect node already tainted and marked is left as it is",
     {"n1"}, [node("n1", True, (OURS,))], True, TaintPlan()),
    ("a marked node no longer suspect is untainted",
     set(), [node("n1", True, (OURS, OTHER))], True, TaintPlan((), ("n1",))),
    ("without every object's status nothing is untainted",
     set(), [node("n1", True, (OURS,))], False, TaintPlan()),
    ("without every object's status a suspect node is still tainted",
     {"n2"}, [node("n1", True, (OURS,))], False, TaintPlan(("n2",), ())),
    ("a taint removed by hand from a node still suspect comes back",
     {"n1"}, [node("n1", True, (OTHER,))], True, TaintPlan(("n1",), ())),
    ("a node a person tainted with the same key, unmarked, is never untainted",
     set(), [node("n1", False, (OURS,))], True, TaintPlan()),
    ("several nodes are planned in name order",
     {"n3", "n1"}, [node("n2", True, (OURS,))], True, TaintPlan(("n1", "n3"), ("n2",))),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "suspect", "marked", "complete", "expected"), PLANS, ids=[p[0] for p in PLANS]
)
def test_plan(
    case: str, suspect: set[str], marked: list[dict], complete: bool, expected: TaintPlan
) -> None:
    assert plan_taints(suspect, marked, complete) == expected, case


def test_the_suspects_are_every_objects_with_this_operators_last_status_first() -> None:
    stored = {("a", "x"): ["n1"], ("b", "y"): ["n2"], ("c", "z"): []}
    # The operator's own last write for b/y named no node any more; d/w is not watched yet.
    fresh = {("b", "y"): [], ("d", "w"): ["n4"]}
    assert suspects(stored, fresh) == {"n1", "n4"}
    assert suspects({}, {}) == frozenset()


def apply(obj: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `test` and `add` on the paths these patches use."""
    for op in operations:
        parent, key = op["path"].rsplit("/", 1)
        target = obj
        for part in filter(None, parent.split("/")):
            target = target.setdefault(part, {})
        if op["op"] == "test":
            assert target.get(key) == op["value"], op
        else:
            assert op["op"] == "add", op
            target[key] = op["value"]
    return obj


def test_the_taint_patch_keeps_the_other_taints_and_labels_and_tests_the_version() -> None:
    before = node("n1", False, (OTHER,))
    operations = taint_operations(before, NOW)
    assert operations[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    after = apply(node("n1", False, (OTHER,)), operations)
    assert after["spec"]["taints"] == [
        OTHER,
        {"key": TAINT_KEY, "effect": TAINT_EFFECT, "timeAdded": "2026-12-02T14:00:00Z"},
    ]
    assert after["metadata"]["labels"] == {"kubernetes.io/hostname": "n1", MARK_LABEL: "true"}
    # Tainting again replaces the operator's taint, never duplicates it.
    again = apply(after, taint_operations({**after}, NOW))
    assert [t["key"] for t in again["spec"]["taints"]] == ["dedicated", TAINT_KEY]


def test_the_untaint_patch_removes_only_the_operators_taint_and_mark() -> None:
    after = apply(
        node("n1", True, (OTHER, OURS)), untaint_operations(node("n1", True, (OTHER, OURS)))
    )
    assert after["spec"]["taints"] == [OTHER]
    assert after["metadata"]["labels"] == {"kubernetes.io/hostname": "n1"}
    # A node without taints at all (spec.taints absent) comes out with an empty list.
    bare = {"metadata": {"name": "n2", "resourceVersion": "3", "labels": {MARK_LABEL: "true"}},
            "spec": {}}  # fmt: skip
    assert apply(bare, untaint_operations(bare))["spec"]["taints"] == []
