"""The operator's RBAC rules: exactly the verbs it uses, kept in one place.

The Helm chart's Role/ClusterRole is rendered from `rules()` (`kubeinfer rbac`), and the
operator scenario tests compare these rules with every API call the operator made
against the emulated API server, in both directions: a verb the operator uses but is not
granted fails the test, and so does a verb granted but never used.

Why each verb: kopf lists and watches the InferenceDeployments and every kind of child
(child events trigger a reconcile), and merge-patches its progress annotations on the
InferenceDeployments; a pass GETs the InferenceDeployment fresh, LISTs its children by
label, server-side applies them (a `patch`, which also creates), patches the status
subresource, posts Events, and deletes build Jobs whose inputs no longer apply. Nothing
is ever created with POST except Events, and nothing else is deleted (ownerReferences
let the garbage collector remove children). Discovery (`/api`, `/apis`) needs no rule.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import yaml
from kubeinfer.operator.kube.resources import (
    CONFIGMAP,
    DEPLOYMENT,
    EVENT,
    INFERENCE_DEPLOYMENT,
    JOB,
    POD,
    PVC,
    SERVICE,
    ResourceType,
)


@dataclass(frozen=True)
class Rule:
    """One PolicyRule: these verbs on these resources of one API group."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiGroups": [self.group],
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


def _rule(resources: tuple[ResourceType, ...], verbs: tuple[str, ...], sub: str = "") -> Rule:
    groups = {r.group for r in resources}
    assert len(groups) == 1, "one API group per rule"
    names = tuple(f"{r.plural}/{sub}" if sub else r.plural for r in resources)
    return Rule(groups.pop(), names, verbs)


RULES: tuple[Rule, ...] = (
    _rule((INFERENCE_DEPLOYMENT,), ("get", "list", "watch", "patch")),
    _rule((INFERENCE_DEPLOYMENT,), ("patch",), sub="status"),
    _rule((PVC, CONFIGMAP, SERVICE), ("list", "watch", "patch")),
    _rule((POD,), ("list", "watch")),
    _rule((EVENT,), ("create",)),
    _rule((DEPLOYMENT,), ("list", "watch", "patch")),
    _rule((JOB,), ("list", "watch", "patch", "delete")),
)

PEERING_RULES: tuple[Rule, ...] = (
    Rule("kopf.dev", ("kopfpeerings",), ("list", "watch", "patch", "get")),
    Rule("kopf.dev", ("clusterkopfpeerings",), ("list", "watch", "patch", "get")),
)
"""Only for `kubeinfer operator --peering NAME` (several replicas, one active): kopf's
peering objects (the kopf.dev CRDs must be installed)."""


def rules(peering: bool = False) -> tuple[Rule, ...]:
    return RULES + (PEERING_RULES if peering else ())


def granted(rule_set: tuple[Rule, ...] = RULES) -> set[tuple[str, str, str]]:
    """Every (verb, group, resource) the rules allow, for comparisons."""
    return {(v, r.group, res) for r in rule_set for res in r.resources for v in r.verbs}


def role_document(
    name: str = "kubeinfer-operator",
    namespace: str | None = None,
    peering: bool = False,
) -> dict[str, Any]:
    """A ClusterRole (no namespace) or a Role in `namespace`."""
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": "kubeinfer"}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role" if namespace else "ClusterRole",
        "metadata": metadata,
        "rules": [rule.to_dict() for rule in rules(peering)],
    }


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "rbac",
        help="print the operator's RBAC Role or ClusterRole",
        description="Prints the Role (with --namespace) or ClusterRole holding exactly the "
        "permissions the operator uses.",
    )
    parser.add_argument("--namespace", help="print a Role in this namespace")
    parser.add_argument("--name", default="kubeinfer-operator", help="the role's name")
    parser.add_argument("--peering", action="store_true", help="add kopf peering rules")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    document = role_document(args.name, args.namespace, args.peering)
    print(yaml.safe_dump(document, sort_keys=False), end="")
    return 0
