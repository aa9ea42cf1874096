"""How each process of the cluster is started: its argv, from the cluster's paths.

All of them run inside the cluster's network namespace, where the ports are the
well-known ones (the namespace is the cluster's alone): etcd on 127.0.0.1:2379, the API
server on 6443 of every address (the node's is the advertised one, which pods reach
through the `kubernetes` Service), the kubelet on the node's address.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeinfer.cluster.certificates import Pki
from kubeinfer.cluster.netns import NODE_ADDRESS, SERVICE_SUBNET

ETCD_PORT, ETCD_PEER_PORT, API_PORT = 2379, 2380, 6443
INSIDE_SERVER = f"https://127.0.0.1:{API_PORT}"
"""The API server as a process in the cluster's namespace reaches it."""
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
AUDIT_LOG = "audit.log"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        # A write to an InferenceDeployment itself (not its status) with its body: tests
        # check from it that the operator never writes a spec it was given.
        {
            "level": "Request",
            "verbs": ["patch", "update"],
            "resources": [{"group": "kubeinfer.io", "resources": ["inferencedeployments"]}],
        },
        {"level": "Metadata"},
    ],
}
"""Who did what: one line per request, with its user, verb, resource and response code."""


@dataclass(frozen=True)
class Paths:
    directory: Path
    binaries: dict[str, Path]
    pki: Pki

    def kubeconfig(self, component: str) -> Path:
        return self.directory / "kubeconfigs" / f"{component}.kubeconfig"


def kubeconfig_document(
    server: str, ca_cert: Path, cert: Path, key: Path, user: str
) -> dict[str, object]:
    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kubeinfer",
                "cluster": {"server": server, "certificate-authority-data": data(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": data(cert), "client-key-data": data(key)},
            }
        ],
        "contexts": [{"name": "kubeinfer", "context": {"cluster": "kubeinfer", "user": user}}],
        "current-context": "kubeinfer",
    }


def etcd(paths: Paths) -> list[str]:
    client, peer = f"http://127.0.0.1:{ETCD_PORT}", f"http://127.0.0.1:{ETCD_PEER_PORT}"
    return [
        str(paths.binaries["etcd"]),
        "--name=default",
        f"--data-dir={paths.directory / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--listen-metrics-urls=http://127.0.0.1:2381",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def kube_apiserver(paths: Paths, audit_policy: Path | None) -> list[str]:
    pki = paths.pki
    argv = [
        str(paths.binaries["kube-apiserver"]),
        f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
        "--bind-address=0.0.0.0",
        f"--advertise-address={NODE_ADDRESS}",
        f"--secure-port={API_PORT}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.service_account_public_key}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_SUBNET}",
        "--allow-privileged=true",
        "--anonymous-auth=false",
        f"--kubelet-client-certificate={pki.kubelet_client_cert}",
        f"--kubelet-client-key={pki.kubelet_client_key}",
        f"--kubelet-certificate-authority={pki.ca_cert}",
        "--kubelet-preferred-address-types=InternalIP",
        f"--cert-dir={paths.directory / 'apiserver-certs'}",
        "--v=1",
    ]
    if audit_policy is not None:
        argv += [
            f"--audit-policy-file={audit_policy}",
            f"--audit-log-path={paths.directory / AUDIT_LOG}",
            "--audit-log-maxsize=0",
        ]
    return argv


CLIENT_RATE_LIMIT = ("--kube-api-qps=100", "--kube-api-burst=200")
"""Each controller's client may send this many requests a second (kube-controller-manager
gives every controller a client of its own). The defaults (20 a second for the
controller manager, 50 for the scheduler) are what held a thousand InferenceDeployments
back first on a simulated fleet: the Job, ReplicaSet and Deployment controllers each sat
at their limit while the API server had time to spare (docs/fleet.md); large clusters
raise them too."""


def kube_controller_manager(paths: Paths) -> list[str]:
    """Kubernetes' default controllers (node lifecycle and its taint-based eviction
    included), each with its own service account, and the CA signing what CSRs ask."""
    kubeconfig = paths.kubeconfig("kube-controller-manager")
    pki = paths.pki
    return [
        str(paths.binaries["kube-controller-manager"]),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--secure-port=10257",
        f"--cert-dir={paths.directory / 'controller-manager-certs'}",
        "--controllers=*",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        "--use-service-account-credentials=true",
        f"--service-cluster-ip-range={SERVICE_SUBNET}",
        "--concurrent-gc-syncs=5",
        *CLIENT_RATE_LIMIT,
        "--v=1",
    ]


def kube_scheduler(paths: Paths) -> list[str]:
    kubeconfig = paths.kubeconfig("kube-scheduler")
    return [
        str(paths.binaries["kube-scheduler"]),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--secure-port=10259",
        "--leader-elect=false",
        *CLIENT_RATE_LIMIT,
        "--v=1",
    ]


def containerd(paths: Paths, config: Path) -> list[str]:
    return [str(paths.binaries["containerd"]), f"--config={config}", "--log-level=warn"]


def kube_proxy(paths: Paths, config: Path) -> list[str]:
    return [str(paths.binaries["kube-proxy"]), f"--config={config}", "--v=1"]


def search_path(binaries: dict[str, Path]) -> str:
    """PATH for containerd (its shim, runc) and the kubelet (mount, iptables...)."""
    system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".split(":")
    shim, runc = binaries["containerd-shim-runc-v2"].parent, binaries["runc"].parent
    folders = dict.fromkeys([str(shim), str(runc), *system])
    return ":".join(folders)


def environment(binaries: dict[str, Path], base: dict[str, str]) -> dict[str, Any]:
    return {**base, "PATH": search_path(binaries)}
