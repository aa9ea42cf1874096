"""Decoding, inflating and encoding large bodies on worker threads, under each request's
deadline.

Why: parsing and converting a large JSON body takes milliseconds, and on the event loop
that is time in which no other request is admitted or refused and no liveness probe is
answered. But the codec threads share the GIL with the loop, and on a busy core every
hand-off costs: on one core at five times capacity, decoding the 340 KB JSON bodies of
32-row requests on a thread served 7 % fewer requests than decoding them on the loop,
with a worse p99. So JSON under `OFFLOAD_BYTES` (1 MiB, about 4 ms of decoding at
~250 MB/s) stays on the loop, and larger JSON goes to a thread: during a 10 MiB body the
slowest liveness probe took 27-38 ms with the decode on a thread, 70-79 ms with it on
the loop (`tests/benchmarks/bench_hostile.py` prints the decode rate and the hand-off's
cost). Binary tensors decode to views of the body in ~5 us whatever their size, so only
their JSON header counts. A compressed body is always inflated here: its inflated size
is not known until it is inflated, and zlib releases the GIL while it works.

The threads still share the GIL with the loop, but the work they do is cut into calls of
about a millisecond (`json_tensors` converts in chunks), so the loop gets its turn at
least every switch interval (5 ms).

The time a job waits for a free worker counts against its request's deadline: a job whose
deadline has passed when a worker picks it up raises `DeadlineExceeded` and does nothing.
A job whose caller went away before it started is never run (its future is cancelled).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubeinfer.runtime.protocol.errors import DeadlineExceeded

T = TypeVar("T")

OFFLOAD_BYTES = 1024 * 1024
"""JSON from this size on is decoded (encoded) on a worker thread."""

WORKERS = 2


class CodecPool:
    """Worker threads for the codec's large jobs; `close()` when the server stops."""

    def __init__(self, workers: int = WORKERS, clock: Callable[[], float] = time.monotonic):
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="kubeinfer-codec")
        self._clock = clock

    async def run(self, deadline: float, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker, unless `deadline` (monotonic) passes before it starts."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._guarded, deadline, fn, args)

    def _guarded(self, deadline: float, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        waited = self._clock() - deadline
        if waited >= 0:
            raise DeadlineExceeded(
                "the request's deadline passed while it waited for a decoder; it was not executed"
            )
        return fn(*args)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
