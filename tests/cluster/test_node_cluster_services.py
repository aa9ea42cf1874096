"""The node agent as scheduler, volume manager and provisioner, and its graceful end of a
pod, on the session's real cluster: a pod asking for `nvidia.com/gpu` on a node without
GPUs stays Pending with PodScheduled=False (Unschedulable) and a FailedScheduling Event;
two pods that fit only one at a time are not both bound; a ConfigMap change reaches the
file a running container reads at its mount path; deletion runs the preStop sleep, then
SIGTERM, and SIGKILL at the end of the grace period the delete asked for, then the pod
object goes; a claim of the default class `local` is Bound and its files are shared by
two pods; and kubectl sees the Node and the pinned Kubernetes release."""

from __future__ import annotations

import json
import os
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Kube, LocalCluster
from kubeinfer.cluster.binaries import pinned_versions
from kubeinfer.cluster.node.scheduling import pod_requests, quantity
from kubeinfer.cluster.processes import start_ticks
from node_harness import (
    alive,
    condition,
    container,
    container_status,
    events_of,
    get_pod,
    is_running,
    phase,
    pod,
    pod_directory,
    pod_when,
    running_pid,
    sh,
    wait_for,
)

SLEEP = ["/bin/sleep", "3600"]
NODE = "kubeinfer-node"


def unschedulable(pod: dict[str, Any]) -> bool:
    scheduled = condition(pod, "PodScheduled") or {}
    return scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"


def test_a_gpu_pod_on_a_node_without_gpus_stays_pending_as_unschedulable(kube: Kube) -> None:
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    kube.create(pod("wants-gpu", container(command=SLEEP, resources=gpu)))
    pending = pod_when(kube, "wants-gpu", "PodScheduled=False", unschedulable)
    message = condition(pending, "PodScheduled")["message"]  # type: ignore[index]
    assert message == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    [event] = wait_for("a FailedScheduling event",
                       lambda: events_of(kube, "wants-gpu", "FailedScheduling"))  # fmt: skip
    assert event["type"] == "Warning" and event["message"] == message
    assert event["source"]["component"] == "default-scheduler"
    # Past the scheduler's retry (2 s): still not bound, still said once.
    time.sleep(3)
    still = get_pod(kube, "wants-gpu")
    assert still is not None and phase(still) == "Pending" and not still["spec"].get("nodeName")
    assert len(events_of(kube, "wants-gpu", "FailedScheduling")) == 1


def free_cpu(kube: Kube) -> Decimal:
    """What the node's allocatable CPU leaves after the requests of the pods bound to it."""
    node = kube.get("v1", "nodes", NODE, namespace=None)
    assert node is not None
    used = sum(
        (pod_requests(p["spec"]).get("cpu", Decimal(0))
         for p in kube.list("v1", "pods", namespace=None)
         if p["spec"].get("nodeName") == NODE and phase(p) not in ("Succeeded", "Failed")),
        Decimal(0),
    )  # fmt: skip
    return quantity(node["status"]["allocatable"]["cpu"]) - used


def test_two_pods_that_fit_only_one_at_a_time_are_not_both_bound(kube: Kube) -> None:
    # Created back to back, both are pending in the scheduler's same pass: the first one
    # bound must count against the second before the node has seen it run.
    free = free_cpu(kube)
    assert free >= Decimal("0.1"), f"the node has too little CPU free for this test: {free}"
    share = f"{int(free * 600)}m"  # 60 % of what is free: one fits, not two
    for name in ("first", "second"):
        kube.create(pod(name, container(command=SLEEP, resources={"requests": {"cpu": share}})))

    def decided() -> list[dict[str, Any]] | None:
        pods = [get_pod(kube, n) for n in ("first", "second")]
        done = all(p and (p["spec"].get("nodeName") or unschedulable(p)) for p in pods)
        return pods if done else None  # type: ignore[return-value]

    pods = wait_for("both pods scheduled or refused", decided)
    bound = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
    assert bound == ["first"], bound
    refused = condition(pods[1], "PodScheduled")["message"]  # type: ignore[index]
    assert refused == "0/1 nodes are available: 1 Insufficient cpu."

    # Once the first goes, the second fits and is bound.
    kube.delete("v1", "pods", "first", gracePeriodSeconds=0)
    pod_when(kube, "second", "bound once the first is gone", lambda p: p["spec"].get("nodeName"))


def test_a_config_map_change_reaches_the_file_the_container_reads(kube: Kube) -> None:
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                 "data": {"greeting": "hello", "path": "/etc/app/greeting"}})  # fmt: skip
    # The container copies what it reads at its mount path to its /tmp, every 0.1 s.
    script = (
        "while :; do cat /etc/app/greeting > /tmp/seen.new && mv /tmp/seen.new /tmp/seen; "
        "sleep 0.1; done"
    )
    kube.create(pod(
        "reader", sh(script, volumeMounts=[{"name": "config", "mountPath": "/etc/app"},
                                           {"name": "tmp", "mountPath": "/tmp"}]),
        volumes=[{"name": "config", "configMap": {"name": "settings"}},
                 {"name": "tmp", "emptyDir": {}}],
    ))  # fmt: skip
    reader = pod_when(kube, "reader", "running", is_running)
    directory = pod_directory(kube.cluster, reader)
    seen = directory / "volumes" / "tmp" / "seen"

    def content() -> str:
        try:
            return seen.read_text()
        except OSError:
            return ""

    wait_for("the container to read the first value", lambda: content() == "hello")
    # A mount path in the ConfigMap's text names the file where this node keeps it.
    mounted = directory / "volumes" / "config"
    assert (mounted / "path").read_text() == str(mounted / "greeting")

    kube.patch("v1", "configmaps", "settings", {"data": {"greeting": "bonjour"}})
    wait_for("the container to read the new value", lambda: content() == "bonjour")
    kube.patch("v1", "configmaps", "settings", {"data": {"path": None}})
    wait_for("a removed key's file to go", lambda: not (mounted / "path").exists())
    assert running_pid(container_status(get_pod(kube, "reader"))) == running_pid(
        container_status(reader)
    ), "a ConfigMap change must not restart the container"


