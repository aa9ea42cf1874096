"""`read_wake_signals`: what keeps an object with autoscaling.minReplicas 0 from zero pods
or wakes it, in one read: its pods' request counter, the activator's view of its route,
and at zero its wake query (PromQL, which only Prometheus evaluates).

Like the scaling signals, a source that cannot answer is said, never raised: an unread
counter keeps the pods (the zero step counts it as a request seen), an unread wake query
wakes nothing.
"""

from __future__ import annotations

import math
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.metrics_sources import queries as q
from kubeinfer.operator.metrics_sources.queries import Query, Scope
from kubeinfer.operator.metrics_sources.source import MetricsSource, MetricsUnavailable
from kubeinfer.operator.state.activator_view import ActivatorView, Route
from kubeinfer.operator.state.scaling_inputs import WakeSignals

WAKE_QUERY_FIELD = "spec.autoscaling.wakeOn.prometheus.query"


def wake_query(spec: AutoscalingSpec, scope: Scope) -> Query | None:
    """The object's wake query, as its own PromQL (no direct form: None answers)."""
    wake = spec.wake_on.prometheus
    if wake is None:
        return None
    return Query("wake_query", scope, wake.query, lambda _: None, overridden_by=WAKE_QUERY_FIELD)


async def read_wake_signals(
    source: MetricsSource,
    scope: Scope,
    spec: AutoscalingSpec,
    at_zero: bool,
    activator: ActivatorView,
    route: Route,
    now: datetime,
) -> WakeSignals:
    """The object's wake signals at `now` (`route`: its Service in the activator's table)."""
    answered: float | None = None
    if not at_zero:
        try:
            (answered,) = await source.evaluate([q.REQUESTS_ANSWERED.bind(scope)], now)
            # No series is no request yet: the counter's labels appear with the first.
            answered = 0.0 if answered is None else answered
        except MetricsUnavailable:
            answered = None  # counted as a request seen: the pods stay
    value, error = None, ""
    query = wake_query(spec, scope) if at_zero else None
    if query is not None:
        value, error = await _wake_value(source, query, now)
    return WakeSignals(
        requests_answered=answered if answered is None or math.isfinite(answered) else None,
        held_requests=activator.held(route),
        activator_routing=not activator.not_routing(route),
        activator_addresses=activator.addresses(),
        activator_message=activator.not_routing(route),
        wake_query_value=value,
        wake_query_error=error,
    )


async def _wake_value(
    source: MetricsSource, query: Query, now: datetime
) -> tuple[float | None, str]:
    if not source.answers_windows:
        return None, (
            f"{source.description} evaluates no PromQL: the wake query needs the operator's "
            "Prometheus (metrics.prometheusUrl or spec.monitoring.prometheus.url)"
        )
    try:
        (value,) = await source.evaluate([query], now)
    except MetricsUnavailable as error:
        return None, str(error)
    if value is not None and not math.isfinite(value):
        return None, f"it answered {value:g}, not a number to compare"
    return value, "" if value is not None else "it matched no series"
