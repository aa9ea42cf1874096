"""`cluster up` and `cluster down`: etcd, kube-apiserver, kube-controller-manager and the
node agent on loopback, as one unit a directory describes.

The directory holds the PKI, etcd's data, each process' log, the admin kubeconfig and
`state.json` (what runs, for `down`). The API server authenticates clients by certificate
(the admin) and by service-account token (pods), and authorizes with RBAC only, so a
Role that lacks a verb fails here as it would on a real cluster. The controller manager
runs the controllers a single-node cluster of Deployments, Jobs and Services needs; the
node agent stands in for the scheduler and the kubelet (see `node`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubeinfer.cluster import binaries, network, processes
from kubeinfer.cluster.certificates import ADMIN_USER, Pki, write_pki

CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "garbage-collector-controller",
    "endpointslice-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "persistentvolume-binder-controller",
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    "ttl-after-finished-controller",
    "pod-garbage-collector-controller",
    "disruption-controller",
)
"""What a single node of Deployments, Jobs, Services and claims needs: no cloud, no
node lifecycle (the node agent is the only node and reports its own condition)."""

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
STATE_FILE = "state.json"
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
READY_TIMEOUT_SECONDS = 90.0


class ClusterError(RuntimeError):
    """The cluster could not start (or stop); the message says which process and why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_directory() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kubeinfer" / "cluster"


@dataclass(frozen=True)
class Cluster:
    """A running cluster, as `up` left it."""

    directory: Path
    server: str
    kubeconfig: Path
    kubectl: Path
    pki: Pki

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """An admin GET of `path` on the API server (status, body); 0 when unreachable."""
        try:
            with urllib.request.urlopen(
                self.server + path, context=self.ssl_context(), timeout=timeout
            ) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except (urllib.error.URLError, OSError):
            return 0, b""


def kubeconfig_document(server: str, pki: Pki, user: str = ADMIN_USER) -> dict[str, object]:
    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kubeinfer",
                "cluster": {"server": server, "certificate-authority-data": data(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": data(pki.admin_cert),
                    "client-key-data": data(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": "kubeinfer", "context": {"cluster": "kubeinfer", "user": user}}],
        "current-context": "kubeinfer",
    }


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)


def _wait(
    what: str,
    check: Callable[[], bool],
    started: list[processes.Started],
    timeout: float = READY_TIMEOUT_SECONDS,
) -> None:
    """Polls `check` until true; a ClusterError naming the process that exited (with the
    end of its log) or the timeout otherwise."""
    deadline = time.monotonic() + timeout
    while not check():
        for process in started:
            if not processes.is_running(process):
                tail = Path(process.log).read_text(errors="replace")[-3000:]
                raise ClusterError(f"{process.name} exited while waiting for {what}:\n{tail}")
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def up(
    directory: Path,
    kubeconfig: Path | None = None,
    *,
    node_args: list[str] | None = None,
    audit: bool = False,
    progress: Callable[[str], None] = binaries.say,
) -> Cluster:
    """Starts the cluster in `directory` (emptied first) and returns once the API server is
    ready, the controllers run and the node is Ready; ClusterError otherwise, after
    stopping whatever had started. With `audit`, the API server logs every request's
    metadata (who, verb, resource, response code) to `directory/audit.log`."""
    paths = binaries.ensure_binaries()
    pods = network.ensure_pod_network()
    if pods.note:
        progress(pods.note)
    controllers = [
        c for c in CONTROLLERS if not (pods.loopback and c == "endpointslice-controller")
    ]
    if (directory / STATE_FILE).exists():
        down(directory)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    logs = directory / "logs"
    pki = write_pki(directory / "pki")
    started: list[processes.Started] = []
    popens = []

    def launch(name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        process, popen = processes.spawn(name, argv, logs / f"{name}.log", env=env)
        started.append(process)
        popens.append(popen)
        processes.write_state(directory / STATE_FILE, started)

    try:
        t0 = time.monotonic()
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        launch(
            "etcd",
            [
                str(paths["etcd"]),
                "--name=default",
                f"--data-dir={directory / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        _wait("etcd's /health", lambda: _http_ok(f"{etcd_url}/health"), started)

        server = f"https://127.0.0.1:{api_port}"
        apiserver = [
            str(paths["kube-apiserver"]),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_account_public_key}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            "--anonymous-auth=false",
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--cert-dir={directory / 'apiserver-certs'}",
            "--v=1",
        ]
        if audit:
            policy = directory / "audit-policy.yaml"
            policy.write_text(yaml.safe_dump(AUDIT_POLICY))
            apiserver += [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={directory / AUDIT_LOG}",
                "--audit-log-maxsize=0",
            ]
        launch("kube-apiserver", apiserver)
        admin = kubeconfig_document(server, pki)

        admin_path = directory / "admin.kubeconfig"
        _write_private(admin_path, yaml.safe_dump(admin))
        cluster = Cluster(directory, server, kubeconfig or admin_path, paths["kubectl"], pki)
        _wait("the API server's /readyz", lambda: cluster.get("/readyz")[0] == 200, started)
        progress(f"API server ready at {server} ({time.monotonic() - t0:.1f} s)")

        launch(
            "kube-controller-manager",
            [
                str(paths["kube-controller-manager"]),
                f"--kubeconfig={admin_path}",
                f"--authentication-kubeconfig={admin_path}",
                f"--authorization-kubeconfig={admin_path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={directory / 'controller-manager-certs'}",
                f"--controllers={','.join(controllers)}",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki.service_account_key}",
                f"--root-ca-file={pki.ca_cert}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )

        def has_default_service_account() -> bool:
            status, _ = cluster.get("/api/v1/namespaces/default/serviceaccounts/default")
            return status == 200

        _wait("the controllers (the default ServiceAccount)", has_default_service_account, started)
        progress(f"controllers running ({time.monotonic() - t0:.1f} s)")

        launch(
            "node-agent",
            [
                sys.executable,
                "-m",
                "kubeinfer.cluster.node",
                f"--kubeconfig={admin_path}",
                f"--directory={directory / 'node'}",
                f"--ca-file={pki.ca_cert}",
                f"--pod-network={pods.cidr}",
                f"--kubelet-cert={pki.kubelet_cert}",
                f"--kubelet-key={pki.kubelet_key}",
                *(node_args or []),
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        _wait("the node to be Ready", lambda: _node_ready(cluster), started)
        progress(f"node Ready ({time.monotonic() - t0:.1f} s)")

        if kubeconfig is not None:
            _write_private(kubeconfig, yaml.safe_dump(admin))
        processes.write_state(
            directory / STATE_FILE, started, server=server, kubeconfig=str(cluster.kubeconfig)
        )
        return cluster
    except BaseException:
        processes.stop(started)
        for popen in popens:
            with contextlib.suppress(Exception):
                popen.wait(timeout=1)
        raise


def _node_ready(cluster: Cluster) -> bool:
    status, body = cluster.get("/api/v1/nodes")
    if status != 200:
        return False
    for node in json.loads(body).get("items", []):
        for condition in node.get("status", {}).get("conditions") or []:
            if condition["type"] == "Ready" and condition["status"] == "True":
                return True
    return False


def down(directory: Path, grace_seconds: float = 15.0) -> list[str]:
    """Stops what `up` started in `directory` (the node agent first, so it stops its pods,
    then the controllers, the API server and etcd); returns the names that needed SIGKILL."""
    state = directory / STATE_FILE
    if not state.exists():
        return []
    started, _ = processes.read_state(state)
    killed = processes.stop(started, grace_seconds)
    state.unlink()
    return killed
