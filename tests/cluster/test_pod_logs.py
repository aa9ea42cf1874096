"""`kubectl logs` on the local node, through the real API server: the API server proxies
to the node agent's kubelet endpoint (TLS, its client certificate required), which serves
each container's log files: the current container's, `--previous` (the one before a
restart) and `--tail`."""

from __future__ import annotations

import time

import pytest
from cluster_harness import LocalCluster

pytestmark = pytest.mark.slow


def test_kubectl_logs_reads_the_containers_output_and_the_previous_one(
    local_cluster: LocalCluster,
) -> None:
    namespace = local_cluster.new_namespace("pod-logs")
    kube = local_cluster.admin(namespace)
    try:
        kube.create({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fails"},
            "spec": {"restartPolicy": "OnFailure", "containers": [{
                "name": "main", "image": "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0",
                "command": ["kubeinfer"], "args": ["validate", "/no/such/manifest.yaml"]}]},
        })  # fmt: skip
        deadline = time.monotonic() + 90
        while True:
            pod = kube.get("v1", "pods", "fails")
            statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
            if statuses and statuses[0]["restartCount"] >= 2:
                break  # two containers have run and ended: the latest, and the one before
            assert time.monotonic() < deadline, pod
            time.sleep(0.5)
        current = kube.kubectl("logs", "fails")
        assert "/no/such/manifest.yaml: cannot read" in current
        previous = kube.kubectl("logs", "fails", "--previous")
        assert "/no/such/manifest.yaml: cannot read" in previous
        assert kube.kubectl("logs", "fails", "--tail=0") == ""
        missing = kube.kubectl("logs", "fails", "-c", "nope", check=False)
        assert "nope" in missing
    finally:
        local_cluster.admin().delete("v1", "namespaces", namespace, namespace=None)
