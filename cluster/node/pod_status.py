"""What the kubelet would report for a pod, from what its containers did. Pure.

The rules follow the kubelet's `getPhase` and its condition generators: a pod is Pending
while an init container has not succeeded or a container has never started; Running once
every container has started (restarting ones included); Succeeded or Failed once every
container has terminated and none will be restarted. Ready needs every container ready;
`PodReadyToStartContainers` is true once the sandbox (here: the volumes) is set up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ContainerView:
    """One container as the node agent tracks it; `state`/`last_state` are the API's
    ContainerState objects (`{"waiting": …}`, `{"running": …}` or `{"terminated": …}`)."""

    name: str
    image: str
    state: dict[str, Any]
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    will_restart: bool = False
    """Terminated, with a restart to come (restartPolicy Always, or OnFailure after a
    failure)."""
    container_id: str = ""

    @property
    def terminated(self) -> dict[str, Any] | None:
        return self.state.get("terminated")

    def to_api(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": f"kubeinfer-local://{self.image}",
            "state": self.state,
            "lastState": self.last_state,
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.started,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def _condition(
    kind: str,
    true: bool,
    now: str,
    reason: str | None = None,
    previous: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status = "True" if true else "False"
    before = (previous or {}).get(kind)
    since = before["lastTransitionTime"] if before and before.get("status") == status else now
    condition: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": since,
    }
    if reason and not true:
        condition["reason"] = reason
    return condition


def phase(init: list[ContainerView], containers: list[ContainerView], restart_policy: str) -> str:
    """The kubelet's `getPhase`, for containers that are all known (none Unknown)."""
    for container in init:
        terminated = container.terminated
        if terminated is not None and terminated.get("exitCode") == 0:
            continue
        if terminated is not None and not container.will_restart:
            return "Failed"
        return "Pending"
    running = waiting = stopped = succeeded = 0
    for container in containers:
        if container.state.get("running") is not None:
            running += 1
        elif container.terminated is not None:
            stopped += 1
            succeeded += container.terminated.get("exitCode") == 0
        elif container.last_state.get("terminated") is not None:
            stopped += 1  # waiting to restart after it ran: not pending again
        else:
            waiting += 1
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if restart_policy == "Always" or any(c.will_restart for c in containers):
        return "Running"
    return "Succeeded" if stopped == succeeded else "Failed"


def pod_status(
    *,
    init: list[ContainerView],
    containers: list[ContainerView],
    restart_policy: str,
    volumes_ready: bool,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    now: str,
    previous_conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The pod's `status` (without PodScheduled, which the binding set)."""
    previous = {c["type"]: c for c in previous_conditions or []}
    initialized = all(c.terminated is not None and c.terminated.get("exitCode") == 0 for c in init)
    containers_ready = bool(containers) and all(c.ready for c in containers)
    not_ready = "ContainersNotReady"
    conditions = [
        _condition("PodReadyToStartContainers", volumes_ready, now, None, previous),
        _condition("Initialized", initialized, now, "ContainersNotInitialized", previous),
        _condition("ContainersReady", containers_ready, now, not_ready, previous),
        _condition("Ready", containers_ready, now, not_ready, previous),
    ]
    status: dict[str, Any] = {
        "phase": phase(init, containers, restart_policy),
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [c.to_api() for c in containers],
    }
    if init:
        status["initContainerStatuses"] = [c.to_api() for c in init]
    if volumes_ready:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status
