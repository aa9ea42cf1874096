"""A small closed-loop load generator for the demo: N clients, each sending one request
after another over a kept-alive connection for a fixed time.

Also the two small helpers every demo step uses to reach its servers: a free loopback
port, and a GET that never raises.

It is a demonstration, not a benchmark (`make bench` measures, with a cheaper client and
baselines side by side); it reports what an SRE would look at first: throughput, p50,
p99, and the status codes seen.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np

NO_CONNECTION = 0
"""The code a request counts under when no connection was made (refused, timed out)."""
CONNECT_TIMEOUT_SECONDS = 5.0


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
        """NaN when no request was answered."""
        if not len(self.latencies_seconds):
            return float("nan")
        return float(np.percentile(self.latencies_seconds, q) * 1000)


async def _client(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    headers: Sequence[Mapping[str, str]],
    until: float,
    out: list[float],
    codes: Counter[int],
) -> None:
    sent = 0
    while (start := time.perf_counter()) < until:
        index = sent % len(bodies)
        sent += 1
        request_headers = {"Content-Type": "application/json", **headers[index]}
        try:
            async with session.post(url, data=bodies[index], headers=request_headers) as response:
                await response.read()
                codes[response.status] += 1
        except aiohttp.ClientConnectionError:
            # A pod leaving the Service while kube-proxy still sends to it: counted as
            # NO_CONNECTION, and tried again, as a client behind a Service would.
            codes[NO_CONNECTION] += 1
            await asyncio.sleep(0.05)
            continue
        out.append(time.perf_counter() - start)


async def drive(
    url: str,
    body: bytes | Sequence[bytes],
    clients: int,
    seconds: float,
    headers: Sequence[Mapping[str, str]] | None = None,
) -> LoadResult:
    """Runs `clients` closed-loop clients against `url` for `seconds`; each client sends
    the `body` (or cycles through the bodies, each with its `headers` if given) again and
    again."""
    bodies = [body] if isinstance(body, bytes) else list(body)
    if headers is None:
        headers = [{}] * len(bodies)
    if len(headers) != len(bodies):
        raise ValueError(f"{len(headers)} sets of headers for {len(bodies)} bodies")
    latencies: list[float] = []
    codes: Counter[int] = Counter()
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60, sock_connect=CONNECT_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        until = started + seconds
        await asyncio.gather(
            *(
                _client(session, url, bodies, headers, until, latencies, codes)
                for _ in range(clients)
            )
        )
        elapsed = time.perf_counter() - started
    return LoadResult(clients, elapsed, np.asarray(latencies), codes)


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""
