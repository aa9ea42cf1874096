"""`helm install`, `upgrade` and `uninstall` of the chart on a real control plane, as a
user runs them.

The module starts a cluster of its own (control plane and real node, in a network
namespace of its own, `cluster_harness`), without the CRD: Helm installs it from
the chart's crds/. A cluster-wide operator there touches nothing of the session's other
tests. prometheus-operator's CRDs are applied first, so the monitoring objects go through
the API server's own validation, and the operator's PodMonitors through its RBAC. A bad
value is refused by Helm before anything is made.

The chart's Deployment runs the operator's image as containers: two replicas, under the
chart's ServiceAccount and RBAC only. The leader reconciles the smallest example
(examples/cpu-minimal.yaml, its model source pointed at a real ONNX model on this machine,
served to the pods by the cluster's file server) to Ready, its build Job and serving pod
being containers of the runtime image. `helm upgrade` to one replica and other settings rolls the
operator, and the new pod takes the Lease. `helm uninstall` leaves none of the objects the
chart created, namespaced or cluster-scoped; what stays is what Helm documents (the CRD,
so the InferenceDeployments too) and the Lease the operator made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import kubernetes
import pytest
import yaml
from cluster_harness import LocalCluster
from helm_harness import CHART, REPO, Helm, KubeObject, names
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.cluster import control_plane, files
from kubernetes.client.exceptions import ApiException
from prometheus_operator_crds import crd_file
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.lifecycle]  # a release installed, upgraded, removed

RELEASE = "kubeinfer"
OPERATOR = f"{RELEASE}-operator"
INFD = ("kubeinfer.io/v1alpha1", "inferencedeployments")
PLURALS = {
    "ServiceAccount": ("v1", "serviceaccounts"),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles"),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    "Role": ("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings"),
    "Deployment": ("apps/v1", "deployments"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
    "ConfigMap": ("v1", "configmaps"),
    "Service": ("v1", "services"),
    "PodMonitor": ("monitoring.coreos.com/v1", "podmonitors"),
    "PrometheusRule": ("monitoring.coreos.com/v1", "prometheusrules"),
}


T = TypeVar("T")


def settling(check: Callable[[], T]) -> Callable[[], T | None]:
    """`check`, with the 404 or 429 that a resource just installed answers for a moment
    counted as not yet; any other refusal fails the wait."""

    def guarded() -> T | None:
        try:
            return check()
        except ApiException as error:
            if error.status not in (404, 429):
                raise
            return None

    return guarded


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane of this module's own, with prometheus-operator's CRDs and no
    InferenceDeployment CRD."""
    directory = tmp_path_factory.mktemp("helm-cluster")
    # A cluster of its own beside the session's: in a network namespace of its own too,
    # reached through the API server's forwarded port.
    started = control_plane.up(directory, audit=True)
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(str(started.kubeconfig), client_configuration=configuration)
    api_client = kubernetes.client.ApiClient(configuration)
    local = LocalCluster(started, api_client)
    try:
        for plural in ("podmonitors", "prometheusrules"):
            local.kubectl("apply", "--server-side", "-f", str(crd_file(plural)))
        yield local
    finally:
        api_client.close()
        control_plane.down(directory)


