"""`MetricsSource`: where the operator reads the runtime pods' metrics, behind one
protocol, so shadow verdicts, the autoscaler and the status never care which.

Two implementations: `PrometheusSource` (a Prometheus that scrapes the pods) and
`DirectRead` (the pods' own /metrics, scraped by the operator); `factory.MetricsSources`
chooses. Both evaluate the same `Query` values (`queries.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from kubeinfer.operator.metrics_sources.queries import GroupedQuery, Query


class MetricsUnavailable(Exception):
    """The source could not answer (unreachable, too slow, an error, a pod that could not
    be read). Never a partial answer: a missing pod's counts would look like a drop in
    traffic. Temporary by nature: the next pass reads again. The message says what failed,
    in one line; the source's `description` says where (callers join the two)."""

    retryable = True


class MetricsSource(Protocol):
    """Evaluates named queries (bound to their scopes) at one instant."""

    @property
    def description(self) -> str:
        """Where the figures come from, for status messages and logs (e.g. "Prometheus at
        http://prometheus:9090"); it heads MetricsUnavailable's message there."""
        ...

    async def evaluate(self, queries: Sequence[Query], now: datetime) -> tuple[float | None, ...]:
        """Each query's value at `now`, in order; None where no series matched (or the
        figure is undefined, e.g. a quantile of no observations). Raises
        MetricsUnavailable, never a partial answer."""
        ...

    @property
    def answers_windows(self) -> bool:
        """Whether the source keeps the past itself (Prometheus' stored samples), so a
        grouped query's window is the source's; False for a source that sees only the
        present (the direct read), whose answers are counts since each pod started, which
        the caller differences against its own earlier reads."""
        ...

    async def evaluate_grouped(
        self, queries: Sequence[GroupedQuery], now: datetime
    ) -> tuple[dict[tuple[str, ...], float], ...]:
        """Each grouped query's figures at `now`, in order: one per combination of its
        `by` labels' values (empty where no series matched). A figure is as the source
        computed it, NaN included: judging it is the caller's. Raises MetricsUnavailable,
        never a partial answer."""
        ...


@runtime_checkable
class SharedScalingSource(Protocol):
    """A source that can answer the autoscaler's signals of many objects from one query
    per signal (`shared_reads`); `PrometheusSource` made with `shared_read_seconds`."""

    @property
    def shares_scaling_reads(self) -> bool:
        """Whether `evaluate_scaling` shares its reads (else it is `evaluate`)."""
        ...

    async def evaluate_scaling(
        self, queries: Sequence[Query], now: datetime, p99_window_seconds: int
    ) -> tuple[float | None, ...]:
        """`scaling.scaling_queries`' figures for their scope at `now`: each overridden one
        from its own query, the others from the reads shared by every object in the pass.
        Raises MetricsUnavailable."""
        ...
