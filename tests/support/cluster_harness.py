"""The tests' Kubernetes: one real control plane per test session, a namespace per test.

`local_cluster` (a session fixture in conftest) starts `kubeinfer cluster up`'s control
plane and real node (kubelet, containerd, kube-proxy, CoreDNS) in the test process' own
network namespace (conftest moved it there), built from their Go modules on first use,
with the API server's audit log on, and applies the CRD as it ships. Each test
gets a `Kube` bound to a namespace of its own: plain-dict reads and writes through the
official `kubernetes` client, as the admin. What the operator itself did is read from the
audit log (`Kube.calls`): every request the API server served, with its user, verb,
resource and response code, which is the record a test asserts on instead of a fake
server's request list.

Pods see their images and volumes, not this machine's files: a test's model reaches them
over HTTP from the cluster's file server (`file_url`).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import yaml
from kubeinfer.cluster import control_plane, files
from kubeinfer.cluster.addons import STORAGE_CLASS
from kubernetes.client.exceptions import ApiException
from waiting import wait_for

REPO = Path(__file__).parents[2]
CRD = REPO / "crds" / "inferencedeployments.kubeinfer.io.yaml"
KubeObject = dict[str, Any]
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""What Pod Security's `restricted` level, which every test namespace enforces, asks of a
container (the image's non-root USER satisfies runAsNonRoot)."""


def restricted(container: KubeObject) -> KubeObject:
    """`container` with the security context the test namespaces' Pod Security asks for."""
    return {**container, "securityContext": RESTRICTED}


def path_of(
    api_version: str,
    plural: str,
    namespace: str | None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    if name:
        base += f"/{name}"
    if subresource:
        base += f"/{subresource}"
    return base


@dataclass(frozen=True, eq=False)
class ApiCall:
    """One request from the audit log; `resource` carries `/subresource` when there is one."""

    user: str
    verb: str
    group: str
    resource: str
    namespace: str
    name: str
    code: int
    body: Any = None
    """The request's body, where the audit policy records it (writes to an
    InferenceDeployment itself)."""

    @classmethod
    def from_audit(cls, event: dict[str, Any]) -> ApiCall:
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        return cls(
            user=event["user"]["username"],
            verb=event["verb"],
            group=ref.get("apiGroup", ""),
            resource=resource,
            namespace=ref.get("namespace", ""),
            name=ref.get("name", ""),
            code=int((event.get("responseStatus") or {}).get("code", 0)),
            body=event.get("requestObject"),
        )


class AuditLog:
    """The API server's audit log, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def calls(self, predicate: Callable[[ApiCall], bool] = lambda _: True) -> list[ApiCall]:
        if not self.path.exists():
            return []
        found = []
        with self.path.open() as lines:
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line being written
                # A watch is logged when its response starts (and again when it ends,
                # which is skipped); every other request once it is complete.
                stage = "ResponseStarted" if event.get("verb") == "watch" else "ResponseComplete"
                if event.get("stage") != stage:
                    continue
                call = ApiCall.from_audit(event)
                if predicate(call):
                    found.append(call)
        return found


class Kube:
    """Admin access to one namespace of the test cluster (official `kubernetes` client)."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.client = cluster.api_client

    # -- transport ---------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        **query: Any,
    ) -> KubeObject:
        params = [(k, v) for k, v in query.items() if v is not None]
        serialized = self.client.param_serialize(
            method,
            path,
            query_params=params,
            body=body,
            auth_settings=["BearerToken"],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
        )
        response = self.client.call_api(*serialized, _request_timeout=30)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=response.reason, http_resp=response)
        return json.loads(data) if data else {}

    def get(
        self, api_version: str, plural: str, name: str, namespace: str | None = ""
    ) -> KubeObject | None:
        try:
            return self.request("GET", path_of(api_version, plural, self._ns(namespace), name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        plural: str,
        label_selector: str | None = None,
        namespace: str | None = "",
    ) -> list[KubeObject]:
        found = self.request(
            "GET", path_of(api_version, plural, self._ns(namespace)), labelSelector=label_selector
        )
        return list(found.get("items") or [])

    def create(self, obj: KubeObject) -> KubeObject:
        api_version, plural = obj["apiVersion"], plural_of(obj["kind"])
        namespace = obj.get("metadata", {}).get("namespace", self.namespace)
        if plural in CLUSTER_SCOPED:
            namespace = None
        obj = json.loads(json.dumps(obj))
        if namespace:
            obj["metadata"]["namespace"] = namespace
        return self.request("POST", path_of(api_version, plural, namespace), body=obj)

    def patch(
        self,
        api_version: str,
        plural: str,
        name: str,
        patch: Any,
        subresource: str | None = None,
        content_type: str = "application/merge-patch+json",
        namespace: str | None = "",
    ) -> KubeObject:
        path = path_of(api_version, plural, self._ns(namespace), name, subresource)
        return self.request("PATCH", path, body=patch, content_type=content_type)

    def delete(
        self, api_version: str, plural: str, name: str, namespace: str | None = "", **options: Any
    ) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", **options}
        with contextlib.suppress(ApiException):
            self.request(
                "DELETE", path_of(api_version, plural, self._ns(namespace), name), body=body
            )

    def _ns(self, namespace: str | None) -> str | None:
        return self.namespace if namespace == "" else namespace

    # -- what the operator did ---------------------------------------------------------------
    def calls(self, user: str | None = None) -> list[ApiCall]:
        """Requests about this namespace (or by `user`), oldest first."""
        return self.cluster.audit.calls(
            lambda c: (
                (c.namespace == self.namespace or (user is not None and c.user == user))
                and (user is None or c.user == user)
            )
        )

    # -- kubectl, as a user types it ---------------------------------------------------------
    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60, stdin: str | None = None
    ) -> str:
        return self.cluster.kubectl(
            "-n", self.namespace, *args, check=check, timeout=timeout, stdin=stdin
        )


