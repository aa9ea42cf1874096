"""The real node: the project's images as containers of the real kubelet, containerd and
runc. A pod of the runtime image, under Pod Security Admission's `restricted` level, with a
model from this machine served to it by the cluster's file server, serves at its pod IP,
at its Service's ClusterIP (kube-proxy) and by its Service's DNS name (CoreDNS, asked from
inside the container); it runs as uid 65532; `kubectl logs` and `exec` work. (`kubeinfer
cluster up`'s namespace and what `down` leaves: test_cluster_command.)
"""

from __future__ import annotations

import errno
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cluster_harness import LocalCluster, file_url
from kubeinfer.cluster import control_plane
from waiting import wait_for

pytestmark = pytest.mark.slow
RUNTIME_IMAGE = "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0"
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


FETCH_AND_SERVE = (
    "import os, urllib.request; "
    "urllib.request.urlretrieve(os.environ['MODEL_URL'], '/tmp/model.onnx'); "
    "os.execvp('kubeinfer', ['kubeinfer', 'serve', '--onnx', '/tmp/model.onnx', "
    "'--model-name', 'tiny', '--host', '0.0.0.0', '--port', '8000'])"
)


def restricted_namespace(local_cluster: LocalCluster) -> str:
    namespace = local_cluster.new_namespace("real-node")
    local_cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    return namespace


def not_programmed_yet(reason: object) -> bool:
    """What connecting to a cluster IP gives before kube-proxy's rules for it exist."""
    return isinstance(reason, ConnectionRefusedError) or (
        isinstance(reason, OSError) and reason.errno == errno.EHOSTUNREACH
    )


def test_a_runtime_pod_serves_at_its_ip_its_cluster_ip_and_its_dns_name(
    local_cluster: LocalCluster, model_directory: Path
) -> None:
    from kubeinfer.cli.demo.mlp_models import build_tiny_mlp

    namespace = restricted_namespace(local_cluster)
    model = build_tiny_mlp(model_directory / f"{namespace}.onnx")
    kube = local_cluster.admin(namespace)
    labels = {"app": "tiny"}
    kube.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "tiny", "labels": labels},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "runtime", "image": RUNTIME_IMAGE, "imagePullPolicy": "Never",
                # Fetch the model the cluster's file server publishes, then serve it.
                "command": ["python", "-c", FETCH_AND_SERVE],
                "env": [{"name": "MODEL_URL", "value": file_url(model)}],
                "ports": [{"name": "http", "containerPort": 8000}],
                "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": 8000},
                                   "periodSeconds": 1},
                "securityContext": RESTRICTED,
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    })  # fmt: skip
    kube.create({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "tiny"},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": 8000}]},
    })  # fmt: skip

    def ready_pod():  # type: ignore[no-untyped-def]
        pod = kube.get("v1", "pods", "tiny")
        conditions = (pod or {}).get("status", {}).get("conditions") or []
        return (
            pod if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None
        )

    pod = wait_for(ready_pod, 180, "the runtime pod to be Ready", every=0.2)
    service = kube.get("v1", "services", "tiny")
    assert service is not None
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8000/v2/models/tiny") as answer:
        assert json.loads(answer.read())["name"] == "tiny"

    def through_the_cluster_ip() -> dict | None:  # type: ignore[type-arg]
        # kube-proxy refuses a Service's connections until it has programmed the
        # endpoint the EndpointSlice controller published for the Ready pod; before its
        # first sync of the Service there is no rule at all, the Service subnet's route
        # leads onto the bridge, and no one answers ARP for the cluster IP.
        try:
            url = f"http://{service['spec']['clusterIP']}/v2/models/tiny"
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.loads(response.read())  # type: ignore[no-any-return]
        except OSError as error:  # urllib's URLError among them, the socket's in `reason`
            if not_programmed_yet(
                error.reason if isinstance(error, urllib.error.URLError) else error
            ):
                return None
            raise

    answered = wait_for(through_the_cluster_ip, 60, "the Service to answer", every=0.2)
    assert answered["name"] == "tiny"

    name = f"tiny.{namespace}.svc.cluster.local"
    lookup = (
        "import json, urllib.request; "
        f"print(urllib.request.urlopen('http://{name}/v2/models/tiny', timeout=10).read().decode())"
    )
    answer = kube.kubectl("exec", "tiny", "--", "python", "-c", lookup)
    assert json.loads(answer)["name"] == "tiny"
    assert kube.kubectl("exec", "tiny", "--", "id", "-u").strip() == "65532"
    # ... a user with a name (kopf's identity, for one, asks for it).
    whoami = "import getpass; print(getpass.getuser())"
    assert kube.kubectl("exec", "tiny", "--", "python", "-c", whoami).strip() == "kubeinfer"
    assert "tiny" in kube.kubectl("logs", "tiny")


def test_gpus_are_an_extended_resource_the_scheduler_counts(local_cluster: LocalCluster) -> None:
    """`cluster up --gpus N` advertises `nvidia.com/gpu` (no device behind it): a pod asking
    for what the node has is scheduled; one asking for more waits Pending, Unschedulable,
    as on a cluster short of GPUs."""
    namespace = restricted_namespace(local_cluster)
    kube = local_cluster.admin(namespace)
    node = kube.get("v1", "nodes", "kubeinfer-node", namespace=None)
    assert node is not None
    had = int(node["status"]["capacity"].get("nvidia.com/gpu", "0"))
    control_plane.advertise_gpus(local_cluster.cluster, had + 1)

    def sleeper(name: str, gpus: int) -> dict:  # type: ignore[type-arg]
        container = {
            "name": "main", "image": RUNTIME_IMAGE, "imagePullPolicy": "Never",
            "command": ["sleep", "600"], "securityContext": RESTRICTED,
            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
        }  # fmt: skip
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [container]}}  # fmt: skip

    def scheduled(name: str) -> dict | None:  # type: ignore[type-arg]
        pod = kube.get("v1", "pods", name) or {}
        conditions = {c["type"]: c for c in pod.get("status", {}).get("conditions") or []}
        return conditions.get("PodScheduled")

    try:
        kube.create(sleeper("fits", had + 1))
        kube.create(sleeper("too-many", had + 2))
        wait_for(lambda: (scheduled("fits") or {}).get("status") == "True", 120,
                 "the pod that fits bound", every=0.2)  # fmt: skip
        refused = wait_for(lambda: scheduled("too-many"), 120, "the other refused", every=0.2)
        assert (refused["status"], refused["reason"]) == ("False", "Unschedulable")
        assert "Insufficient nvidia.com/gpu" in refused["message"]
    finally:
        control_plane.advertise_gpus(local_cluster.cluster, had)
