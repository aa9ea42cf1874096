"""The operator's RBAC rules: exactly the verbs it uses, kept in one place.

The Helm chart's `templates/rbac.yaml` is generated from these rules (`kubeinfer rbac
--helm`; a test fails when it drifts), `kubeinfer rbac` prints a Role or ClusterRole, and the
operator scenario tests compare these rules with every API call the operator made
against the emulated API server, in both directions: a verb the operator uses but is not
granted fails the test, and so does a verb granted but never used.

Why each verb: kopf lists and watches the InferenceDeployments and every kind of child
(their events trigger a reconcile), and writes nothing on either; a pass GETs the
InferenceDeployment fresh when the watch's copy is older than what it knows, LISTs its
children by label, server-side applies them (a `patch`, which also creates), patches the
status subresource, posts Events, deletes build Jobs whose inputs no longer apply, and
deletes a shadow candidate's Deployment, ConfigMap and Service once it is promoted,
failed or aborted. A serving pod is patched in two ways only, by the known-answer
checks: its status, for its readiness gate (`kubeinfer.io/answers-correct`), and, when
it answered wrong, its labels, annotations and ownerReferences, to take it out of its
ReplicaSet and Service. Nothing is ever created with POST except Events, and nothing else is deleted
(ownerReferences let the garbage collector remove children). Pods are listed also to
read the serving pods' /metrics directly when no Prometheus is configured. Discovery
(`/api`, `/apis`) needs no rule.

Nodes are read for mixed GPU fleets (`kube.nodes`: which GPU products the cluster has):
list and watch, nothing else, granted by a ClusterRole of their own (`node_rules`), since
nodes belong to no namespace; `kubeinfer rbac` prints it beside the Role or ClusterRole
above, and the chart binds it in both of its modes. Patching nodes (the suspect nodes'
taint, `kubeinfer.io/suspect-answers`) is granted apart, by `NODE_TAINT_RULES`, and only
where the setting `known_answers.taint_suspect_nodes` asks for it.

With `--leader-election`, a second Role in the operator's own namespace lets it create
its Lease and get and update (renew, release) that one Lease by name (`lease_rules`); the
leader election scenario's calls are part of the comparison.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.kube.resources import (
    CONFIGMAP,
    DEPLOYMENT,
    ENDPOINT_SLICE,
    ENDPOINTS,
    EVENT,
    INFERENCE_DEPLOYMENT,
    JOB,
    LEASE,
    NODE,
    PDB,
    POD,
    POD_MONITOR,
    PVC,
    SERVICE,
    ResourceType,
)


@dataclass(frozen=True)
class Rule:
    """One PolicyRule: these verbs on these resources of one API group (only the objects
    named in `names`, when there are any)."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    names: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        rule: dict[str, Any] = {
            "apiGroups": [self.group],
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }
        if self.names:
            rule["resourceNames"] = list(self.names)
        return rule


def _rule(resources: tuple[ResourceType, ...], verbs: tuple[str, ...], sub: str = "") -> Rule:
    groups = {r.group for r in resources}
    assert len(groups) == 1, "one API group per rule"
    names = tuple(f"{r.plural}/{sub}" if sub else r.plural for r in resources)
    return Rule(groups.pop(), names, verbs)


# Children are written by server-side apply: a PATCH, which the API server also
# authorizes as `create` when the object does not exist yet.
RULES: tuple[Rule, ...] = (
    _rule((INFERENCE_DEPLOYMENT,), ("get", "list", "watch")),
    _rule((INFERENCE_DEPLOYMENT,), ("patch",), sub="status"),
    _rule((PVC,), ("list", "watch", "create", "patch")),
    _rule((CONFIGMAP, SERVICE), ("list", "watch", "create", "patch", "delete")),
    _rule((POD,), ("list", "watch", "patch")),
    _rule((POD,), ("patch",), sub="status"),
    _rule((EVENT,), ("create",)),
    _rule((DEPLOYMENT,), ("list", "watch", "create", "patch", "delete")),
    _rule((JOB,), ("list", "watch", "create", "patch", "delete")),
    _rule((PDB,), ("list", "watch", "create", "patch")),
    # An object at zero pods: its Service's endpoints are the activator's (desired_activator).
    _rule((ENDPOINT_SLICE,), ("list", "watch", "create", "patch", "delete")),
    _rule((ENDPOINTS,), ("delete",)),
    _rule((POD_MONITOR,), ("list", "create", "patch")),
)

