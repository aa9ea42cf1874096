"""`read_shadow_aggregates`: one candidate's shadow figures, from either metrics source.

The window covers the shadow since it started plus `WINDOW_MARGIN_SECONDS`, so the first
scrapes of its series are inside it whatever the scrape interval; a window reaching
before the start adds nothing, as the candidate's series (by digest) did not exist then.
A candidate without any series yet reads as all zeros (and None for the figures that need
a comparison), not as an error.
"""

from __future__ import annotations

import math
from datetime import datetime

from kubeinfer.operator.metrics_sources import queries as q
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.metrics_sources.source import MetricsSource
from kubeinfer.operator.state.shadow_readings import ShadowAggregates

WINDOW_MARGIN_SECONDS = 60
"""Two scrape intervals of the common 30 s; more than enough at shorter intervals."""


def shadow_window_seconds(started: datetime, now: datetime) -> int:
    """Whole seconds from before `started` (by the margin) to `now`."""
    age = max(0.0, (now - started).total_seconds())
    return math.ceil(age + WINDOW_MARGIN_SECONDS)


async def read_shadow_aggregates(
    source: MetricsSource, scope: Scope, candidate_digest: str, started: datetime, now: datetime
) -> ShadowAggregates:
    """The serving pods' aggregates of the candidate `candidate_digest`; raises
    MetricsUnavailable when the source cannot answer."""
    window = shadow_window_seconds(started, now)
    bound = [
        query.bind(scope, window_seconds=window, candidate_digest=candidate_digest)
        for query in q.SHADOW_QUERIES
    ]
    values = dict(
        zip((query.name for query in bound), await source.evaluate(bound, now), strict=True)
    )

    def count(query: q.NamedQuery) -> int:
        value = values[query.name]
        return round(value) if value is not None else 0

    compared = count(q.SHADOW_COMPARED)
    return ShadowAggregates(
        compared=compared,
        mismatches=count(q.SHADOW_MISMATCHES),
        dropped=count(q.SHADOW_DROPPED),
        candidate_errors=count(q.SHADOW_CANDIDATE_ERRORS),
        timeouts=count(q.SHADOW_TIMEOUTS),
        max_abs_difference=values[q.SHADOW_MAX_ABS_DIFFERENCE.name] if compared else None,
        top1_rows=count(q.SHADOW_TOP1_ROWS),
        top1_agreements=count(q.SHADOW_TOP1_AGREEMENTS),
        serving_p99_seconds=values[q.SHADOW_SERVING_P99.name],
        candidate_p99_seconds=values[q.SHADOW_CANDIDATE_P99.name],
    )
