"""The node agent as a kubelet, on the session's real cluster, with real processes: a
Deployment of the runtime image scaled to three runs three `kubeinfer serve` processes,
each on its own pod address, and scaled back to one stops two; a killed container is
restarted under restartPolicy Always (restartCount + 1, lastState.terminated) and left
terminated under Never; Job pods report exit codes and termination messages (the file,
or the log's tail with FallbackToLogsOnError) and OnFailure restarts until success; an
init container runs once before the containers; readiness follows the readinessProbe;
env holds the downward API, configMapKeyRef and `$(VAR)` references; and an unknown
image waits in ErrImagePull, then ImagePullBackOff, with the pull error's message."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from cluster_harness import Kube
from kubeinfer.cluster.processes import start_ticks
from kubeinfer.runtime.demo_models import build_tiny_mlp
from node_harness import (
    RUNTIME_IMAGE,
    alive,
    command_line,
    condition,
    container,
    container_status,
    events_of,
    get_pod,
    is_running,
    listening_addresses,
    phase,
    pod,
    pod_directory,
    pod_when,
    pods_when,
    running_pid,
    sh,
    wait_for,
    waiting_reason,
)

SLEEP = ["/bin/sleep", "3600"]


def is_ready(pod: dict[str, Any]) -> bool:
    return (condition(pod, "Ready") or {}).get("status") == "True"


def ready_count(count: int) -> Any:
    return lambda pods: sum(is_ready(p) and not p["metadata"].get("deletionTimestamp")
                            for p in pods) == count  # fmt: skip


def test_a_deployment_scaled_to_three_runs_three_processes_and_back_to_one_stops_two(
    kube: Kube, model_directory: Path
) -> None:
    model = build_tiny_mlp(model_directory / "scaled-tiny.onnx")
    serve = container(
        "runtime",
        args=["serve", "--onnx", str(model), "--model-name", "tiny", "--model-version", "1",
              "--port", "8000", "--intra-op-threads", "1"],
        ports=[{"name": "http", "containerPort": 8000}],
        readinessProbe={"httpGet": {"path": "/v2/health/ready", "port": "http"},
                        "periodSeconds": 1},
    )  # fmt: skip
    kube.create({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "tiny"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "tiny"}},
                 "template": {"metadata": {"labels": {"app": "tiny"}},
                              "spec": {"containers": [serve],
                                       "terminationGracePeriodSeconds": 10}}},
    })  # fmt: skip
    pods_when(kube, "app=tiny", "one ready", ready_count(1))

    kube.kubectl("scale", "deployment/tiny", "--replicas=3")
    pods = pods_when(kube, "app=tiny", "three ready", ready_count(3))
    pids = {p["metadata"]["name"]: running_pid(container_status(p, "runtime")) for p in pods}
    assert None not in pids.values() and len(set(pids.values())) == 3, pids
    ticks = {name: start_ticks(pid) for name, pid in pids.items() if pid is not None}
    for pid in pids.values():
        assert pid is not None and "serve" in command_line(pid), pid
    # Each pod's process listens on its own address (its wildcard bind made the pod's
    # address, as in a network namespace of its own), and answers there.
    addresses = {p["status"]["podIP"] for p in pods}
    assert len(addresses) == 3, addresses
    for p in pods:
        pid = pids[p["metadata"]["name"]]
        assert listening_addresses(pid or 0) == {(p["status"]["podIP"], 8000)}, pid
        url = f"http://{p['status']['podIP']}:8000/v2/health/ready"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200

    kube.kubectl("scale", "deployment/tiny", "--replicas=1")
    [survivor] = pods_when(kube, "app=tiny", "down to one", lambda pods: len(pods) == 1)
    kept = survivor["metadata"]["name"]
    assert kept in pids, "scaling down started a new pod"
    stopped = {pids[n]: ticks[n] for n in pids if n != kept}
    wait_for("the scaled-down pods' processes to end",
             lambda: not any(alive(pid, t) for pid, t in stopped.items() if pid))  # fmt: skip
    assert alive(pids[kept] or 0, ticks[kept])
    assert container_status(survivor, "runtime")["restartCount"] == 0  # type: ignore[index]


def test_a_killed_container_is_restarted_under_restart_policy_always(kube: Kube) -> None:
    kube.create(pod("always", container(command=SLEEP)))
    first = running_pid(container_status(pod_when(kube, "always", "running", is_running)))
    assert first is not None
    ticks = start_ticks(first)

    os.kill(first, signal.SIGKILL)
    restarted = pod_when(
        kube, "always", "restarted once",
        lambda p: container_status(p)["restartCount"] == 1 and is_running(p),  # type: ignore[index]
    )  # fmt: skip
    status = container_status(restarted)
    assert status is not None
    second = running_pid(status)
    assert second is not None and second != first and alive(second)
    assert not alive(first, ticks)
    last = status["lastState"]["terminated"]
    assert last["exitCode"] == 137 and last["reason"] == "Error", last
    assert last["containerID"] == f"kubeinfer-local://{first}"
    assert phase(restarted) == "Running"
    assert events_of(kube, "always", "BackOff"), "no BackOff event for the restart"


def test_a_killed_container_stays_terminated_under_restart_policy_never(kube: Kube) -> None:
    kube.create(pod("never", container(command=SLEEP), restart_policy="Never"))
    pid = running_pid(container_status(pod_when(kube, "never", "running", is_running)))
    assert pid is not None

    os.kill(pid, signal.SIGTERM)
    failed = pod_when(kube, "never", "Failed", lambda p: phase(p) == "Failed")
    assert container_status(failed)["state"]["terminated"]["exitCode"] == 143  # type: ignore[index]
    # Longer than the node's crash-loop back-off (2 s in the session): no restart came.
    time.sleep(3)
    status = container_status(get_pod(kube, "never"))
    assert status is not None and status["restartCount"] == 0
    assert "terminated" in status["state"] and status["lastState"] == {}


def job(name: str, *containers: dict[str, Any], restart_policy: str, backoff_limit: int = 0,
        **pod_spec: Any) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": backoff_limit, "template": {"spec": {
            "restartPolicy": restart_policy, "containers": list(containers),
            "terminationGracePeriodSeconds": 5, **pod_spec}}},
    }  # fmt: skip


def job_condition(kube: Kube, name: str, kind: str) -> dict[str, Any] | None:
    found = condition(kube.get("batch/v1", "jobs", name), kind)
    return found if found and found["status"] == "True" else None


def test_job_pods_report_exit_codes_and_termination_messages(kube: Kube) -> None:
    on_error = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    kube.create(job(
        "report",
        sh("printf 'model not found' > /dev/termination-log; exit 3", "file"),
        sh("echo loading; echo 'out of memory' >&2; exit 4", "logs", **on_error),
        sh("echo all good; exit 0", "quiet", **on_error),
        restart_policy="Never",
    ))  # fmt: skip
    wait_for("the Job to fail", lambda: job_condition(kube, "report", "Failed"))
    [failed] = kube.list("v1", "pods", label_selector="job-name=report")
    assert phase(failed) == "Failed"
    ended = {s["name"]: s["state"]["terminated"] for s in failed["status"]["containerStatuses"]}
    assert ended["file"]["exitCode"] == 3 and ended["file"]["reason"] == "Error"
    assert ended["file"]["message"] == "model not found"
    assert ended["logs"]["exitCode"] == 4 and ended["logs"]["reason"] == "Error"
    assert ended["logs"]["message"].split("\n")[:2] == ["loading", "out of memory"]
    # The log becomes the message only on failure.
    assert ended["quiet"]["exitCode"] == 0 and ended["quiet"]["reason"] == "Completed"
    assert "message" not in ended["quiet"]


def test_a_job_pod_under_on_failure_restarts_until_it_succeeds(kube: Kube) -> None:
    # The emptyDir outlives the container's restarts, so the second run finds the mark.
    script = (
        "if [ -e /work/tried ]; then echo second > /dev/termination-log; exit 0; fi; "
        "touch /work/tried; exit 1"
    )
    kube.create(job(
        "retry", sh(script, volumeMounts=[{"name": "work", "mountPath": "/work"}]),
        restart_policy="OnFailure", volumes=[{"name": "work", "emptyDir": {}}],
        backoff_limit=2,  # the Job controller counts an OnFailure pod's restarts against it
    ))  # fmt: skip
    wait_for("the Job to complete", lambda: job_condition(kube, "retry", "Complete"))
    [done] = kube.list("v1", "pods", label_selector="job-name=retry")
    status = container_status(done)
    assert status is not None and phase(done) == "Succeeded"
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert status["state"]["terminated"]["exitCode"] == 0
    assert status["state"]["terminated"]["message"] == "second\n"


def test_an_init_container_runs_once_before_the_containers(kube: Kube) -> None:
    work = [{"name": "work", "mountPath": "/work"}]
    kube.create(pod(
        "initialized", container(command=SLEEP, volumeMounts=work),
        initContainers=[sh("echo initialized >> /work/flag", "prepare", volumeMounts=work)],
        volumes=[{"name": "work", "emptyDir": {}}],
    ))  # fmt: skip
    running = pod_when(kube, "initialized", "running after its init container", is_running)
    assert (condition(running, "Initialized") or {}).get("status") == "True"
    init = container_status(running, "prepare", init=True)
    assert init is not None and init["state"]["terminated"]["exitCode"] == 0
    assert init["state"]["terminated"]["reason"] == "Completed"
    # Longer than the back-off: an init container that succeeded is not run again,
    # whatever the pod's restartPolicy (Always here).
    time.sleep(3)
    again = get_pod(kube, "initialized")
    assert container_status(again, "prepare", init=True)["restartCount"] == 0  # type: ignore[index]
    assert phase(again) == "Running"
    flag = pod_directory(kube.cluster, running) / "volumes" / "work" / "flag"
    assert flag.read_text() == "initialized\n"


def test_readiness_follows_the_readiness_probe(kube: Kube) -> None:
    kube.create(pod(
        "probed", container(
            command=SLEEP, volumeMounts=[{"name": "tmp", "mountPath": "/tmp"}],
            readinessProbe={"exec": {"command": ["/bin/sh", "-c", "test -e /tmp/ready"]},
                            "periodSeconds": 1, "failureThreshold": 1},
        ),
        volumes=[{"name": "tmp", "emptyDir": {}}],
    ))  # fmt: skip
    started = pod_when(kube, "probed", "running", is_running)
    pid = running_pid(container_status(started))
    wait_for("the failed probe's event", lambda: events_of(kube, "probed", "Unhealthy"))
    assert not is_ready(get_pod(kube, "probed") or {})
    # The probe's command sees the pod's /tmp: the emptyDir's directory on the node.
    marker = pod_directory(kube.cluster, started) / "volumes" / "tmp" / "ready"

    marker.touch()
    ready = pod_when(kube, "probed", "Ready once the probe passes", is_ready)
    assert container_status(ready)["ready"] is True  # type: ignore[index]
    marker.unlink()
    unready = pod_when(kube, "probed", "not Ready once it fails", lambda p: not is_ready(p))
    # A failing readiness probe never restarts the container.
    status = container_status(unready)
    assert status is not None and status["restartCount"] == 0 and running_pid(status) == pid
    assert condition(unready, "Ready")["reason"] == "ContainersNotReady"  # type: ignore[index]


def test_env_holds_the_downward_api_config_map_keys_and_references(kube: Kube) -> None:
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "greeting"},
                 "data": {"text": "hello"}})  # fmt: skip
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "GREETING",
         "valueFrom": {"configMapKeyRef": {"name": "greeting", "key": "text"}}},
        {"name": "MESSAGE", "value": "$(GREETING) from $(POD_NAME), $$(NOT_EXPANDED)"},
    ]  # fmt: skip
    script = 'printf "%s|%s|%s" "$MESSAGE" "$POD_IP" "$NODE" > /dev/termination-log'
    kube.create(pod("env", sh(script, env=env), restart_policy="Never"))
    done = pod_when(kube, "env", "Succeeded", lambda p: phase(p) == "Succeeded")
    message = container_status(done)["state"]["terminated"]["message"]  # type: ignore[index]
    pod_ip, node = done["status"]["podIP"], done["spec"]["nodeName"]
    assert message == f"hello from env, $(NOT_EXPANDED)|{pod_ip}|{node}"

    missing = [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "greeting",
                                                               "key": "absent"}}}]  # fmt: skip
    kube.create(pod("misconfigured", container(command=SLEEP, env=missing)))
    waiting = pod_when(kube, "misconfigured", "CreateContainerConfigError",
                       lambda p: waiting_reason(p) == "CreateContainerConfigError")  # fmt: skip
    assert container_status(waiting)["state"]["waiting"]["message"] == (  # type: ignore[index]
        f"couldn't find key absent in ConfigMap {kube.namespace}/greeting"
    )


def test_an_unknown_image_waits_in_image_pull_back_off_with_the_pull_error(kube: Kube) -> None:
    kube.create(pod("unknown", container(image="nginx:1.27", command=SLEEP)))

    def message(pod: dict[str, Any]) -> str:
        return str(container_status(pod)["state"]["waiting"]["message"])  # type: ignore[index]

    pulled = message(pod_when(kube, "unknown", "ErrImagePull",
                              lambda p: waiting_reason(p) == "ErrImagePull"))  # fmt: skip
    assert pulled.startswith('Failed to pull image "nginx:1.27": ')
    assert RUNTIME_IMAGE.split(":")[0] in pulled  # says which images it can run
    backing_off = pod_when(kube, "unknown", "ImagePullBackOff",
                           lambda p: waiting_reason(p) == "ImagePullBackOff")  # fmt: skip
    assert message(backing_off) == pulled
    assert phase(backing_off) == "Pending"
    [event, *_] = events_of(kube, "unknown", "Failed")
    assert event["type"] == "Warning" and event["message"] == pulled
