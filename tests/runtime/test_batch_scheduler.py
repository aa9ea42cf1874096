"""The batcher's scheduler and slot runner over the real ONNX Runtime engine behind the gate
(`conftest.GatedEngine`), with a hand-driven clock where time matters.

Covers: every time the batcher reads comes from its injected clock (the drain's timeout,
the compute seconds a batch measured); a batch ends as one typed outcome (outputs and
compute seconds, or the one error of the batch) and its slot is back when it does; a
batch still running when `close` stops waiting for it is answered when it returns.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.observer import NoObserver
from kubeinfer.runtime.batching.queue import Batcher
from kubeinfer.runtime.batching.slot_runner import BatchFailed, BatchRan, SlotRunner
from kubeinfer.runtime.protocol.errors import EngineFailed, NotReady
from waiting import eventually


class HandClock:
    """Monotonic time that moves only when the test says, plus `step` on every read."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = time.monotonic()
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def rows(n: int = 1) -> dict[str, np.ndarray]:
    return {"input": np.full((n, 16), 0.5, np.float32)}


async def test_the_drain_timeout_runs_on_the_injected_clock(gated) -> None:
    clock = HandClock()
    batcher = Batcher(gated, BatchingPolicy(execution_slots=1), clock=clock)
    await batcher.start()
    gated.gate.clear()
    held = asyncio.create_task(batcher.infer(rows(5), 5))
    await eventually(
        lambda: gated.running == 1, what="the batch running", every=0.002, in_thread=False
    )
    drain = asyncio.create_task(batcher.drain(timeout_seconds=10))
    await eventually(lambda: batcher.draining, what="the drain", every=0.002, in_thread=False)
    assert not drain.done()
    clock.now += 11  # ten seconds pass on the batcher's clock, none on the wall
    try:
        assert await asyncio.wait_for(drain, 1) is False
    finally:
        gated.gate.set()
    assert (await held)["logits"].shape == (5, 10)
    await batcher.close()


async def test_a_batch_outcome_is_one_value_timed_on_the_injected_clock(gated) -> None:
    runner = SlotRunner(
        gated,
        1,
        clock=HandClock(step=0.25),  # each read a quarter second later
        observer=NoObserver(),
        inline_below_seconds=1.0,
        stuck_liveness_seconds=60,
    )
    runner.start()
    lease = runner.take(requests=2)
    assert (runner.free_slots, runner.busy_slots) == (0, 1)
    ran = runner.run_inline(lease, [rows(1), rows(2)], 3)
    assert isinstance(ran, BatchRan)
    assert [o["logits"].shape for o in ran.outputs] == [(1, 10), (2, 10)]
    assert ran.compute_seconds == 0.25  # two reads of the clock: started, finished
    assert runner.small_batches.average_seconds == 0.25
    assert (runner.free_slots, runner.busy_slots) == (1, 0)

    gated.fail_rows = 1
    failed = runner.run_inline(runner.take(requests=1), [rows(1)], 1)
    assert isinstance(failed, BatchFailed) and isinstance(failed.error, EngineFailed)
    assert "simulated engine failure" in str(failed.error)
    assert runner.small_batches.average_seconds == 0.25  # a failure measures nothing
    assert (runner.free_slots, runner.busy_slots) == (1, 0)
    runner.close()


async def test_a_batch_outliving_close_is_still_answered(gated) -> None:
    batcher = Batcher(gated, BatchingPolicy(execution_slots=1))
    await batcher.start()
    gated.gate.clear()
    held = asyncio.create_task(batcher.infer(rows(3), 3))
    await eventually(
        lambda: gated.running == 1, what="the batch running", every=0.002, in_thread=False
    )
    await batcher.close(timeout_seconds=0.05)  # gives up waiting for the batch
    assert not held.done()
    gated.gate.set()
    result = await asyncio.wait_for(held, 5)
    assert result["logits"].shape == (3, 10)


async def test_requests_after_close_are_refused(gated) -> None:
    batcher = Batcher(gated, BatchingPolicy(execution_slots=1))
    await batcher.start()
    admission = batcher.admit()
    await batcher.close()
    with pytest.raises(NotReady, match="the server stopped"):
        await asyncio.wait_for(batcher.infer(rows(), 1, admission=admission), 1)
    assert batcher.admitted == 0
