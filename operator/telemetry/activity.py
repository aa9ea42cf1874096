"""What the operator itself does, counted as it does it: reconcile passes and how long each
took from the trigger that queued it, its own API requests by verb, the watch events its
handlers took, and the queries it sent to a metrics source. The operator's /metrics
exports them (`exporter`), so its cost per object can be read off a running operator
(`tests/benchmarks/bench_fleet.py` does) and an alert can see a request storm.

Plain counters, no lock: everything runs on the operator's one event loop. kopf's own
requests (its watches and the lists that start them) go
through kopf's session, not the operator's client, so they are not among the requests.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from kubeinfer.contract import metric_series as series


@dataclass
class Histogram:
    """Cumulative-bucket counts, as Prometheus' classic histogram keeps them."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    observations: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.observations += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), the last bound +Inf."""
        running, result = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            result.append((bound, running))
        return result


@dataclass
class Activity:
    """The operator's counters since it started."""

    passes: Counter[str] = field(default_factory=Counter)
    """Reconcile passes by result: `ok`, `gone` (the object no longer exists), `invalid`
    (a spec the model refuses), `error` (a request failed; retried)."""
    pass_seconds: Histogram = field(
        default_factory=lambda: Histogram(series.OPERATOR_RECONCILE_DURATION.buckets)
    )
    """From the trigger that queued a pass to its end (waiting for the object's lock
    included: what a change waits before it is acted on)."""
    api_requests: Counter[str] = field(default_factory=Counter)
    """The operator's own API requests by verb (get, list, create, update, patch, delete)."""
    owner_reads: Counter[str] = field(default_factory=Counter)
    """A pass's reads of its InferenceDeployment, by where from: `cache` (the watch's
    index) or `api` (a GET)."""
    watch_events: Counter[str] = field(default_factory=Counter)
    """Watch events its handlers took, by resource plural."""
    metrics_queries: Counter[str] = field(default_factory=Counter)
    """Queries sent to a metrics source by kind: `prometheus` (one PromQL query),
    `prometheus_grouped` (one query answering many objects), `pod` (one pod's /metrics)."""

    def request(self, method: str, listing: bool) -> None:
        verb = {"GET": "list" if listing else "get", "POST": "create", "PUT": "update",
                "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())  # fmt: skip
        self.api_requests[verb] += 1

    @property
    def writes(self) -> int:
        return sum(n for verb, n in self.api_requests.items() if verb not in ("get", "list"))