def inference_deployment(model: Path, namespace: str, cluster_directory: Path) -> KubeObject:
    """examples/cpu-minimal.yaml, served from a real model file, sized for this node."""
    import hashlib

    manifest = yaml.safe_load((REPO / "examples" / "cpu-minimal.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace
    spec = manifest["spec"]
    spec["model"]["source"] = {
        "uri": files.publish(cluster_directory, model),
        "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
    }
    spec["runtime"]["replicas"] = 1
    spec["runtime"]["resources"] = {"cpu": "250m", "memory": "1Gi"}
    return manifest


def ready(obj: KubeObject | None) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def lease_holder(cluster: LocalCluster, namespace: str) -> str:
    lease = cluster.admin(namespace).get("coordination.k8s.io/v1", "leases", OPERATOR)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def operator_pods(cluster: LocalCluster, namespace: str) -> list[KubeObject]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
    return cluster.admin(namespace).list("v1", "pods", selector)


def test_install_reconciles_upgrade_rolls_uninstall_leaves_nothing(
    cluster: LocalCluster, helm: Helm, model_directory: Path
) -> None:
    helm = Helm(helm.binary, helm.home / "install", cluster.kubeconfig)
    namespace, serving = "kubeinfer-system", cluster.new_namespace("serving")
    values = helm.values_file({
        "monitoring": {"operatorPodMonitor": {"enabled": True},
                       "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}},
        # Seconds, not minutes, for a test: a standby takes over sooner, builds poll often.
        "settings": {"requeue": {"buildPollSeconds": 1, "resyncIntervalSeconds": 5},
                     "pods": {"preStopSleepSeconds": 0, "drainGracePeriodSeconds": 2}},
    }, "install")  # fmt: skip
    # A value the operator would refuse is refused by Helm first, and nothing is made.
    refused = helm.run("install", RELEASE, str(CHART), "-n", namespace, "--create-namespace",
                       "--set", "settings.build.backoffLimit=20", check=False)  # fmt: skip
    assert refused.returncode == 1
    assert "- at '/settings/build/backoffLimit': maximum: got 20, want 10" in refused.stderr
    assert cluster.admin().get("v1", "namespaces", namespace, namespace=None) is None

    helm.run("install", RELEASE, str(CHART), "-n", namespace, "--create-namespace",
             "-f", str(values), "--wait", "--timeout", "120s", timeout=180)  # fmt: skip
    manifest = [d for d in yaml.safe_load_all(helm.run("get", "manifest", RELEASE, "-n",
                namespace).stdout) if d]  # fmt: skip
    created = sorted(names(manifest))
    assert {kind for kind, _, _ in created} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "Deployment", "PodDisruptionBudget", "PodMonitor", "PrometheusRule", "ConfigMap",
        "Service",  # the operator's, where the activator sends its wakes
    }  # fmt: skip

    # The operator runs as the chart's ServiceAccount, and one of its two pods leads.
    pods = operator_pods(cluster, namespace)
    assert len(pods) == 2
    assert {p["spec"]["serviceAccountName"] for p in pods} == {OPERATOR}
    leader = wait_for(settling(lambda: lease_holder(cluster, namespace)), 60, "a leader", every=0.2)
    assert leader.split("_")[0] in {p["metadata"]["name"] for p in pods}

    # It reconciles the smallest example to Ready, with the chart's RBAC only.
    model = build_tiny_mlp(model_directory / "helm-tiny.onnx")
    infd = inference_deployment(model, serving, cluster.directory)
    name = infd["metadata"]["name"]
    kube = cluster.admin(serving)
    wait_for(
        settling(lambda: kube.create(infd)),
        60,
        "the chart's CRD to serve InferenceDeployments",
        every=0.2,
    )
    wait_for(settling(lambda: ready(kube.get(*INFD, name))), 120, f"{name} Ready", every=0.2)
    account = f"system:serviceaccount:{namespace}:{OPERATOR}"
    writes = cluster.audit.calls(lambda c: c.user == account and c.namespace == serving
                                 and c.verb in ("create", "patch", "update"))  # fmt: skip
    assert {c.resource for c in writes} >= {"inferencedeployments/status", "deployments"}
    assert not [c for c in cluster.audit.calls(lambda c: c.user == account) if c.code == 403]
    monitors = kube.list("monitoring.coreos.com/v1", "podmonitors")
    assert [m["metadata"]["name"] for m in monitors], "the operator's PodMonitor (auto)"

    # An upgrade rolls the operator to one replica with new settings; the new pod leads.
    old = {p["metadata"]["name"] for p in pods}
    helm.run("upgrade", RELEASE, str(CHART), "-n", namespace, "-f", str(values),
             "--set", "replicas=1", "--set", "settings.requeue.resyncIntervalSeconds=10",
             "--wait", "--timeout", "120s", timeout=180)  # fmt: skip
    deployment = cluster.admin(namespace).get("apps/v1", "deployments", OPERATOR)
    assert deployment and deployment["spec"]["replicas"] == 1
    env = {e["name"]: e.get("value") for e in
           deployment["spec"]["template"]["spec"]["containers"][0]["env"]}  # fmt: skip
    assert env["KUBEINFER_REQUEUE__RESYNC_INTERVAL_SECONDS"] == "10"
    assert cluster.admin(namespace).get("policy/v1", "poddisruptionbudgets", OPERATOR) is None

    def new_leader() -> str:
        holder = lease_holder(cluster, namespace).split("_")[0]
        current = {p["metadata"]["name"] for p in operator_pods(cluster, namespace)}
        return holder if holder in current - old else ""

    wait_for(settling(new_leader), 60, "the upgraded operator to take the Lease", every=0.2)
    assert ready(kube.get(*INFD, name))

    # Uninstall: nothing the chart created is left, cluster-scoped objects included.
    helm.run("uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "120s", timeout=180)
    admin = cluster.admin(namespace)
    left = []
    for kind, object_namespace, object_name in created:
        api_version, plural = PLURALS[kind]
        where = object_namespace or (None if kind.startswith("Cluster") else namespace)
        if admin.get(api_version, plural, object_name, namespace=where) is not None:
            left.append((kind, object_name))
    assert left == []
    wait_for(
        settling(lambda: not operator_pods(cluster, namespace)),
        60,
        "the operator pods to go",
        every=0.2,
    )
    # What stays: the CRD (Helm never deletes one) and the operator's own Lease. Helm
    # deletes the RBAC while the last leader is still stopping, so its release is refused
    # (403) and the Lease expires on its own after leaseDurationSeconds.
    lease = admin.get("coordination.k8s.io/v1", "leases", OPERATOR)
    assert lease and "app.kubernetes.io/managed-by" not in (lease["metadata"].get("labels") or {})
    assert helm.run("list", "-A", "-q").stdout.strip() == ""
    assert admin.list("v1", "secrets", "owner=helm") == [], "Helm's release records"
    assert admin.get("apiextensions.k8s.io/v1", "customresourcedefinitions",
                     "inferencedeployments.kubeinfer.io", namespace=None)  # fmt: skip