NODE_RULES: tuple[Rule, ...] = (_rule((NODE,), ("get", "list", "watch")),)
"""The cluster-scoped reads: the GPU nodes, for mixed GPU fleets, and the node of each
serving pod, for the hardware its known answers are compared on."""

NODE_TAINT_RULES: tuple[Rule, ...] = (_rule((NODE,), ("patch",)),)
"""Only with the setting `known_answers.taint_suspect_nodes`: the suspect nodes' taint
(`kubeinfer.io/suspect-answers`) and its mark label, added and removed. A ClusterRole of
its own, granted only where the setting asks (`kubeinfer rbac --taint-suspect-nodes`, the
chart's `settings.knownAnswers.taintSuspectNodes`)."""

DEFAULT_LEASE_NAME = "kubeinfer-operator"


def lease_rules(lease_name: str = DEFAULT_LEASE_NAME) -> tuple[Rule, ...]:
    """Leader election's: create the Lease (a create cannot be limited by name), then get
    and update only that one."""
    return (
        Rule(LEASE.group, (LEASE.plural,), ("create",)),
        Rule(LEASE.group, (LEASE.plural,), ("get", "update"), (lease_name,)),
    )


def granted(rule_set: tuple[Rule, ...] = RULES) -> set[tuple[str, str, str]]:
    """Every (verb, group, resource) the rules allow, for comparisons."""
    return {(v, r.group, res) for r in rule_set for res in r.resources for v in r.verbs}


def _metadata(name: str, namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": "kubeinfer"}}
    if namespace:
        metadata["namespace"] = namespace
    return metadata


def role_document(name: str = "kubeinfer-operator", namespace: str | None = None) -> dict[str, Any]:
    """A ClusterRole (no namespace) or a Role in `namespace`."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role" if namespace else "ClusterRole",
        "metadata": _metadata(name, namespace),
        "rules": [rule.to_dict() for rule in RULES],
    }


def node_role_document(name: str = "kubeinfer-operator-nodes") -> dict[str, Any]:
    """The ClusterRole that lets the operator read the nodes."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _metadata(name, None),
        "rules": [rule.to_dict() for rule in NODE_RULES],
    }


def node_taint_role_document(name: str = "kubeinfer-operator-node-taints") -> dict[str, Any]:
    """The ClusterRole that lets the operator taint suspect nodes (and untaint them)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _metadata(name, None),
        "rules": [rule.to_dict() for rule in NODE_TAINT_RULES],
    }


def lease_role_document(name: str, namespace: str, lease_name: str) -> dict[str, Any]:
    """The Role for leader election's Lease, in the operator's own namespace."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(name, namespace),
        "rules": [rule.to_dict() for rule in lease_rules(lease_name)],
    }


