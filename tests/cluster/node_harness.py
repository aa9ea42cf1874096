"""Helpers of the node agent's tests on the session's real cluster: pods of the known
runtime image running small shell programs, waiting for what the API server reports, and
the local processes behind containers (`containerID` is `kubeinfer-local://PID`)."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cluster_harness import Kube, LocalCluster
from kubeinfer.cluster.processes import start_ticks

RUNTIME_IMAGE = "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0"
KubeObject = dict[str, Any]
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 90.0,
             interval: float = 0.1) -> T:  # fmt: skip
    """Polls `probe` until it returns something truthy, and returns that; an
    AssertionError naming `what` after `timeout` (generous: the machine is shared)."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def container(name: str = "main", command: list[str] | None = None, **fields: Any) -> KubeObject:
    spec: KubeObject = {"name": name, "image": RUNTIME_IMAGE, **fields}
    if command is not None:
        spec["command"] = command
    return spec


def sh(script: str, name: str = "main", **fields: Any) -> KubeObject:
    """A container running a shell script (an absolute program runs as it is)."""
    return container(name, ["/bin/sh", "-c", script], **fields)


def pod(name: str, *containers: KubeObject, restart_policy: str = "Always",
        **spec: Any) -> KubeObject:  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": restart_policy, "terminationGracePeriodSeconds": 5,
                 "containers": list(containers), **spec},
    }  # fmt: skip


def get_pod(kube: Kube, name: str) -> KubeObject | None:
    return kube.get("v1", "pods", name)


def container_status(pod: KubeObject | None, name: str = "main",
                     init: bool = False) -> KubeObject | None:  # fmt: skip
    key = "initContainerStatuses" if init else "containerStatuses"
    for status in ((pod or {}).get("status") or {}).get(key) or []:
        if status["name"] == name:
            return status
    return None


def condition(obj: KubeObject | None, kind: str) -> KubeObject | None:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item["type"] == kind:
            return item
    return None


def running_pid(status: KubeObject | None) -> int | None:
    """The pid of a running container's process (from its containerID), else None."""
    if not status or "running" not in (status.get("state") or {}):
        return None
    container_id = status.get("containerID") or ""
    if not container_id.startswith("kubeinfer-local://"):
        return None
    return int(container_id.removeprefix("kubeinfer-local://"))


def phase(pod: KubeObject | None) -> str | None:
    return ((pod or {}).get("status") or {}).get("phase")


def alive(pid: int, ticks: int | None = None) -> bool:
    """Whether the pid runs (a zombie does not), and is the process first seen with
    `ticks` (so a reused pid is not taken for it)."""
    now = start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


def command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").rstrip("\0").split("\0")


def pod_directory(cluster: LocalCluster, pod: KubeObject) -> Path:
    """Where the node keeps a pod's volumes, logs and termination messages."""
    meta = pod["metadata"]
    return (
        cluster.directory / "node" / "pods"
        / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
    )  # fmt: skip


def events_of(kube: Kube, name: str, reason: str | None = None) -> list[KubeObject]:
    return [
        e for e in kube.list("v1", "events")
        if e["involvedObject"].get("name") == name and (reason is None or e["reason"] == reason)
    ]  # fmt: skip


def pod_when(kube: Kube, name: str, what: str, predicate: Callable[[KubeObject], object],
             timeout: float = 90.0) -> KubeObject:  # fmt: skip
    """The pod, once `predicate` holds for it."""

    def probe() -> KubeObject | None:
        found = get_pod(kube, name)
        return found if found is not None and predicate(found) else None

    return wait_for(f"pod {name}: {what}", probe, timeout)


def pods_when(kube: Kube, selector: str, what: str,
              predicate: Callable[[list[KubeObject]], object],
              timeout: float = 90.0) -> list[KubeObject]:  # fmt: skip
    """The pods the label selector matches, once `predicate` holds for the list."""

    def probe() -> list[KubeObject] | None:
        found = kube.list("v1", "pods", label_selector=selector)
        return found if predicate(found) else None

    return wait_for(f"pods {selector}: {what}", probe, timeout)


def is_running(pod: KubeObject, name: str = "main") -> bool:
    return running_pid(container_status(pod, name)) is not None


def waiting_reason(pod: KubeObject, name: str = "main") -> str | None:
    state = (container_status(pod, name) or {}).get("state") or {}
    return (state.get("waiting") or {}).get("reason")


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """The IPv4 (address, port) pairs the process listens on: its socket inodes matched
    against the kernel's TCP table (a wildcard listener shows as 0.0.0.0)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    except OSError:
        return set()
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and inode in inodes:  # 0A: LISTEN
            address, port = local.split(":")
            ip = socket.inet_ntoa(struct.pack("<I", int(address, 16)))
            found.add((ip, int(port, 16)))
    return found
