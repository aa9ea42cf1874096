"""What the operator knows of the activator pods in one read: their addresses and, per
pod, the routes it has loaded and the requests it holds. Pure (the read is
`kube.activator`).

An object may go to zero only when every ready activator pod routes its Service: the
route table reaches the pods through a ConfigMap volume, which the kubelet refreshes on
its own schedule, so a route just written is not yet a route served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Route = tuple[str, str]
"""(namespace, Service name)."""


@dataclass(frozen=True)
class ActivatorPod:
    """One ready activator pod and what its /v2/activator answered."""

    name: str
    address: str
    held: Mapping[Route, int] = field(default_factory=dict)
    """Requests held, per route it has loaded (0 for a route with none held)."""
    error: str = ""
    """Why it could not be read ("" when it was)."""


@dataclass(frozen=True)
class ActivatorView:
    pods: tuple[ActivatorPod, ...] = ()
    error: str = ""
    """Why the pods could not be listed."""

    def addresses(self) -> tuple[str, ...]:
        return tuple(sorted(pod.address for pod in self.pods))

    def held(self, route: Route) -> int | None:
        """Requests held for `route` over the pods read; None when none was read."""
        read = [pod for pod in self.pods if not pod.error]
        return sum(pod.held.get(route, 0) for pod in read) if read else None

    def not_routing(self, route: Route) -> str:
        """Why `route` cannot go through the activator yet ("" when every ready pod
        serves it)."""
        if self.error:
            return f"the activator pods could not be listed: {self.error}"
        if not self.pods:
            return "no activator pod is ready (the chart's activator Deployment)"
        for pod in self.pods:
            if pod.error:
                return f"activator pod {pod.name} could not be read: {pod.error}"
            if route not in pod.held:
                return f"activator pod {pod.name} has not loaded this object's route yet"
        return ""


def pod_of(name: str, address: str, answer: Any) -> ActivatorPod:
    """An activator pod from its /v2/activator JSON (`{"routes": [{"namespace",
    "service", "held", ...}]}`); a body of another shape is the pod's error."""
    routes = answer.get("routes") if isinstance(answer, dict) else None
    if not isinstance(routes, list):
        return ActivatorPod(name, address, error="its /v2/activator is not a route list")
    held: dict[Route, int] = {}
    for entry in routes:
        try:
            key = (str(entry["namespace"]), str(entry["service"]))
            count = int(entry.get("held", 0))
        except (KeyError, TypeError, ValueError, AttributeError):
            return ActivatorPod(name, address, error=f"a route it lists is malformed: {entry!r}")
        if count < 0:
            return ActivatorPod(name, address, error=f"it says {count} requests are held")
        held[key] = count
    return ActivatorPod(name, address, held)


def ready_pods(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(name, IP) of the pods that are Ready and not terminating."""
    found = []
    for pod in pods:
        metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if ready and status.get("podIP") and not metadata.get("deletionTimestamp"):
            found.append((str(metadata.get("name")), str(status["podIP"])))
    return sorted(found)


def parse_wake(body: Any) -> tuple[str, str] | None:
    """(namespace, Service) of a wake's JSON body; None for one of another shape."""
    if not isinstance(body, dict):
        return None
    namespace, service = body.get("namespace"), body.get("service")
    if isinstance(namespace, str) and isinstance(service, str) and namespace and service:
        return namespace, service
    return None