HELM_TEMPLATE = """\
{{{{- /* Generated by `kubeinfer rbac --helm` from kubeinfer.operator.rbac: do not edit. */}}}}
{{{{- define "kubeinfer.rbacLabels" }}}}
  labels:
    app.kubernetes.io/name: kubeinfer
    app.kubernetes.io/instance: {{{{ .Release.Name }}}}
    app.kubernetes.io/managed-by: {{{{ .Release.Service }}}}
{{{{- end }}}}
{{{{- if .Values.watchNamespaces }}}}
{{{{- range .Values.watchNamespaces }}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{{{ $.Release.Name }}}}-operator
  namespace: {{{{ . }}}}
{{{{- include "kubeinfer.rbacLabels" $ }}}}
rules:
{rules}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{{{ $.Release.Name }}}}-operator
  namespace: {{{{ . }}}}
{{{{- include "kubeinfer.rbacLabels" $ }}}}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{{{ $.Release.Name }}}}-operator
subjects:
  - kind: ServiceAccount
    name: {{{{ $.Release.Name }}}}-operator
    namespace: {{{{ $.Release.Namespace }}}}
{{{{- end }}}}
{{{{- else }}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{{{ .Release.Name }}}}-operator
{{{{- include "kubeinfer.rbacLabels" . }}}}
rules:
{rules}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{{{ .Release.Name }}}}-operator
{{{{- include "kubeinfer.rbacLabels" . }}}}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{{{ .Release.Name }}}}-operator
subjects:
  - kind: ServiceAccount
    name: {{{{ .Release.Name }}}}-operator
    namespace: {{{{ .Release.Namespace }}}}
{{{{- end }}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{{{ .Release.Name }}}}-operator-nodes
{{{{- include "kubeinfer.rbacLabels" . }}}}
rules:
{node_rules}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{{{ .Release.Name }}}}-operator-nodes
{{{{- include "kubeinfer.rbacLabels" . }}}}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{{{ .Release.Name }}}}-operator-nodes
subjects:
  - kind: ServiceAccount
    name: {{{{ .Release.Name }}}}-operator
    namespace: {{{{ .Release.Namespace }}}}
{{{{- if .Values.settings.knownAnswers.taintSuspectNodes }}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{{{ .Release.Name }}}}-operator-node-taints
{{{{- include "kubeinfer.rbacLabels" . }}}}
rules:
{node_taint_rules}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{{{ .Release.Name }}}}-operator-node-taints
{{{{- include "kubeinfer.rbacLabels" . }}}}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{{{ .Release.Name }}}}-operator-node-taints
subjects:
  - kind: ServiceAccount
    name: {{{{ .Release.Name }}}}-operator
    namespace: {{{{ .Release.Namespace }}}}
{{{{- end }}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{{{ .Release.Name }}}}-operator-leader-election
  namespace: {{{{ .Release.Namespace }}}}
{{{{- include "kubeinfer.rbacLabels" . }}}}
rules:
{lease_rules}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{{{ .Release.Name }}}}-operator-leader-election
  namespace: {{{{ .Release.Namespace }}}}
{{{{- include "kubeinfer.rbacLabels" . }}}}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{{{ .Release.Name }}}}-operator-leader-election
subjects:
  - kind: ServiceAccount
    name: {{{{ .Release.Name }}}}-operator
    namespace: {{{{ .Release.Namespace }}}}
"""

HELM_LEASE_NAME = "{{ .Release.Name }}-operator"
"""The chart's Lease (the Deployment passes the same name to `--lease-name`)."""


def _rule_line(rule: Rule) -> str:
    return "  - " + json.dumps(rule.to_dict())


def helm_template() -> str:
    """The Helm chart's `templates/rbac.yaml`: a Role and RoleBinding per watched
    namespace, else a ClusterRole and ClusterRoleBinding; the nodes' ClusterRole and
    ClusterRoleBinding; the suspect nodes' taint ClusterRole and ClusterRoleBinding, only
    with settings.knownAnswers.taintSuspectNodes; and the leader election Role and
    RoleBinding in the release's namespace."""
    return HELM_TEMPLATE.format(
        rules="\n".join(_rule_line(rule) for rule in RULES),
        node_rules="\n".join(_rule_line(rule) for rule in NODE_RULES),
        node_taint_rules="\n".join(_rule_line(rule) for rule in NODE_TAINT_RULES),
        lease_rules="\n".join(_rule_line(rule) for rule in lease_rules(HELM_LEASE_NAME)),
    )
