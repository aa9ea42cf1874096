"""Which nodes to taint because the known-answer checks named them suspect, and which of
the operator's taints to remove. Pure.

A node is suspect where pods of more than one engine of one InferenceDeployment answered
wrong (`reconcile.known_answers.suspect_nodes`): the node (its device, its CPU), not an
engine, is the likely cause. With the operator's setting `known_answers.taint_suspect_nodes`
a node that any InferenceDeployment's status names is tainted
`kubeinfer.io/suspect-answers:NoSchedule`: nothing new is scheduled there, and what runs
there keeps running (the wrong pods are already out of serving, kept as evidence). The
operator marks each node it tainted with the label of the same key, so it removes only
its own taints (not one a person set by hand), and finds them with one labelled list.

A taint is removed only once no InferenceDeployment names the node, which needs every
object's status: `complete` is False where the operator cannot see them all (no watch
index yet), and then nothing is removed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubeinfer.operator.state import names

TAINT_KEY = names.TAINT_SUSPECT_ANSWERS
TAINT_EFFECT = "NoSchedule"
MARK_LABEL = TAINT_KEY
"""The label on each node the operator tainted: its own taints, found by a label selector."""
MARK_VALUE = "true"

Node = Mapping[str, Any]
Key = tuple[str, str]
"""(namespace, name) of an InferenceDeployment."""


@dataclass(frozen=True)
class TaintPlan:
    """Nodes to taint (and mark), and marked nodes to untaint (and unmark), by name."""

    taint: tuple[str, ...] = ()
    untaint: tuple[str, ...] = ()


def suspects(
    stored: Mapping[Key, Iterable[str]], fresh: Mapping[Key, Iterable[str]]
) -> frozenset[str]:
    """Every node some InferenceDeployment names suspect: its status as this operator last
    wrote it (`fresh`) where there is one, else as stored (`stored`: the watch's copies).
    An object only in `fresh` counts too (the watch has not delivered it yet)."""
    merged = {**stored, **fresh}
    return frozenset(node for nodes in merged.values() for node in nodes if node)


def _name(node: Node) -> str:
    return str((node.get("metadata") or {}).get("name") or "")


def tainted(node: Node) -> bool:
    """Whether the node carries the operator's taint (key and effect)."""
    return any(
        t.get("key") == TAINT_KEY and t.get("effect") == TAINT_EFFECT
        for t in (node.get("spec") or {}).get("taints") or []
    )


def marked(node: Node) -> bool:
    return ((node.get("metadata") or {}).get("labels") or {}).get(MARK_LABEL) == MARK_VALUE


def plan_taints(suspect: Iterable[str], marked_nodes: Iterable[Node], complete: bool) -> TaintPlan:
    """Taint each suspect node that is not marked or lost its taint (removed by hand while
    it is still suspect: it is tainted again, as a cordon would be kept); untaint each
    marked node no longer suspect, only when the statuses are `complete`."""
    wanted = set(suspect)
    ours = {_name(node): node for node in marked_nodes if marked(node)}
    taint = sorted(n for n in wanted if n not in ours or not tainted(ours[n]))
    untaint = sorted(n for n in ours if n not in wanted) if complete else []
    return TaintPlan(tuple(taint), tuple(untaint))


def _guarded(node: Node) -> list[dict[str, Any]]:
    """A test of the node's resourceVersion: taints are a list the kubelet and the node
    lifecycle controller also write, replaced whole (it has no merge key), so a write
    over a newer node fails (409/422) and is tried again on fresh reads."""
    version = (node.get("metadata") or {}).get("resourceVersion")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]


def taint_operations(node: Node, now: datetime) -> list[dict[str, Any]]:
    """The JSON patch that adds the taint (keeping every other) and the mark."""
    others = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != TAINT_KEY]
    ours = {
        "key": TAINT_KEY,
        "effect": TAINT_EFFECT,
        "timeAdded": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    labels = {**((node.get("metadata") or {}).get("labels") or {}), MARK_LABEL: MARK_VALUE}
    return [
        *_guarded(node),
        {"op": "add", "path": "/spec/taints", "value": [*others, ours]},
        {"op": "add", "path": "/metadata/labels", "value": labels},
    ]


def untaint_operations(node: Node) -> list[dict[str, Any]]:
    """The JSON patch that removes the operator's taint (every other kept) and its mark."""
    others = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != TAINT_KEY]
    labels = dict((node.get("metadata") or {}).get("labels") or {})
    labels.pop(MARK_LABEL, None)
    return [
        *_guarded(node),
        {"op": "add", "path": "/spec/taints", "value": others},
        {"op": "add", "path": "/metadata/labels", "value": labels},
    ]
