"""`PrometheusSource`: named queries evaluated by a Prometheus server, through
`prometheus-api-client`.

`PrometheusConnect` is synchronous (requests), so each query runs in a worker thread,
bounded by the operator's metrics timeout twice over: requests' own connect/read timeout,
and an asyncio timeout around the thread (a server trickling bytes defeats a read timeout).
No retries inside a read: the next pass reads again, and a retrying read would outlast
its timeout. Every failure becomes one `MetricsUnavailable` whose message names the
server, the query (and the object's field, for an override's PromQL) and the cause in a
few words, never a traceback from inside requests.
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import requests
from kubeinfer.operator.metrics.queries import GroupedQuery, Query
from kubeinfer.operator.metrics.source import MetricsUnavailable
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

MAX_CONCURRENT_QUERIES = 4
"""Queries of one read in flight at once (below requests' connection pool of 10)."""

_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
_STATUS = re.compile(r"HTTP Status Code (\d+) \((.*)\)$", re.DOTALL)


class PrometheusSource:
    """Evaluates queries with Prometheus' instant query API at `now`."""

    def __init__(self, url: str, timeout_seconds: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self._client = PrometheusConnect(
            url=self.url, retry=Retry(total=0, read=False), timeout=timeout_seconds
        )
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)

    @property
    def description(self) -> str:
        return f"Prometheus at {self.url}"

    def close(self) -> None:
        """Closes the HTTP session (its pooled connections)."""
        self._client._session.close()

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

    def _groups(self, query: GroupedQuery, result: Any) -> dict[tuple[str, ...], float]:
        """A vector's samples by their `by` labels' values ("" for a label a sample lacks,
        as PromQL groups it); NaN kept, for the caller to judge."""
        groups: dict[tuple[str, ...], float] = {}
        try:
            if result and len(result) == 2 and isinstance(result[1], str):
                raise self._unavailable(query, "a scalar came back, expected a vector")
            for sample in result or ():
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

    async def _ask(self, query: Query | GroupedQuery, now: datetime) -> Any:
        """The query's raw result at `now` (`custom_query`'s list)."""
        async with self._slots:
            try:
                async with asyncio.timeout(self.timeout_seconds):
                    result = await asyncio.to_thread(
                        self._client.custom_query, query.promql, {"time": now.timestamp()}
                    )
            except (TimeoutError, requests.Timeout):
                reason = f"no answer within {self.timeout_seconds:g} s"
                raise self._unavailable(query, reason) from None
            except requests.RequestException as error:
                raise self._unavailable(query, _connection_reason(error)) from None
            except PrometheusApiClientException as error:
                raise self._unavailable(query, _refusal_reason(str(error))) from None
            except (ValueError, KeyError, TypeError):
                reason = "the answer is not a Prometheus query result"
                raise self._unavailable(query, reason) from None
        return result

    def _value(self, query: Query, result: Any) -> float | None:
        """The single sample of an aggregated query; None for an empty result or NaN. A
        scalar result (an override such as `scalar(...)`) is its value: `custom_query`
        gives it as one [time, "value"] pair where a vector is a list of samples."""
        try:
            if not result:
                return None
            if len(result) == 2 and isinstance(result[1], str):
                value = float(result[1])
                return None if math.isnan(value) else value
            if len(result) != 1:
                raise self._unavailable(query, f"{len(result)} series came back, expected one")
            value = float(result[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise self._unavailable(query, "the answer is not a Prometheus vector") from None
        return None if math.isnan(value) else value

    def _unavailable(self, query: Query | GroupedQuery, reason: str) -> MetricsUnavailable:
        return MetricsUnavailable(f"query {query.label} failed: {reason}")


def _connection_reason(error: requests.RequestException) -> str:
    """A connection failure in a few words (requests nests the OS error in long reprs)."""
    match = _ERRNO.search(str(error))
    if match:
        return f"cannot connect ({match.group(1).strip()})"
    return f"cannot connect ({type(error).__name__})"


def _refusal_reason(message: str) -> str:
    """Prometheus' own error text when the body carries it (a bad query, an overloaded
    server), else the status: `PrometheusApiClientException` holds "HTTP Status Code
    <status> (<repr of the body>)"."""
    status = _STATUS.match(message)
    if status is None:
        return message[:200]
    try:
        body = ast.literal_eval(status.group(2))
        detail = json.loads(body)["error"]
    except (ValueError, SyntaxError, TypeError, KeyError):
        return f"HTTP {status.group(1)}"
    return f"HTTP {status.group(1)}: {str(detail)[:300]}"
