"""The objects `kubeinfer up` installs before any manifest: the operator as the Helm chart
installs it, and what Prometheus needs to discover pods. Pure: dicts, applied by the
session with server-side apply.

The RBAC is the chart's own: `kubeinfer.operator.rbac` generates both the chart's
`templates/rbac.yaml` (a test keeps them equal) and these objects, so a verb the chart
lacks fails here as it would in a cluster. The operator runs as a pod of its own image
(imported into the node's containerd; the kubelet runs its container, `kubeinfer
operator`), with the chart's arguments (all namespaces, leader election on its Lease) and
the settings a laptop wants (`LOCAL_SETTINGS`): short metrics polls, a shorter drain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeinfer.operator import rbac
from kubeinfer.operator.settings import DEFAULT_RUNTIME_IMAGE

NAMESPACE = "kubeinfer-system"
RELEASE = "kubeinfer"
OPERATOR_ACCOUNT = f"{RELEASE}-operator"
OPERATOR_IMAGE = DEFAULT_RUNTIME_IMAGE.replace("kubeinfer-runtime", "kubeinfer-operator")
PROMETHEUS_ACCOUNT = "prometheus"
LABELS = {"app.kubernetes.io/name": "kubeinfer", "app.kubernetes.io/instance": RELEASE}
OPERATOR_SELECTOR = {**LABELS, "app.kubernetes.io/component": "operator"}
METRICS_PORT = 8080
"""The operator's metrics port (the chart's `metricsPort`), which also takes the
activator's wakes."""
METRICS_CONTAINER_PORT = {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}
WAKE_URL = f"http://{OPERATOR_ACCOUNT}.{NAMESPACE}.svc:{METRICS_PORT}/v1/activator/wake"

LOCAL_SETTINGS = {
    "KUBEINFER_REQUEUE__AUTOSCALE_POLL_SECONDS": "2",
    "KUBEINFER_REQUEUE__SHADOW_POLL_SECONDS": "2",
    "KUBEINFER_PODS__DRAIN_GRACE_PERIOD_SECONDS": "5",
    "KUBEINFER_IMAGES__PULL_POLICY": "Never",
}
"""Operator settings for one machine: a demo wants the autoscaler and the shadow verdict to
look every couple of seconds and a shorter drain; the node's images are imported, and a
pull could only fail. The preStop pause keeps its default: kube-proxy needs it to stop
sending a leaving pod new connections before the pod stops accepting them."""
RESTRICTED_NAMESPACES = (NAMESPACE, "default")
POD_SECURITY = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def _binding(kind: str, name: str, namespace: str | None, account: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": LABELS}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": f"{kind}Binding",
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
    }


def operator_objects(
    prometheus_url: str | None, settings: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Namespace, ServiceAccount, the chart's ClusterRole, the nodes' ClusterRole and the
    Lease Role with their bindings, and the operator's Deployment, with `settings` (the
    operator's variables, `KUBEINFER_<GROUP>__<FIELD>`) over the laptop's where a caller
    asks for more: `kubeinfer demo` its test faults, `kubeinfer up` none. Without the nodes' role
    the operator stops about a minute after each start: kopf's watch of the GPU nodes is
    refused, and once its retries run out, kopf ends the whole operator."""
    cluster_role = rbac.role_document(OPERATOR_ACCOUNT)
    node_role = rbac.node_role_document(f"{OPERATOR_ACCOUNT}-nodes")
    lease_role = rbac.lease_role_document(
        f"{OPERATOR_ACCOUNT}-leader-election", NAMESPACE, OPERATOR_ACCOUNT
    )
    return [
        *namespace_objects(),
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": OPERATOR_ACCOUNT, "namespace": NAMESPACE, "labels": LABELS},
        },
        cluster_role,
        _binding("ClusterRole", cluster_role["metadata"]["name"], None, OPERATOR_ACCOUNT),
        node_role,
        _binding("ClusterRole", node_role["metadata"]["name"], None, OPERATOR_ACCOUNT),
        lease_role,
        _binding("Role", lease_role["metadata"]["name"], NAMESPACE, OPERATOR_ACCOUNT),
        _operator_service(),
        _operator_deployment(_operator_env(prometheus_url, settings or {})),
    ]


def _operator_service() -> dict[str, Any]:
    """The operator's metrics port as a Service (the chart's): where the activator posts
    its wakes, so a held request starts a pod at once rather than at the next poll."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": OPERATOR_ACCOUNT, "namespace": NAMESPACE, "labels": LABELS},
        "spec": {
            "type": "ClusterIP",
            "selector": OPERATOR_SELECTOR,
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics",
                       "protocol": "TCP"}],
        },
    }  # fmt: skip


def _operator_env(
    prometheus_url: str | None, settings: Mapping[str, str]
) -> list[dict[str, object]]:
    """The laptop's settings and the caller's, the pod's own name and namespace (the
    leader election's identity and its Lease's namespace), and Prometheus when the
    session runs one."""
    merged = {**LOCAL_SETTINGS, **settings}
    env: list[dict[str, object]] = [{"name": k, "value": v} for k, v in merged.items()]
    env += [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    if prometheus_url:
        env.append({"name": "KUBEINFER_METRICS__PROMETHEUS_URL", "value": prometheus_url})
    return env


def _operator_deployment(env: list[dict[str, object]]) -> dict[str, Any]:
    """The operator's Deployment with the chart's arguments: one replica of the operator
    image (imported into the node, never pulled), non-root, read-only root filesystem."""
    selector = OPERATOR_SELECTOR
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": OPERATOR_ACCOUNT, "namespace": NAMESPACE, "labels": selector},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    "serviceAccountName": OPERATOR_ACCOUNT,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "operator",
                            "image": OPERATOR_IMAGE,
                            "imagePullPolicy": "Never",
                            "args": [
                                "operator",
                                "--all-namespaces",
                                "--leader-election",
                                f"--lease-name={OPERATOR_ACCOUNT}",
                                f"--metrics-port={METRICS_PORT}",
                            ],
                            "env": env,
                            "ports": [METRICS_CONTAINER_PORT],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                        }
                    ],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def namespace_objects() -> list[dict[str, Any]]:
    """The operator's namespace and `default`, each enforcing the restricted level."""
    return [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": name, "labels": POD_SECURITY}}
        for name in RESTRICTED_NAMESPACES
    ]  # fmt: skip


def prometheus_objects() -> list[dict[str, Any]]:
    """Prometheus' identity for Kubernetes service discovery: list and watch pods."""
    role_name = f"{RELEASE}-prometheus"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": role_name, "labels": LABELS},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": PROMETHEUS_ACCOUNT, "namespace": NAMESPACE, "labels": LABELS},
        },
        role,
        _binding("ClusterRole", role_name, None, PROMETHEUS_ACCOUNT),
    ]
