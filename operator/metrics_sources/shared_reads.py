"""Shared reads: the autoscaler's signals for every object one Prometheus answers
for, one grouped query per signal per pass, each object taking its own slice.

Read per object, three queries per autoscaled object and poll: with a thousand objects,
three thousand every poll. Here each signal's query selects the series of every pod and
keeps them per pod (`fleet_queries`); the source keeps the answer for a pass (the
autoscaler's poll: `fresh`), and each object's figure is computed from the series of its own
pods (its scope's pod regex, as the per-object query selects them) with the arithmetic
the per-object PromQL applies: the mean of per-pod sums, the largest per-pod ratio, the
p99 of the buckets summed over its pods (`figures`). Pure: the asking and keeping is
`PrometheusSource.evaluate_scaling`'s.

A signal whose PromQL the object overrides is not shared (it keeps its own query); the
pure decisions downstream see the same `ScalingSignals` either way.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from kubeinfer.contract import metric_series as series
from kubeinfer.operator.metrics_sources import queries as q
from kubeinfer.operator.metrics_sources.promql import MAX_GENERATED_NAME_BASE, TEMPLATE_HASH_MAX
from kubeinfer.operator.metrics_sources.queries import Query, Scope
from kubeinfer.operator.state import names

Groups = dict[tuple[str, ...], float]
"""One grouped answer: the values of its `by` labels -> the sample's value."""


@dataclass(frozen=True)
class FleetQuery:
    """One signal's query over every pod, grouped per pod (and bucket)."""

    name: str
    promql: str
    by: tuple[str, ...]

    @property
    def label(self) -> str:
        """How messages name it: the per-object row's name, for every object."""
        return f"{self.name} (shared by every object)"


def fleet_queries(p99_window_seconds: int) -> tuple[FleetQuery, FleetQuery, FleetQuery]:
    """(requests in progress, GPU memory used ratio, request duration buckets): the rows
    of `scaling.scaling_queries` over every pod, before their per-object aggregation."""
    pod = ("namespace", "pod")
    return (
        FleetQuery(q.REQUESTS_IN_PROGRESS_PER_REPLICA.name,
                   f"sum by (namespace, pod) ({q.REQUESTS_IN_PROGRESS_PER_REPLICA.metric})", pod),
        FleetQuery(q.GPU_MEMORY_USED_RATIO.name,
                   f"max by (namespace, pod) ({q.GPU_MEMORY_USED_RATIO.metric} / "
                   f"({q.GPU_MEMORY_USED_RATIO.denominator} > 0))", pod),
        FleetQuery(q.REQUEST_P99.name,
                   f"sum by (namespace, pod, le) "
                   f"(rate({q.REQUEST_P99.metric}_bucket[{int(p99_window_seconds)}s]))",
                   (*pod, "le")),
    )  # fmt: skip


@lru_cache(maxsize=4096)
def _pod_pattern(scope: Scope) -> re.Pattern[str]:
    return re.compile(scope.pod_regex)


def _cut(scope: Scope) -> bool:
    """Whether the scope's pod names may be cut (a long owner, `promql.deployment_pod_regex`):
    then they need not end in `<runtime name>-<hash>-<suffix>`, and its namespace's pods
    are all tried."""
    prefix = names.runtime_name(scope.owner) + "-"
    return MAX_GENERATED_NAME_BASE - len(prefix) - 1 < TEMPLATE_HASH_MAX


@dataclass
class PodSeries:
    """One grouped answer, indexed to find one object's pods without scanning the rest."""

    by_deployment: dict[tuple[str, str], list[tuple[str, tuple[str, ...], float]]]
    """(namespace, pod name less its last two parts) -> (pod, other labels, value)."""
    by_namespace: dict[str, list[tuple[str, tuple[str, ...], float]]]

    @staticmethod
    def of(groups: Groups) -> PodSeries:
        by_deployment: dict[tuple[str, str], list[tuple[str, tuple[str, ...], float]]]
        by_deployment = defaultdict(list)
        by_namespace: dict[str, list[tuple[str, tuple[str, ...], float]]] = defaultdict(list)
        for (namespace, pod, *rest), value in groups.items():
            entry = (pod, tuple(rest), value)
            by_deployment[(namespace, pod.rsplit("-", 2)[0])].append(entry)
            by_namespace[namespace].append(entry)
        return PodSeries(dict(by_deployment), dict(by_namespace))

    def of_scope(self, scope: Scope) -> list[tuple[tuple[str, ...], float]]:
        """The (other labels, value) of the scope's pods: those its regex matches."""
        if _cut(scope):
            candidates = self.by_namespace.get(scope.namespace, [])
        else:
            key = (scope.namespace, names.runtime_name(scope.owner))
            candidates = self.by_deployment.get(key, [])
        pattern = _pod_pattern(scope)
        return [(rest, value) for pod, rest, value in candidates if pattern.fullmatch(pod)]


def mean_per_pod(values: Sequence[tuple[tuple[str, ...], float]]) -> float | None:
    """`avg(...)` over the pods' sums; None where PromQL has no sample or NaN."""
    if not values:
        return None
    mean = math.fsum(v for _, v in values) / len(values)
    return None if math.isnan(mean) else mean


def largest(values: Sequence[tuple[tuple[str, ...], float]]) -> float | None:
    """`max(...)` over the pods' ratios: NaN only where every one is (PromQL's max)."""
    finite = [v for _, v in values if not math.isnan(v)]
    return max(finite) if finite else None


def p99_of_buckets(values: Sequence[tuple[tuple[str, ...], float]]) -> float | None:
    """`histogram_quantile(0.99, sum by (le) (...))` over the pods' bucket rates."""
    buckets: dict[float, float] = defaultdict(float)
    for (le,), rate in values:
        buckets[float(le)] += rate
    return series.histogram_quantile(0.99, sorted(buckets.items()))


REDUCE = (mean_per_pod, largest, p99_of_buckets)
"""Each fleet query's per-object aggregation, in `fleet_queries`' order."""


def fresh(fetched_at: datetime, now: datetime, max_age_seconds: float) -> bool:
    """Whether an answer fetched at `fetched_at` still serves a read at `now` (either
    side: passes overlap, and their `now` need not come in order)."""
    return abs((now - fetched_at).total_seconds()) < max_age_seconds


def figures(
    queries: Sequence[Query], answers: Sequence[PodSeries | float | None], window: int
) -> tuple[float | None, ...]:
    """The scope's figures, in `queries`' order, from each query's answer: a shared one's
    slice reduced as its per-object PromQL would, an overridden one's own value."""
    rows = dict(zip((f.name for f in fleet_queries(window)), REDUCE, strict=True))
    result: list[float | None] = []
    for query, answer in zip(queries, answers, strict=True):
        if isinstance(answer, PodSeries):
            result.append(rows[query.name](answer.of_scope(query.scope)))
        else:
            result.append(answer)
    return tuple(result)
