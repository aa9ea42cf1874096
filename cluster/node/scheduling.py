"""Whether a pod fits the one node, as kube-scheduler's filters would say it. Pure.

The node agent is the only node, so it is also the scheduler: a pending pod is bound to it
when its node selector and required node affinity match the node's labels and its
requests fit what the running pods leave of the node's allocatable resources (the
NodeResourcesFit filter: requests, not limits; a pod's request is the larger of its
containers' sum and any one init container's). The reason it does not fit is worded as
the scheduler words it, so `kubectl describe pod` reads as it would on a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def quantity(text: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("500m", "2Gi", "1e3") as a number."""
    match = QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in SUFFIXES:
        raise ValueError(f"not a quantity: {text!r}")
    return Decimal(match.group(1)) * SUFFIXES[match.group(2)]


def _sum(containers: Iterable[Mapping[str, Any]]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for container in containers:
        requests = (container.get("resources") or {}).get("requests") or {}
        limits = (container.get("resources") or {}).get("limits") or {}
        # An extended resource (a GPU) is requested through its limit alone.
        for name, value in {**{k: v for k, v in limits.items() if "/" in k}, **requests}.items():
            total[name] = total.get(name, Decimal(0)) + quantity(value)
    return total


def pod_requests(spec: Mapping[str, Any]) -> dict[str, Decimal]:
    requests = _sum(spec.get("containers") or [])
    for init in spec.get("initContainers") or []:
        for name, value in _sum([init]).items():
            requests[name] = max(requests.get(name, Decimal(0)), value)
    return requests


def _expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels:
        try:
            left, right = int(labels[key]), int(values[0])
        except (ValueError, IndexError):
            return False
        return left > right if operator == "Gt" else left < right
    return False


def _affinity_matches(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(
        all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
        for term in terms
    )


def unschedulable_reason(
    spec: Mapping[str, Any],
    node_labels: Mapping[str, str],
    allocatable: Mapping[str, Decimal],
    running_specs: Iterable[Mapping[str, Any]],
) -> str | None:
    """None when the pod fits; else the scheduler's message for a one-node cluster."""
    selector = spec.get("nodeSelector") or {}
    if any(node_labels.get(k) != v for k, v in selector.items()) or not _affinity_matches(
        spec, node_labels
    ):
        return "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    used: dict[str, Decimal] = {"pods": Decimal(0)}
    for other in running_specs:
        used["pods"] += 1
        for name, value in pod_requests(other).items():
            used[name] = used.get(name, Decimal(0)) + value
    wanted = {**pod_requests(spec), "pods": Decimal(1)}
    short = [
        name for name, value in wanted.items()
        if value > 0 and used.get(name, Decimal(0)) + value > allocatable.get(name, Decimal(0))
    ]  # fmt: skip
    if short:
        # The scheduler's reason for the pod count is "Too many pods"; its reasons are
        # counted per node and listed in sorted order.
        reasons = sorted(
            f"1 {'Too many pods' if name == 'pods' else f'Insufficient {name}'}" for name in short
        )
        return f"0/1 nodes are available: {', '.join(reasons)}."
    return None