PLURALS = {
    "InferenceDeployment": "inferencedeployments",
    "Endpoints": "endpoints",
    "NetworkPolicy": "networkpolicies",
    "PodMonitor": "podmonitors",
}
CLUSTER_SCOPED = {
    "namespaces",
    "nodes",
    "clusterroles",
    "clusterrolebindings",
    "customresourcedefinitions",
    "persistentvolumes",
    "storageclasses",
}


def plural_of(kind: str) -> str:
    if kind in PLURALS:
        return PLURALS[kind]
    lower = kind.lower()
    return lower + ("es" if lower.endswith("s") else "s")


@dataclass
class LocalCluster:
    """The session's control plane (`kubeinfer cluster up` with the audit log on)."""

    cluster: control_plane.Cluster
    api_client: kubernetes.client.ApiClient

    @property
    def directory(self) -> Path:
        return self.cluster.directory

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def server(self) -> str:
        return self.cluster.server

    @property
    def ca_file(self) -> Path:
        return self.cluster.pki.ca_cert

    @property
    def audit(self) -> AuditLog:
        return AuditLog(self.directory / control_plane.AUDIT_LOG)

    def claim_directory(self, namespace: str, claim: str) -> Path:
        """The folder holding a PersistentVolumeClaim's files on the node. A claim already
        provisioned has the storage provisioner's folder (`<volume>_<namespace>_<claim>`);
        for one not made yet, a PersistentVolume pre-bound to it (static provisioning, in
        the default StorageClass) is made over a new folder, so a test can put files in
        the claim before it, or the operator, creates it."""
        found = sorted((self.directory / "volumes").glob(f"*_{namespace}_{claim}"))
        if found:
            return found[0]
        folder = self.directory / "claims" / namespace / claim
        if not folder.exists():
            folder.mkdir(parents=True)
            folder.chmod(0o777)  # pods run as uid 65532
            self.admin().create({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": f"static-{namespace}-{claim}"[:253]},
                "spec": {
                    "capacity": {"storage": "100Gi"},
                    "accessModes": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"],
                    "storageClassName": STORAGE_CLASS,
                    "persistentVolumeReclaimPolicy": "Retain",
                    "claimRef": {"namespace": namespace, "name": claim},
                    "hostPath": {"path": str(folder), "type": "Directory"},
                },
            })  # fmt: skip
        return folder

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60, stdin: str | None = None
    ) -> str:
        """Runs the cluster's own kubectl as the admin; its output (stdout, and stderr too
        when `check` is off, so a refusal can be read)."""
        result = subprocess.run(
            [str(self.cluster.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            input=stdin,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result.stdout if check else result.stdout + result.stderr

    def admin(self, namespace: str = "default") -> Kube:
        return Kube(self, namespace)

    def new_namespace(self, prefix: str) -> str:
        name = f"{prefix[:40].rstrip('-')}-{secrets.token_hex(3)}"
        # Every test namespace enforces Pod Security's `restricted` level, as a hardened
        # cluster's would: a pod the operator makes that breaks it is refused here too.
        labels = {"pod-security.kubernetes.io/enforce": "restricted"}
        self.admin().create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        )
        # Pods need the namespace's default ServiceAccount, which a controller makes.
        wait_for(lambda: self.admin(name).get("v1", "serviceaccounts", "default"), 30,
                 f"the default ServiceAccount in {name}")  # fmt: skip
        return name

    def service_account_token(self, namespace: str, account: str, seconds: int = 3600) -> str:
        issued = self.admin(namespace).request(
            "POST",
            path_of("v1", "serviceaccounts", namespace, account, "token"),
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        return str(issued["status"]["token"])

    def kubeconfig_for(self, path: Path, token: str, namespace: str) -> Path:
        """A kubeconfig with a bearer token (a service account's, say)."""
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {
                                "server": self.server,
                                "certificate-authority": str(self.ca_file),
                            },
                        }
                    ],
                    "users": [{"name": "test", "user": {"token": token}}],
                    "contexts": [
                        {
                            "name": "test",
                            "context": {"cluster": "test", "user": "test", "namespace": namespace},
                        }
                    ],
                }
            )
        )
        return path


