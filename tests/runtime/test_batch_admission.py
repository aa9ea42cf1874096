"""The batcher's admission, deadlines from arrival and watchdog, on the real ONNX Runtime
engine behind the gate (`conftest.GatedEngine`: a test holds the slot busy).

Covers: `maxQueueSize` counts requests admitted and not yet queued (their bodies being
read or decoded) as well as queued ones, so a full server refuses before reading; a
place is given back once, however often it is released; draining refuses new admissions
but queues and answers the requests admitted before it; a deadline counts from arrival,
so a request that arrived long ago expires without running; a batch held past its
requests' deadline answers them `EngineTimeout`, refuses admissions while it is stuck, and
frees everything when it returns. The watchdog's own state as a table.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.queue import Batcher
from kubeinfer.runtime.batching.watchdog import EngineWatchdog, batch_bound
from kubeinfer.runtime.protocol.errors import (
    DeadlineExceeded,
    EngineTimeout,
    NotReady,
    Overloaded,
)
from waiting import eventually


def rows(n: int = 1) -> dict[str, np.ndarray]:
    return {"input": np.full((n, 16), 0.5, np.float32)}


@pytest.fixture
async def batcher(gated):
    batcher = Batcher(
        gated, BatchingPolicy(execution_slots=1, max_queue_size=2), stuck_liveness_seconds=0.2
    )
    await batcher.start()
    yield batcher
    gated.gate.set()
    await batcher.close()


async def test_admitted_requests_count_against_the_queue_before_they_are_queued(
    batcher,
) -> None:
    first, second = batcher.admit(), batcher.admit()
    assert batcher.admitted == 2 and batcher.queued == 0
    with pytest.raises(Overloaded):
        batcher.admit()
    batcher.release(first)
    batcher.release(first)  # once only
    assert batcher.admitted == 1
    third = batcher.admit()
    results = await asyncio.gather(
        batcher.infer(rows(), 1, admission=second), batcher.infer(rows(), 1, admission=third)
    )
    assert [r["logits"].shape for r in results] == [(1, 10), (1, 10)]
    assert batcher.admitted == 0


async def test_draining_refuses_new_admissions_and_answers_earlier_ones(batcher) -> None:
    early = batcher.admit()  # its body is still being read when the drain begins
    drain = asyncio.create_task(batcher.drain(10))
    await eventually(lambda: batcher.draining, what="the drain", every=0.002, in_thread=False)
    assert not drain.done()
    with pytest.raises(NotReady, match="shutting down"):
        batcher.admit()
    result = await batcher.infer(rows(), 1, admission=early)
    assert result["logits"].shape == (1, 10)
    assert await drain is True


async def test_a_deadline_counts_from_arrival(batcher, gated) -> None:
    admission = batcher.admit(time.monotonic() - 1.0)  # arrived a second ago
    with pytest.raises(DeadlineExceeded, match="after it arrived"):
        await batcher.infer(rows(), 1, 0.5, admission=admission)
    assert gated.batches == []


async def test_a_batch_past_its_deadline_is_answered_and_the_engine_counts_stuck(
    batcher, gated
) -> None:
    gated.gate.clear()
    with pytest.raises(EngineTimeout, match="may be stuck"):
        await batcher.infer(rows(5), 5, 0.05)
    assert batcher.watchdog.stuck and batcher.stuck_threads
    with pytest.raises(NotReady, match="has not returned a batch"):
        batcher.admit()
    gated.gate.set()
    await eventually(
        lambda: not batcher.watchdog.stuck, what="the engine's return", every=0.002, in_thread=False
    )
    assert not batcher.stuck_threads
    result = await batcher.infer(rows(), 1)
    assert result["logits"].shape == (1, 10)
    assert gated.batches == [5, 1]


def test_the_watchdog_table() -> None:
    watchdog = EngineWatchdog(liveness_seconds=10)
    assert not watchdog.stuck and watchdog.live(0) and watchdog.stuck_for(5) == 0
    watchdog.batch_stuck(100.0)
    watchdog.batch_stuck(103.0)  # a second batch stuck: the engine is stuck since the first
    assert watchdog.stuck and watchdog.stuck_for(104.0) == 4.0
    assert watchdog.live(109.9) and not watchdog.live(110.0)
    watchdog.batch_returned()
    assert watchdog.stuck and not watchdog.live(111.0)
    watchdog.batch_returned()
    assert not watchdog.stuck and watchdog.live(111.0)
    assert batch_bound([3.0, 1.0, 2.0]) == 3.0
