"""The serving pods as the autoscaler sees them: ready, starting, and how long pods take to
become ready. Pure.

Startup time is measured from this object's own pods (creation to their Ready condition),
since it is what the model's engine takes to load on these nodes, and nothing else knows
it: the autoscaler counts a starting pod as capacity on its way only for about that long.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kubeinfer.operator.state.build_attempt import parse_time
from kubeinfer.operator.state.observed import KubeObject
from kubeinfer.operator.state.scaling_inputs import ServingPods

RECENT_PODS = 20
"""How many of the most recently created ready pods the startup time is the median of."""


def _ready_since(pod: KubeObject) -> datetime | None:
    """When the pod last became Ready, or None while it is not ready."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") != "True":
                return None
            return parse_time(condition.get("lastTransitionTime"))
    return None


def _created(pod: KubeObject) -> datetime | None:
    return parse_time((pod.get("metadata") or {}).get("creationTimestamp"))


def startup_seconds(pods: Iterable[KubeObject]) -> float | None:
    """Median seconds from creation to Ready over the most recently created ready pods
    (a pod that was ready, then not, then ready again measures its last transition, which
    only overstates startup: the autoscaler then waits longer, never less)."""
    measured: list[tuple[datetime, float]] = []
    for pod in pods:
        created, ready = _created(pod), _ready_since(pod)
        if created is not None and ready is not None and ready >= created:
            measured.append((created, (ready - created).total_seconds()))
    if not measured:
        return None
    measured.sort(key=lambda item: item[0], reverse=True)
    return float(statistics.median(seconds for _, seconds in measured[:RECENT_PODS]))


def serving_pods(
    pods: Iterable[KubeObject], deployment: KubeObject | None, now: datetime
) -> ServingPods:
    """Counts the Deployment's pods (terminating ones left out: they are capacity going,
    not coming) and measures their startup."""
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    ready = [p for p in live if _ready_since(p) is not None]
    starting = [p for p in live if _ready_since(p) is None]
    ages = [(now - created).total_seconds() for p in starting if (created := _created(p))]
    desired: Any = ((deployment or {}).get("spec") or {}).get("replicas")
    return ServingPods(
        desired=desired if isinstance(desired, int) else len(live),
        ready=len(ready),
        starting=len(starting),
        oldest_starting_age_seconds=max(ages) if ages else None,
        startup_seconds=startup_seconds(live),
    )
