"""What the real node costs: `cluster up` to Ready, a runtime pod's apply-to-Ready, and the
memory of the node's processes (a benchmark script, not a test).

    .venv/bin/python tests/benchmarks/bench_node.py [--pods 5]

Builds nothing (run `kubeinfer cluster build` first). Runs in a network namespace of its own,
as the tests do, with the cluster in it: `up` to Ready with CoreDNS and storage; then, one
after another, `--pods` pods of the runtime image serving a small model that the cluster's
file server publishes, each timed from its creation to Ready (its readiness probe passing);
then each node process' resident memory (kubelet, containerd and its shims, kube-proxy,
kube-scheduler, CoreDNS, the provisioner) and the pods' own, from /proc.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.cluster import cgroups, control_plane, files, netns

FETCH_AND_SERVE = (
    "import os, urllib.request; "
    "urllib.request.urlretrieve(os.environ['MODEL_URL'], '/tmp/model.onnx'); "
    "os.execvp('kubeinfer', ['kubeinfer', 'serve', '--onnx', '/tmp/model.onnx', "
    "'--model-name', 'tiny', '--host', '0.0.0.0', '--port', '8000'])"
)
RESTRICTED = {
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}  # fmt: skip


def pod(name: str, model_url: str) -> dict[str, object]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "containers": [{
                "name": "runtime", "image": "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0",
                "imagePullPolicy": "Never", "command": ["python", "-c", FETCH_AND_SERVE],
                "env": [{"name": "MODEL_URL", "value": model_url}],
                "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": 8000},
                                   "periodSeconds": 1},
                "securityContext": RESTRICTED,
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }  # fmt: skip


def ready(cluster: control_plane.Cluster, name: str) -> bool:
    status, body = cluster.get(f"/api/v1/namespaces/default/pods/{name}")
    if status != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def resident_mebibytes(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def memory_by_process(directory: Path) -> dict[str, float]:
    """MiB resident per node process (the state file's), the shims' and the pods'."""
    started, _ = control_plane.processes.read_state(directory / control_plane.STATE_FILE)
    found = {p.name: resident_mebibytes(p.pid) for p in started
             if control_plane.processes.is_running(p)}  # fmt: skip
    socket = str(control_plane.node_directory(directory) / "containerd" / "containerd.sock")
    shims = control_plane.teardown.processes_naming(socket)
    found["containerd shims (all)"] = sum(resident_mebibytes(p) for p in shims)
    pods = cgroups.cgroup_processes(control_plane.cgroup_root(directory))
    found["pods' processes (all)"] = sum(resident_mebibytes(p) for p in pods)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5)
    args = parser.parse_args()
    netns.enter_new_namespace()
    with tempfile.TemporaryDirectory(prefix="bench-node-") as scratch:
        directory = Path(scratch) / "cluster"
        started = time.monotonic()
        cluster = control_plane.up(directory, in_this_namespace=True, progress=lambda _: None)
        up_seconds = time.monotonic() - started
        try:
            url = files.publish(directory, build_tiny_mlp(Path(scratch) / "tiny.onnx"))
            times = []
            for index in range(args.pods):
                name = f"tiny-{index}"
                created = time.monotonic()
                control_plane.kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(pod(name, url)))
                while not ready(cluster, name):
                    time.sleep(0.05)
                times.append(time.monotonic() - created)
            memory = memory_by_process(directory)
        finally:
            control_plane.down(directory)
    print(f"cluster up to Ready (CoreDNS, storage): {up_seconds:.1f} s")
    print(f"pod apply-to-Ready over {args.pods} pods: median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s, max {max(times):.2f} s")  # fmt: skip
    print("resident memory, MiB:")
    for name, mebibytes in sorted(memory.items(), key=lambda item: -item[1]):
        print(f"  {name:32} {mebibytes:8.1f}")


if __name__ == "__main__":
    main()