def established(local: LocalCluster, name: str) -> bool:
    crd = local.admin().get(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", name, namespace=None
    )
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def lists_inference_deployments(local: LocalCluster) -> bool:
    """Whether the CRD's storage answers a list (it says 429 "(re)initializing" for a
    moment after the CRD is Established)."""
    local.admin().list("kubeinfer.io/v1alpha1", "inferencedeployments", namespace=None)
    return True


def discovery_names_infd(local: LocalCluster) -> bool:
    listed = local.kubectl("get", "infd", "-A", "-o", "name", check=False)
    return "resource type" not in listed


RUNNING: list[LocalCluster] = []
"""The session's cluster, once started (one per test process)."""


def file_url(path: Path) -> str:
    """The URL at which the session cluster's pods read this machine's file `path`."""
    if not RUNNING:
        raise AssertionError("no cluster runs in this test process: use the local_cluster fixture")
    return files.publish(RUNNING[0].directory, path)


def start_local_cluster(directory: Path) -> Iterator[LocalCluster]:
    """Starts the control plane and node, applies the CRD, yields, and stops everything."""
    cluster = control_plane.up(directory, audit=True, in_this_namespace=True)
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(str(cluster.kubeconfig), client_configuration=configuration)
    api_client = kubernetes.client.ApiClient(configuration)
    local = LocalCluster(cluster, api_client)
    RUNNING.append(local)
    try:
        local.kubectl("apply", "--server-side", "-f", str(CRD))
        # Established, then a list that succeeds: `kubectl wait` gives up on a CRD with no
        # conditions yet, and the resource's storage answers 429 "(re)initializing" for a
        # moment after Established.
        wait_for(lambda: established(local, "inferencedeployments.kubeinfer.io"), 60,
                 "the CRD to be Established", every=0.1)  # fmt: skip
        wait_for(lambda: lists_inference_deployments(local), 60, "the CRD's storage to answer",
                 every=0.1, ignoring=(ApiException,))  # fmt: skip
        # And discovery naming the short name: the aggregated discovery document is
        # rebuilt a moment after the storage answers, later the larger the schema, and
        # until then `kubectl get infd` says the server has no such resource type.
        wait_for(lambda: discovery_names_infd(local), 60, "discovery to name infd", every=0.2)
        yield local
    finally:
        RUNNING.remove(local)
        api_client.close()
        control_plane.down(directory)
