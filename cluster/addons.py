"""What a cluster runs on itself beside the workloads: CoreDNS and a storage provisioner.

- **CoreDNS** answers for `cluster.local` at the `kube-dns` Service's address, which the
  kubelet gives every pod as its nameserver, so Services resolve by name as on any cluster.
  Nothing is forwarded upstream: the node's namespace has no way out, by design.
- **local-path-provisioner** (what kind ships) gives PersistentVolumeClaims of the default
  StorageClass a directory each under the cluster's `volumes/`, made by a helper pod, and
  removes it with the claim; a shared-filesystem layout, since the node is the only one,
  lets a claim be mounted ReadWriteMany (a build Job writing, runtime pods reading).

Both run from images of a single static binary built here (`binaries`), as non-root with a
read-only root filesystem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubeinfer.cluster.netns import DNS_SERVICE_ADDRESS

COREDNS_IMAGE = "localhost/kubeinfer/coredns:1"
PROVISIONER_IMAGE = "localhost/kubeinfer/local-path-provisioner:1"
STORAGE_CLASS = "standard"
DNS_PORT = 1053
"""CoreDNS's own port (the Service maps 53 to it), so it needs no capability to bind."""
COREFILE = f"""\
.:{DNS_PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
    loadbalance
}}
"""
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

KubeObject = dict[str, Any]


def _cluster_role(name: str, rules: list[KubeObject]) -> KubeObject:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules}  # fmt: skip


def _cluster_role_binding(name: str, account: str, namespace: str) -> KubeObject:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


def _deployment(
    name: str, namespace: str, account: str, container: KubeObject, volumes: list[KubeObject]
) -> KubeObject:
    labels = {"k8s-app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": account,
                    "priorityClassName": "system-cluster-critical",
                    "containers": [{"imagePullPolicy": "Never", **container}],
                    "volumes": volumes,
                },
            },
        },
    }


def coredns_objects() -> list[KubeObject]:
    namespace, name = "kube-system", "coredns"
    container = {
        "name": name,
        "image": COREDNS_IMAGE,
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": DNS_PORT, "protocol": "TCP"},
        ],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 1},
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "securityContext": RESTRICTED_CONTAINER,
    }
    rules = [
        {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["list", "watch"]},
    ]  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": namespace}},
        _cluster_role("system:coredns", rules),
        _cluster_role_binding("system:coredns", name, namespace),
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": name, "namespace": namespace}, "data": {"Corefile": COREFILE}},
        _deployment(name, namespace, name, container,
                    [{"name": "config", "configMap": {"name": name}}]),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": namespace,
                         "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "clusterIP": DNS_SERVICE_ADDRESS,
                "selector": {"k8s-app": name},
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": DNS_PORT, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": DNS_PORT, "protocol": "TCP"},
                ],
            },
        },
    ]  # fmt: skip


def provisioner_objects(volumes: Path, helper_image: str) -> list[KubeObject]:
    """local-path-provisioner as upstream deploys it, with volumes under `volumes` and the
    helper pod (which makes and removes the directories as root) from `helper_image`."""
    namespace, name = "local-path-storage", "local-path-provisioner"
    account = f"{name}-service-account"
    rules = [
        {"apiGroups": [""], "resources": ["nodes", "persistentvolumeclaims", "configmaps",
                                           "pods", "pods/log"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["persistentvolumes"],
         "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["pods"],
         "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"],
         "verbs": ["get", "list", "watch"]},
    ]  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {
            # The helper pod writes the node's directories as root: this namespace alone.
            "pod-security.kubernetes.io/enforce": "privileged"}}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": namespace}},
        _cluster_role(name, rules),
        _cluster_role_binding(name, account, namespace),
        _provisioner_config(namespace, volumes, helper_image),
        _deployment(name, namespace, account, _provisioner_container(name),
                    [{"name": "config", "configMap": {"name": "local-path-config"}}]),
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS, "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "rancher.io/local-path",
            "volumeBindingMode": "Immediate",
            "reclaimPolicy": "Delete",
        },
    ]  # fmt: skip


def _provisioner_config(namespace: str, volumes: Path, helper_image: str) -> KubeObject:
    """The provisioner's ConfigMap: one shared directory for every claim (the node is the
    only one, so ReadWriteMany holds) and the helper pod that makes and removes a claim's
    directory, run as root from `helper_image`, which the node has imported."""
    config = {"sharedFileSystemPath": str(volumes)}
    helper = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "containers": [{"name": "helper-pod", "image": helper_image,
                            "imagePullPolicy": "Never",
                            "securityContext": {"runAsUser": 0, "runAsNonRoot": False}}],
        },
    }  # fmt: skip
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "local-path-config",
                                                                  "namespace": namespace},
            "data": {
                "config.json": json.dumps(config),
                "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n',
                "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
                "helperPod.yaml": json.dumps(helper),
            }}  # fmt: skip


def _provisioner_container(name: str) -> KubeObject:
    """The provisioner itself, restricted like every add-on; it reads its config from the
    mounted ConfigMap and creates helper pods in its own namespace."""
    return {
        "name": name,
        "image": PROVISIONER_IMAGE,
        "args": ["start", "--config", "/etc/config/config.json"],
        "env": [
            {"name": "POD_NAMESPACE",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "CONFIG_MOUNT_PATH", "value": "/etc/config/"},
        ],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/config/", "readOnly": True}],
        "securityContext": RESTRICTED_CONTAINER,
    }  # fmt: skip
