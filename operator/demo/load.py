"""A small closed-loop load generator for the demo: N clients, each sending one request
after another over a kept-alive connection for a fixed time.

It is a demonstration, not a benchmark (`make bench` measures, with a cheaper client and
baselines side by side); it reports what an SRE would look at first: throughput, p50,
p99, and the status codes seen.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp
import numpy as np


@dataclass(frozen=True)
class LoadResult:
    clients: int
    seconds: float
    latencies_seconds: np.ndarray
    codes: Counter[int]

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies_seconds) / self.seconds

    def percentile_milliseconds(self, q: float) -> float:
        return float(np.percentile(self.latencies_seconds, q) * 1000)


async def _client(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    until: float,
    out: list[float],
    codes: Counter[int],
) -> None:
    headers = {"Content-Type": "application/json"}
    while (start := time.perf_counter()) < until:
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            codes[response.status] += 1
        out.append(time.perf_counter() - start)


async def drive(url: str, body: bytes, clients: int, seconds: float) -> LoadResult:
    """Runs `clients` closed-loop clients against `url` for `seconds`."""
    latencies: list[float] = []
    codes: Counter[int] = Counter()
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        until = started + seconds
        await asyncio.gather(
            *(_client(session, url, body, until, latencies, codes) for _ in range(clients))
        )
        elapsed = time.perf_counter() - started
    return LoadResult(clients, elapsed, np.asarray(latencies), codes)
