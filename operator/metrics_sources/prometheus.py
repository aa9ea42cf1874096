"""`PrometheusSource`: named queries evaluated by a Prometheus server, through its HTTP
API's instant query (`GET /api/v1/query`) on a `requests` session.

The session is synchronous, so each query runs in a worker thread, bounded by the
operator's metrics timeout twice over: requests' own connect/read timeout, and an asyncio
timeout around the thread (a server trickling bytes defeats a read timeout). No retries
inside a read: the next pass reads again, and a retrying read would outlast its timeout.
Every failure becomes one `MetricsUnavailable` whose message names the query (and the
object's field, for an override's PromQL) and the cause in a few words: the answer's
status and Prometheus' own `error` from its JSON body, or the operating system's words
for a connection that failed, never a traceback from inside requests.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import requests
from kubeinfer.operator.metrics_sources.queries import GroupedQuery, Query
from kubeinfer.operator.metrics_sources.shared_reads import (
    FleetQuery,
    Groups,
    PodSeries,
    figures,
    fleet_queries,
    fresh,
)
from kubeinfer.operator.metrics_sources.source import MetricsUnavailable
from kubeinfer.operator.telemetry.activity import Activity

MAX_CONCURRENT_QUERIES = 4
"""Queries of one read in flight at once (below requests' connection pool of 10)."""
MAX_DETAIL_CHARACTERS = 300
"""Characters of Prometheus' own error message kept in the status."""
NOT_A_RESULT = "the answer is not a Prometheus query result"


class Refused(Exception):
    """An answer that is no query result: a status other than 200, or a body that is not
    Prometheus' JSON envelope with status "success"."""


@dataclass
class _Pass:
    """One shared query of a pass: when it was asked, on which loop, and its answer."""

    at: datetime
    loop: asyncio.AbstractEventLoop
    answer: asyncio.Task[PodSeries]

    def serves(self, now: datetime, loop: asyncio.AbstractEventLoop, max_age: float) -> bool:
        failed = self.answer.done() and (
            self.answer.cancelled() or self.answer.exception() is not None
        )
        return self.loop is loop and not failed and fresh(self.at, now, max_age)


class PrometheusSource:
    """Evaluates queries with Prometheus' instant query API at `now`. With
    `shared_read_seconds`, the autoscaler's signals are read for every object at once and
    kept that long (`evaluate_scaling`)."""

    def __init__(
        self,
        url: str,
        timeout_seconds: float,
        activity: Activity | None = None,
        shared_read_seconds: float = 0.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.activity = activity if activity is not None else Activity()
        self._session = requests.Session()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)
        self.shared_read_seconds = shared_read_seconds
        self._passes: dict[str, _Pass] = {}

    @property
    def description(self) -> str:
        return f"Prometheus at {self.url}"

    def close(self) -> None:
        """Closes the HTTP session (its pooled connections)."""
        self._session.close()

    async def evaluate(self, queries: Sequence[Query], now: datetime) -> tuple[float | None, ...]:
        return tuple(await asyncio.gather(*(self._one(query, now) for query in queries)))

    @property
    def answers_windows(self) -> bool:
        return True  # a window is Prometheus' stored samples

    async def evaluate_grouped(
        self, queries: Sequence[GroupedQuery], now: datetime
    ) -> tuple[dict[tuple[str, ...], float], ...]:
        results = await asyncio.gather(*(self._ask(query, now) for query in queries))
        return tuple(
            self._groups(query, result) for query, result in zip(queries, results, strict=True)
        )

    @property
    def shares_scaling_reads(self) -> bool:
        return self.shared_read_seconds > 0

    async def evaluate_scaling(
        self, queries: Sequence[Query], now: datetime, p99_window_seconds: int
    ) -> tuple[float | None, ...]:
        """The scaling queries' figures: an overridden one from its own query, the others
        from one query per signal for every object, kept for `shared_read_seconds`.
        Readers arriving while it is in flight wait for that one query; a failed one is
        not kept (the next reader asks again). Every query ends before an error is raised,
        so none is left in flight behind it."""
        shared = {f.name: f for f in fleet_queries(p99_window_seconds)}
        asked = [
            self._one(query, now) if query.overridden_by else self._shared(shared[query.name], now)
            for query in queries
        ]
        answers = await asyncio.gather(*asked, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return figures(queries, cast(list[PodSeries | float | None], answers), p99_window_seconds)

    async def _shared(self, query: FleetQuery, now: datetime) -> PodSeries:
        loop = asyncio.get_running_loop()
        current = self._passes.get(query.promql)
        if current is None or not current.serves(now, loop, self.shared_read_seconds):
            current = _Pass(now, loop, loop.create_task(self._ask_fleet(query, now)))
            self._passes[query.promql] = current
        return await asyncio.shield(current.answer)

    async def _ask_fleet(self, query: FleetQuery, now: datetime) -> PodSeries:
        """One query answering for every object (counted as `prometheus_grouped`)."""
        return PodSeries.of(self._groups(query, await self._ask(query, now, "prometheus_grouped")))

    def _groups(self, query: GroupedQuery | FleetQuery, result: Any) -> Groups:
        """A vector's samples by their `by` labels' values ("" for a label a sample lacks,
        as PromQL groups it); NaN kept, for the caller to judge."""
        kind, samples = result
        if kind != "vector":
            raise self._unavailable(query, f"a {kind} came back, expected a vector")
        groups: dict[tuple[str, ...], float] = {}
        try:
            for sample in samples or ():
                labels = sample["metric"]
                key = tuple(str(labels.get(label, "")) for label in query.by)
                if key in groups:
                    raise self._unavailable(query, f"two series came back for {key}")
                groups[key] = float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise self._unavailable(query, "the answer is not a Prometheus vector") from None
        return groups

    async def _one(self, query: Query, now: datetime) -> float | None:
        return self._value(query, await self._ask(query, now))

    async def _ask(
        self, query: Query | GroupedQuery | FleetQuery, now: datetime, kind: str = "prometheus"
    ) -> tuple[str, Any]:
        """The query's result at `now`: (resultType, result) of the answer's `data`."""
        self.activity.metrics_queries[kind] += 1
        async with self._slots:
            try:
                async with asyncio.timeout(self.timeout_seconds):
                    return await asyncio.to_thread(self._get, query.promql, now.timestamp())
            except (TimeoutError, requests.Timeout):
                reason = f"no answer within {self.timeout_seconds:g} s"
                raise self._unavailable(query, reason) from None
            except requests.RequestException as error:
                raise self._unavailable(query, f"cannot connect ({cause(error)})") from None
            except Refused as refused:
                raise self._unavailable(query, str(refused)) from None

    def _get(self, promql: str, at: float) -> tuple[str, Any]:
        """One instant query (in a worker thread): the answer's (resultType, result)."""
        params: dict[str, str | float] = {"query": promql, "time": at}
        response = self._session.get(
            f"{self.url}/api/v1/query",
            params=params,
            timeout=self.timeout_seconds,
        )
        return query_result(response.status_code, response.text)

    def _value(self, query: Query, result: tuple[str, Any]) -> float | None:
        """The single sample of an aggregated query; None for an empty result or NaN. A
        scalar result (an override such as `scalar(...)`) is its value."""
        kind, data = result
        try:
            if kind == "scalar":
                value = float(data[1])
            elif kind != "vector":
                raise self._unavailable(query, f"a {kind} came back, expected a vector")
            elif not data:
                return None
            elif len(data) != 1:
                raise self._unavailable(query, f"{len(data)} series came back, expected one")
            else:
                value = float(data[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise self._unavailable(query, "the answer is not a Prometheus vector") from None
        return None if math.isnan(value) else value

    def _unavailable(
        self, query: Query | GroupedQuery | FleetQuery, reason: str
    ) -> MetricsUnavailable:
        return MetricsUnavailable(f"query {query.label} failed: {reason}")


def query_result(status: int, body: str) -> tuple[str, Any]:
    """(resultType, result) from an answer of Prometheus' query API; raises Refused with
    the status and Prometheus' own error (its JSON body's `error`), or the status alone
    when the body is not Prometheus' (a proxy's page, another server's 404)."""
    try:
        envelope = json.loads(body)
    except ValueError:
        envelope = None
    if not isinstance(envelope, dict):
        raise Refused(f"HTTP {status}" if status != 200 else NOT_A_RESULT)
    error = envelope.get("error")
    if status != 200 or envelope.get("status") != "success":
        detail = f": {str(error)[:MAX_DETAIL_CHARACTERS]}" if error else ""
        raise Refused(f"HTTP {status}{detail}")
    data = envelope.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("resultType"), str):
        raise Refused(NOT_A_RESULT)
    return data["resultType"], data.get("result")


def cause(error: BaseException) -> str:
    """What the operating system said of a failed connection ("Connection refused", "Name
    or service not known"): the first OS error along the chain of exceptions that led to
    `error` (requests raises its own around urllib3's, around the socket's); else the
    exception's type."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return current.strerror
        current = current.__cause__ or current.__context__
    return type(error).__name__
