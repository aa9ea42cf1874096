"""The real node: the project's images as containers of the real kubelet, containerd and
runc, in the cluster's own network namespace, and nothing added to the host's.

- A pod of the runtime image, under Pod Security Admission's `restricted` level, serves at
  its pod IP, at its Service's ClusterIP (kube-proxy) and by its Service's DNS name
  (CoreDNS, asked from inside another container); `kubectl logs` and `exec` work.
- `kubeinfer cluster up` beside the session's cluster makes a namespace of its own, with
  the API server at a forwarded 127.0.0.1 port; `cluster down` leaves no process, mount,
  cgroup or namespace behind, and the host's network namespace is the same before, during
  and after: links, addresses, routes, rules, iptables and nftables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_harness import LocalCluster, file_url
from kubeinfer.cluster import cgroups, control_plane, netns, teardown
from processes_left import processes_mentioning

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


def host_network_state() -> dict[str, str]:
    """What the host's network namespace holds, read from inside it."""
    host = netns.host_namespace()
    assert host is not None, "the test process did not leave the host's namespace"
    enter = ["nsenter", f"--net=/proc/{os.getpid()}/fd/{host}", "--"]
    commands = {
        "links": ["ip", "-o", "link", "show"],
        "addresses": ["ip", "-o", "address", "show"],
        "routes": ["ip", "route", "show", "table", "all"],
        "routes6": ["ip", "-6", "route", "show", "table", "all"],
        "rules": ["ip", "rule", "show"],
        "iptables": ["iptables-save"],
        "nftables": ["nft", "list", "ruleset"],
    }
    state = {}
    for name, argv in commands.items():
        result = subprocess.run(
            enter + argv,
            capture_output=True,
            text=True,
            timeout=30,
            pass_fds=(host,),
        )
        # iptables-save stamps the time of its run: the rules are what is compared.
        state[name] = "\n".join(
            line
            for line in (result.stdout + result.stderr).splitlines()
            if not line.startswith("#")
        )
    return state


def wait_for(what: str, check, timeout: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return found


def restricted_namespace(local_cluster: LocalCluster) -> str:
    namespace = local_cluster.new_namespace("real-node")
    local_cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    return namespace


def test_a_runtime_pod_serves_at_its_ip_its_cluster_ip_and_its_dns_name(
    local_cluster: LocalCluster, model_directory: Path
) -> None:
    from kubeinfer.runtime.demo_models import build_tiny_mlp

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

    pod = wait_for("the runtime pod to be Ready", ready_pod, timeout=180)
    service = kube.get("v1", "services", "tiny")
    assert service is not None
    for url in (
        f"http://{pod['status']['podIP']}:8000/v2/models/tiny",
        f"http://{service['spec']['clusterIP']}/v2/models/tiny",
    ):
        with urllib.request.urlopen(url, timeout=10) as response:
            assert json.loads(response.read())["name"] == "tiny", url

    name = f"tiny.{namespace}.svc.cluster.local"
    lookup = (
        "import json, urllib.request; "
        f"print(urllib.request.urlopen('http://{name}/v2/models/tiny', timeout=10).read().decode())"
    )
    answer = kube.kubectl("exec", "tiny", "--", "python", "-c", lookup)
    assert json.loads(answer)["name"] == "tiny"
    assert kube.kubectl("exec", "tiny", "--", "id", "-u").strip() == "65532"
    assert "tiny" in kube.kubectl("logs", "tiny")


def test_cluster_up_beside_another_leaves_the_host_untouched_and_down_leaves_nothing(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    before = host_network_state()
    directory = tmp_path / "second"
    up = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", "cluster", "up", "--directory", str(directory)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        kubeconfig = directory / "admin.kubeconfig"
        nodes = local_cluster.kubectl("--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "name")
        assert nodes.strip() == "node/kubeinfer-node"
        state, _ = json.loads((directory / control_plane.STATE_FILE).read_text()), None
        holder = next(p for p in state["processes"] if p["name"] == "namespace-holder")
        cluster_namespace = os.stat(f"/proc/{holder['pid']}/ns/net").st_ino
        assert cluster_namespace != os.stat("/proc/self/ns/net").st_ino
        assert host_network_state() == before
    finally:
        command = [sys.executable, "-m", "kubeinfer.cli", "cluster", "down"]
        down = subprocess.run(
            [*command, "--directory", str(directory)], capture_output=True, text=True, timeout=300
        )
    assert down.returncode == 0, down.stderr
    assert processes_mentioning(directory) == []
    assert teardown.mounts_under(directory) == []
    assert cgroups.cgroup_directories(control_plane.cgroup_root(directory)) == []
    in_namespace = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and _namespace_inode(pid) == cluster_namespace
    ]
    assert in_namespace == [], "the cluster's namespace outlived its processes"
    assert host_network_state() == before


def _namespace_inode(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None
