"""`DirectRead`: named queries computed from the serving pods' own /metrics, for clusters
without a Prometheus.

Each read lists the scope's pods through the API (a `ListPods` callable, so the client
behind it can change without touching the queries), scrapes every ready pod at once with
aiohttp, parses the text with `prometheus_client`'s parser, and applies each query's
direct form to the samples of that one scrape, so every figure of a read comes from the
same instant. The operator's metrics timeout bounds the listing and each pod's scrape.
A pod that cannot be read makes the whole read unavailable, naming the pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import aiohttp
from kubeinfer.operator.metrics_sources.pods import PodTarget, metrics_targets
from kubeinfer.operator.metrics_sources.queries import GroupedQuery, Query, Scope
from kubeinfer.operator.metrics_sources.samples import PodSamples, parse_exposition
from kubeinfer.operator.metrics_sources.source import MetricsUnavailable
from kubeinfer.operator.telemetry.activity import Activity

ListPods = Callable[[str, str], Awaitable[Sequence[Mapping[str, Any]]]]
"""(namespace, label selector) -> the Pod objects, as the API returns them."""

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest /metrics body read from a pod (a runtime's is a few kilobytes)."""


class DirectRead:
    """Evaluates queries over the samples of one scrape of each scope's ready pods."""

    def __init__(
        self, list_pods: ListPods, timeout_seconds: float, activity: Activity | None = None
    ) -> None:
        self._list_pods = list_pods
        self.timeout_seconds = timeout_seconds
        self.activity = activity if activity is not None else Activity()
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> aiohttp.ClientSession:
        """One session for every read, made in the running event loop on first use (and
        again if the reader is used from another loop, whose sessions it cannot share)."""
        loop = asyncio.get_running_loop()
        if self._session_loop is not loop:
            self._session = None  # made in another (maybe closed) loop: unusable here
        if self._session is None or self._session.closed:
            self._session_loop = loop
            timeout = aiohttp.ClientTimeout(total=self.timeout_seconds)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def description(self) -> str:
        return "the runtime pods' /metrics"

    async def evaluate(self, queries: Sequence[Query], now: datetime) -> tuple[float | None, ...]:
        """`now` is when the caller reads; a scrape can only see the present."""
        scopes = list(dict.fromkeys(query.scope for query in queries))
        session = self._client()
        scraped = await asyncio.gather(*(self._scrape(session, scope) for scope in scopes))
        by_scope = dict(zip(scopes, scraped, strict=True))
        return tuple(query.reduce(by_scope[query.scope]) for query in queries)

    @property
    def answers_windows(self) -> bool:
        return False  # one scrape sees the present only

    async def evaluate_grouped(
        self, queries: Sequence[GroupedQuery], now: datetime
    ) -> tuple[dict[tuple[str, ...], float], ...]:
        """Each query's direct form over one scrape of its scope's pods (the counts since
        each pod started); `now` as for `evaluate`."""
        scopes = list(dict.fromkeys(query.scope for query in queries))
        session = self._client()
        scraped = await asyncio.gather(*(self._scrape(session, scope) for scope in scopes))
        by_scope = dict(zip(scopes, scraped, strict=True))
        return tuple(query.reduce(by_scope[query.scope]) for query in queries)

    async def _scrape(self, session: aiohttp.ClientSession, scope: Scope) -> list[PodSamples]:
        targets = metrics_targets(await self._pods(scope))
        results = await asyncio.gather(
            *(self._read(session, target) for target in targets), return_exceptions=True
        )
        failures = [str(r) for r in results if isinstance(r, MetricsUnavailable)]
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, MetricsUnavailable):
                raise result
        if failures:
            raise MetricsUnavailable("; ".join(failures))
        return [r for r in results if isinstance(r, PodSamples)]

    async def _pods(self, scope: Scope) -> Sequence[Mapping[str, Any]]:
        try:
            async with asyncio.timeout(self.timeout_seconds):
                return await self._list_pods(scope.namespace, scope.label_selector)
        except TimeoutError:
            reason = f"no answer within {self.timeout_seconds:g} s"
        except Exception as error:  # the API client's own errors, whichever client it is
            reason = str(error) or type(error).__name__
        raise MetricsUnavailable(
            f"listing the pods {scope.label_selector} in namespace {scope.namespace} "
            f"failed: {reason}"
        )

    async def _read(self, session: aiohttp.ClientSession, target: PodTarget) -> PodSamples:
        self.activity.metrics_queries["pod"] += 1
        try:
            async with session.get(target.url) as response:
                if response.status != 200:
                    raise MetricsUnavailable(
                        f"pod {target.name} answered {target.url} with HTTP {response.status}"
                    )
                body = bytearray()
                async for chunk in response.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > MAX_BODY_BYTES:
                        raise MetricsUnavailable(
                            f"pod {target.name}: /metrics is over {MAX_BODY_BYTES} bytes"
                        )
        except TimeoutError:
            raise MetricsUnavailable(
                f"pod {target.name} did not answer {target.url} within {self.timeout_seconds:g} s"
            ) from None
        except aiohttp.ClientError as error:
            raise MetricsUnavailable(
                f"pod {target.name} could not be read at {target.url}: "
                f"{str(error) or type(error).__name__}"
            ) from None
        try:
            return parse_exposition(target.name, body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise MetricsUnavailable(
                f"pod {target.name}: /metrics is not a Prometheus exposition ({error})"
            ) from None