@pytest.fixture
def output(tmp_path: Path) -> Path:
    """A host directory a container writes to (a hostPath volume at /out)."""
    tmp_path.chmod(0o777)
    return tmp_path


def test_deletion_runs_pre_stop_then_sigterm_then_removes_the_pod(kube: Kube, output: Path) -> None:
    # The container notes when SIGTERM arrives, in seconds since the epoch.
    script = (
        "trap 'date +%s.%N > /out/sigterm; exit 0' TERM; "
        "touch /out/started; while :; do sleep 0.1; done"
    )
    kube.create(pod(
        "graceful", sh(script, volumeMounts=[{"name": "out", "mountPath": "/out"}],
                       lifecycle={"preStop": {"sleep": {"seconds": 2}}}),
        volumes=[{"name": "out", "hostPath": {"path": str(output)}}],
        terminationGracePeriodSeconds=20,
    ))  # fmt: skip
    running = pod_when(kube, "graceful", "running", is_running)
    pid = running_pid(container_status(running))
    assert pid is not None
    ticks = start_ticks(pid)
    wait_for("the container to start its loop", lambda: (output / "started").exists())

    deleted_at = time.time()
    kube.delete("v1", "pods", "graceful")
    wait_for("the pod object to go", lambda: get_pod(kube, "graceful") is None, timeout=30)
    sigterm_at = float((output / "sigterm").read_text())
    # SIGTERM only after the preStop hook's 2 s, and well inside the 20 s grace period.
    assert 2.0 <= sigterm_at - deleted_at < 15, sigterm_at - deleted_at
    assert not alive(pid, ticks)
    assert events_of(kube, "graceful", "Killing")


def test_a_container_ignoring_sigterm_is_killed_when_the_deletes_grace_period_ends(
    kube: Kube,
) -> None:
    # SIG_IGN is inherited: the shell's `sleep` children ignore SIGTERM too.
    kube.create(pod("stubborn", sh("trap '' TERM; while :; do sleep 0.1; done"),
                    terminationGracePeriodSeconds=60))  # fmt: skip
    pid = running_pid(container_status(pod_when(kube, "stubborn", "running", is_running)))
    assert pid is not None
    ticks = start_ticks(pid)

    deleted_at = time.monotonic()
    # The delete's grace period (3 s) overrides the pod's 60 s.
    kube.delete("v1", "pods", "stubborn", gracePeriodSeconds=3)
    wait_for("the process to be killed", lambda: not alive(pid, ticks), timeout=30, interval=0.05)
    killed_after = time.monotonic() - deleted_at
    assert 2.5 <= killed_after < 10, killed_after
    wait_for("the pod object to go", lambda: get_pod(kube, "stubborn") is None, timeout=30)


def test_a_claim_of_the_default_class_is_bound_and_shared_by_two_pods(
    kube: Kube, local_cluster: LocalCluster
) -> None:
    kube.create({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    claim = wait_for(
        "the claim to be Bound",
        lambda: (c := kube.get("v1", "persistentvolumeclaims", "shared"))
        and (c.get("status") or {}).get("phase") == "Bound" and c,
    )  # fmt: skip
    assert claim["spec"]["storageClassName"] == "local"  # the default class, filled in
    volume = kube.get("v1", "persistentvolumes", claim["spec"]["volumeName"], namespace=None)
    assert volume is not None and volume["spec"]["claimRef"]["name"] == "shared"

    mount = {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}]
    kube.create(pod("writer", sh("echo written by writer > /data/note", **mount),
                    restart_policy="Never", volumes=volumes))  # fmt: skip
    kube.create(pod("reader", sh(
        "while [ ! -s /data/note ]; do sleep 0.1; done; "
        "cp /data/note /dev/termination-log; echo read by reader >> /data/note", **mount),
        restart_policy="Never", volumes=volumes))  # fmt: skip
    done = pod_when(kube, "reader", "Succeeded", lambda p: phase(p) == "Succeeded")
    assert phase(get_pod(kube, "writer")) == "Succeeded"
    terminated = container_status(done)["state"]["terminated"]  # type: ignore[index]
    assert terminated["message"] == "written by writer\n"
    files = local_cluster.claim_directory(kube.namespace, "shared")
    assert (files / "note").read_text() == "written by writer\nread by reader\n"


def test_kubectl_sees_the_ready_node_and_the_pinned_release(local_cluster: LocalCluster) -> None:
    release = pinned_versions().kubernetes
    assert release == "v1.36.3"
    header, *rows = local_cluster.kubectl("get", "nodes").splitlines()
    assert header.split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert [row.split()[:2] + row.split()[-1:] for row in rows] == [[NODE, "Ready", release]]
    versions = json.loads(local_cluster.kubectl("version", "-o", "json"))
    assert versions["clientVersion"]["gitVersion"] == release
    assert versions["serverVersion"]["gitVersion"] == release


def test_a_container_process_leads_a_session_of_its_own(kube: Kube) -> None:
    kube.create(pod("session", container(command=SLEEP)))
    pid = running_pid(container_status(pod_when(kube, "session", "running", is_running)))
    assert pid is not None
    # Its own session and process group, so a signal to the group reaches all it started.
    assert os.getsid(pid) == pid and os.getpgid(pid) == pid
