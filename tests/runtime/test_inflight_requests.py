"""`kubeinfer_inflight_requests`: the requests in the batches running on execution slots
(the autoscaler's "in flight", beside `kubeinfer_queue_depth`'s queued ones), kept by the
batcher through its `BatchObserver` and read from the runtime's own registry.

Covers, over the real ONNX Runtime engine behind the gate (`conftest.GatedEngine`): a
held batch counts its requests, not its rows nor its batches; requests that queue behind
it count as queued only, and once it finishes, the next batch's requests replace them in
flight; a batch the engine fails on, and a lone request run on the event loop, leave the
gauge at 0 once answered.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.queue import Batcher
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.protocol.errors import EngineFailed
from waiting import eventually, wait_for

LABELS = {"model": "tiny", "version": "1"}


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def gauges(metrics: RuntimeMetrics) -> tuple[float | None, ...]:
    """(queued, requests in flight, batches in flight), as a scrape would show them."""
    return tuple(
        metrics.registry.get_sample_value(name, LABELS)
        for name in (
            "kubeinfer_queue_depth",
            "kubeinfer_inflight_requests",
            "kubeinfer_inflight_batches",
        )
    )


async def observed_batcher(engine, **options) -> tuple[Batcher, RuntimeMetrics]:
    metrics = RuntimeMetrics("tiny", "1")
    batcher = Batcher(engine, BatchingPolicy(execution_slots=1), observer=metrics, **options)
    await batcher.start()
    return batcher, metrics


async def test_requests_in_running_batches_are_in_flight_and_the_rest_queued(gated) -> None:
    batcher, metrics = await observed_batcher(gated, inline_below_seconds=0.0)
    assert gauges(metrics) == (0, 0, 0)
    gated.gate.clear()
    first = asyncio.create_task(batcher.infer({"input": rows(4, 0)}, 4))
    await eventually(
        lambda: gated.running == 1, what="the first batch running", every=0.002, in_thread=False
    )
    assert gauges(metrics) == (0, 1, 1)  # one request of 4 rows
    queued = [asyncio.create_task(batcher.infer({"input": rows(n, n)}, n)) for n in (1, 3, 2)]
    await eventually(
        lambda: batcher.queued == 3, what="three requests queued", every=0.002, in_thread=False
    )
    assert gauges(metrics) == (3, 1, 1)
    # Let the first batch through and close the gate behind it, before the event loop
    # (blocked here, not awaiting) can start the next batch: that one waits at the gate.
    gated.gate.set()
    wait_for(lambda: gated.batches == [4], what="the first batch finishing", every=0.001)
    gated.gate.clear()
    await first
    await eventually(
        lambda: gated.running == 1, what="the second batch running", every=0.002, in_thread=False
    )
    assert gauges(metrics) == (0, 3, 1)
    gated.gate.set()
    await asyncio.gather(*queued)
    assert gated.batches == [4, 6]
    assert gauges(metrics) == (0, 0, 0)
    await batcher.close()


async def test_a_failed_batch_leaves_nothing_in_flight(gated) -> None:
    batcher, metrics = await observed_batcher(gated, inline_below_seconds=0.0)
    gated.gate.clear()
    blocker = asyncio.create_task(batcher.infer({"input": rows(1, 0)}, 1))
    await eventually(
        lambda: gated.running == 1, what="the first batch running", every=0.002, in_thread=False
    )
    failing = [asyncio.create_task(batcher.infer({"input": rows(n, n)}, n)) for n in (2, 3)]
    await eventually(
        lambda: batcher.queued == 2, what="two requests queued", every=0.002, in_thread=False
    )
    assert gauges(metrics) == (2, 1, 1)
    gated.fail_rows = 5  # the batch of the two queued requests
    gated.gate.set()
    await blocker
    outcomes = await asyncio.gather(*failing, return_exceptions=True)
    assert all(isinstance(outcome, EngineFailed) for outcome in outcomes), outcomes
    assert gated.batches == [1]
    assert gauges(metrics) == (0, 0, 0)
    await batcher.close()


async def test_a_request_run_on_the_event_loop_leaves_nothing_in_flight(gated) -> None:
    batcher, metrics = await observed_batcher(gated, inline_below_seconds=10.0)
    for seed in range(3):  # the first measures small batches; the others run inline
        await batcher.infer({"input": rows(1, seed)}, 1)
    assert gated.batches == [1, 1, 1]
    assert threading.get_ident() in gated.threads  # it did run inline
    assert gauges(metrics) == (0, 0, 0)
    await batcher.close()
