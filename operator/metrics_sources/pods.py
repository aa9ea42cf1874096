"""Where to read each serving pod's /metrics, from the Pod objects the API lists. Pure.

A pod counts as serving when its Ready condition is True; the others (starting, draining,
failed) are left out, as the Service leaves them out of its endpoints. A serving pod the
operator cannot address (no IP yet, no container port named `http`) makes the read
unavailable rather than quietly smaller: a missing pod's counts would look like a drop
in traffic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.metrics_sources.source import MetricsUnavailable

HTTP_PORT_NAME = "http"
METRICS_PATH = "/metrics"


@dataclass(frozen=True)
class PodTarget:
    """One serving pod and the URL of its /metrics."""

    name: str
    url: str


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def http_port(pod: Mapping[str, Any]) -> int | None:
    """The container port named `http`, in any container of the pod."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == HTTP_PORT_NAME and port.get("containerPort"):
                return int(port["containerPort"])
    return None


def metrics_targets(pods: Iterable[Mapping[str, Any]]) -> list[PodTarget]:
    """The ready pods' /metrics URLs, sorted by pod name; raises MetricsUnavailable
    naming a ready pod that has no IP or no `http` port."""
    targets = []
    for pod in pods:
        if not is_ready(pod):
            continue
        name = str((pod.get("metadata") or {}).get("name") or "?")
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            raise MetricsUnavailable(f"pod {name} is ready but has no IP yet")
        port = http_port(pod)
        if port is None:
            raise MetricsUnavailable(
                f"pod {name} has no container port named {HTTP_PORT_NAME!r} to read "
                f"{METRICS_PATH} from"
            )
        host = f"[{ip}]" if ":" in ip else ip
        targets.append(PodTarget(name, f"http://{host}:{port}{METRICS_PATH}"))
    return sorted(targets, key=lambda target: target.name)
