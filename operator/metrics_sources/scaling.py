"""`read_scaling_signals`: the autoscaler's figures for one InferenceDeployment, from
either metrics source, in one read.

Three named queries: `requests_in_progress_per_replica` (the load signal: the mean over the pods of
`kubeinfer_requests_in_progress`, requests received and not yet answered, whatever they
wait on), `gpu_memory_used_ratio` (memory pressure) and `request_p99_seconds` (for the
status only). The object's `spec.monitoring.queries` may replace the first two's PromQL;
the direct read ignores that (an override is PromQL, which only Prometheus evaluates) and
applies the built-in form.

A source that shares the signals' reads across objects (`SharedScalingSource`: the
operator's Prometheus, `shared_reads`) answers those an object does not override from
one query per signal for every object, kept for a pass; the figures are the per-object
queries' own, at most one pass older.

A source that cannot answer gives signals with `error` set and no figures, never an
exception: the recommender then holds the count, as the HorizontalPodAutoscaler does when
its metrics are missing. A figure with no series is None without an error: pods without a
GPU export no GPU memory, and that is normal. A figure outside what it can mean (a used
ratio above 1, a negative depth, infinity) is set aside with a sentence saying so, and the
other figures still count: one mislabelled series must not stop scaling on the others.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.inference_deployment import MonitoringSpec, QueryOverrides
from kubeinfer.operator.metrics_sources import queries as q
from kubeinfer.operator.metrics_sources.queries import Query, Scope
from kubeinfer.operator.metrics_sources.source import (
    MetricsSource,
    MetricsUnavailable,
    SharedScalingSource,
)
from kubeinfer.operator.state.scaling_inputs import ScalingSignals

P99_WINDOW_SECONDS = 120
"""The request p99's rate window: four scrape intervals of the common 30 s, so rate()
has samples to work with whatever the scrape phase."""

OVERRIDES_PATH = "spec.monitoring." + (MonitoringSpec.model_fields["queries"].alias or "queries")
"""Where the overrides live in the object, for messages."""

_OVERRIDABLE = (
    (q.REQUESTS_IN_PROGRESS_PER_REPLICA, "requests_in_progress_per_replica"),
    (q.GPU_MEMORY_USED_RATIO, "gpu_memory_used_ratio"),
)
"""Each overridable row and its `QueryOverrides` field."""


def scaling_queries(
    scope: Scope, overrides: QueryOverrides, p99_window_seconds: int = P99_WINDOW_SECONDS
) -> list[Query]:
    """(requests in progress per replica, GPU memory used ratio, request p99) over `scope`, with
    the object's PromQL where it sets one. Pure."""
    bound = []
    for row, attribute in _OVERRIDABLE:
        query = row.bind(scope)
        template = getattr(overrides, attribute)
        if template:
            alias = QueryOverrides.model_fields[attribute].alias or attribute
            query = query.overridden(template, f"{OVERRIDES_PATH}.{alias}")
        bound.append(query)
    bound.append(q.REQUEST_P99.bind(scope, window_seconds=p99_window_seconds))
    return bound


async def read_scaling_signals(
    source: MetricsSource,
    scope: Scope,
    overrides: QueryOverrides,
    now: datetime,
    p99_window_seconds: int = P99_WINDOW_SECONDS,
) -> ScalingSignals:
    """The serving pods' scaling signals at `now`; `error` (the source's description and
    its message) instead of figures when the source cannot answer."""
    queries = scaling_queries(scope, overrides, p99_window_seconds)
    try:
        if isinstance(source, SharedScalingSource) and source.shares_scaling_reads:
            figures = await source.evaluate_scaling(queries, now, p99_window_seconds)
        else:
            figures = await source.evaluate(queries, now)
        depth, gpu_ratio, p99 = figures
    except MetricsUnavailable as error:
        return ScalingSignals(error=f"{source.description}: {error}")
    signals = checked_signals(depth, gpu_ratio, p99, source.description)
    window = p99_window_seconds if source.answers_windows else None
    return replace(signals, p99_window_seconds=window)


VALID_RANGES = {
    "requests in progress per replica": (0.0, math.inf),
    "GPU memory used ratio": (0.0, 1.0),
    "p99 latency (seconds)": (0.0, math.inf),
}
"""What each figure can mean; a reading outside its range is not a measurement."""


def checked_signals(
    depth: float | None, gpu_ratio: float | None, p99: float | None, where: str
) -> ScalingSignals:
    """The signals with every reading outside its range (or not finite) set aside. Pure."""
    readings = dict(zip(VALID_RANGES, (depth, gpu_ratio, p99), strict=True))
    notes = []
    for name, value in readings.items():
        low, high = VALID_RANGES[name]
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            bounds = f"{low:g}..{high:g}" if math.isfinite(high) else f"at least {low:g}"
            notes.append(f"{where} gave a {name} of {value:g}, which must be {bounds}: set aside")
            readings[name] = None
    depth, gpu_ratio, p99 = readings.values()
    return ScalingSignals(
        requests_in_progress_per_replica=depth, gpu_memory_used_ratio=gpu_ratio, p99_seconds=p99,
        set_aside=tuple(notes),
    )  # fmt: skip
