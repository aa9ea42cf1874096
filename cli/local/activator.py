"""The activator's objects (docs/scale-to-zero.md), as `kubeinfer up` installs them and the
chart's `templates/activator.yaml` renders them: a ServiceAccount with no API token (the
activator reads nothing of the API: its routes come in the ConfigMap the operator writes),
two replicas of the runtime image running `kubeinfer activator`, non-root on a read-only
root filesystem, the route table mounted (optional: it exists once an object has
minReplicas 0), and a disruption budget so a drain never takes both. Pure: dicts.
"""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.settings import DEFAULT_RUNTIME_IMAGE, Activator

NAME = "kubeinfer-activator"
ROUTES_MOUNT = "/etc/kubeinfer/activator"
LOCAL_NAMESPACE = "kubeinfer-system"
"""`kubeinfer up`'s operator namespace (`install.NAMESPACE`)."""
SELECTOR = {"app.kubernetes.io/name": NAME}
"""The activator pods' labels: `Activator.pod_selector`'s default."""


def activator_args(settings: Activator, wake_url: str | None) -> list[str]:
    """`kubeinfer activator`'s arguments for `settings` (the operator's view of it)."""
    args = [
        "activator",
        f"--routes-file={ROUTES_MOUNT}/routes.json",
        f"--port={settings.http_port}",
        f"--grpc-port={settings.grpc_port}",
    ]
    return [*args, f"--wake-url={wake_url}"] if wake_url else args


def activator_objects(
    settings: Activator,
    *,
    image: str = DEFAULT_RUNTIME_IMAGE,
    replicas: int = 2,
    wake_url: str | None = None,
    pull_policy: str = "Never",
) -> list[dict[str, Any]]:
    """ServiceAccount, Deployment and PodDisruptionBudget of the activator in its
    namespace (the operator's, unless `settings` names one)."""
    namespace = settings.namespace_or(LOCAL_NAMESPACE)
    metadata = {"name": NAME, "namespace": namespace, "labels": dict(SELECTOR)}
    ports = [
        {"name": "http", "containerPort": settings.http_port, "protocol": "TCP"},
        {"name": "grpc", "containerPort": settings.grpc_port, "protocol": "TCP"},
    ]
    container = {
        "name": "activator",
        "image": image,
        "imagePullPolicy": pull_policy,
        "args": activator_args(settings, wake_url),
        "ports": ports,
        "readinessProbe": {
            "httpGet": {"path": "/v2/health/ready", "port": "http"},
            "periodSeconds": 2,
        },
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "routes", "mountPath": ROUTES_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    routes = {"name": settings.routes_config_map, "optional": True}
    pod_spec = {
        "serviceAccountName": NAME,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "routes", "configMap": routes},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata,
         "automountServiceAccountToken": False},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata,
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": dict(SELECTOR)},
                "template": {"metadata": {"labels": dict(SELECTOR)}, "spec": pod_spec},
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": metadata,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(SELECTOR)}},
        },
    ]  # fmt: skip
