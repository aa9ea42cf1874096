"""The asyncio batcher over the real ONNX Runtime engine (tiny demo MLP), with a gate in
front of each slot's `run` so a test can hold execution busy and decide what queues.

Covers: requests that queue while a slot is busy run as one batch and each gets its own
rows (requests with batch dimension > 1 included), equal to ONNX Runtime run directly;
a full queue refuses at once with 503 + Retry-After; a request whose deadline passes in
the queue is answered with a timeout and never executed; one engine error fans out to
every request of its batch and the next batch runs fine; a cancelled request is not
executed; a lone request pays no delay even with a long queue delay; several slots run
concurrently; draining refuses new requests and answers every queued one; a lone small
request on an idle server runs on the event loop once small batches are known to be fast,
and in a worker thread otherwise (or while another batch runs in one).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.observer import NoObserver
from kubeinfer.runtime.batching.queue import Batcher
from kubeinfer.runtime.protocol.errors import (
    DeadlineExceeded,
    EngineFailed,
    NotReady,
    Overloaded,
)
from waiting import eventually


@pytest.fixture
def reference(tiny_model: Path):
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x})[0]


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


async def started(batcher_engine, running: int = 1) -> None:
    await eventually(
        lambda: batcher_engine.running >= running, what=f"{running} slots running", every=0.002
    )


async def queued(batcher: Batcher, count: int) -> None:
    """Until `count` requests wait in the queue (checked on the loop, so still true after)."""
    await eventually(
        lambda: batcher.queued == count, what=f"{count} queued", every=0.002, in_thread=False
    )


async def at_once(awaitable, what: str, seconds: float = 1.0):
    """Awaits what must not wait for the held slot: with the feature broken it would wait
    for the gate (10 s) or the request's deadline, and fail for the wrong reason."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise AssertionError(f"not within {seconds} s: {what}") from None


async def make_batcher(engine, **policy) -> Batcher:
    batcher = Batcher(engine, BatchingPolicy(**{"execution_slots": 1, **policy}))
    await batcher.start()
    return batcher


async def test_requests_queued_while_busy_run_as_one_batch(gated, reference) -> None:
    batcher = await make_batcher(gated)
    gated.gate.clear()
    first = asyncio.create_task(batcher.infer({"input": rows(1, 0)}, 1))
    await started(gated)
    sizes = [1, 3, 1, 2, 5]  # some requests carry their own batch dimension
    inputs = [rows(n, seed) for seed, n in enumerate(sizes, start=1)]
    waiting = [asyncio.create_task(batcher.infer({"input": x}, len(x))) for x in inputs]
    await queued(batcher, len(inputs))
    gated.gate.set()
    results = await asyncio.gather(first, *waiting)
    assert gated.batches == [1, sum(sizes)]
    for x, result in zip([rows(1, 0), *inputs], results, strict=True):
        np.testing.assert_allclose(result["logits"], reference(x), rtol=1e-5, atol=1e-6)
    await batcher.close()


async def test_a_full_queue_refuses_at_once_with_retry_after(gated) -> None:
    batcher = await make_batcher(gated, max_queue_size=3)
    gated.gate.clear()
    running = asyncio.create_task(batcher.infer({"input": rows(1, 0)}, 1))
    await started(gated)
    waiting = [asyncio.create_task(batcher.infer({"input": rows(1, i)}, 1)) for i in range(3)]
    await queued(batcher, 3)
    try:
        with pytest.raises(Overloaded) as refused:
            await at_once(
                batcher.infer({"input": rows(1, 9)}, 1),
                "a request beyond maxQueueSize (3) refused with Overloaded; it was queued",
            )
        assert refused.value.status == 503 and refused.value.headers["Retry-After"]
        gated.gate.set()
        await at_once(
            asyncio.gather(running, *waiting), "the held and queued requests answered", 60
        )
    finally:  # failed or not, nothing is left running
        gated.gate.set()
        await asyncio.gather(running, *waiting, return_exceptions=True)
        await batcher.close()


async def test_a_request_past_its_deadline_is_answered_and_never_executed(gated) -> None:
    batcher = await make_batcher(gated)
    gated.gate.clear()
    running = asyncio.create_task(batcher.infer({"input": rows(1, 0)}, 1))
    await started(gated)
    late = asyncio.create_task(batcher.infer({"input": rows(4, 1)}, 4, timeout_seconds=0.05))
    # Answered at its deadline, while the slot is still busy.
    with pytest.raises(DeadlineExceeded) as timed_out:
        await asyncio.wait_for(late, 2)
    assert timed_out.value.status == 504
    gated.gate.set()
    await running
    await batcher.infer({"input": rows(2, 2)}, 2)
    assert gated.batches == [1, 2]  # the 4-row request never ran
    await batcher.close()


async def test_an_engine_error_fans_out_to_its_batch_only(gated, reference) -> None:
    batcher = await make_batcher(gated)
    gated.gate.clear()
    blocker = asyncio.create_task(batcher.infer({"input": rows(1, 0)}, 1))
    await started(gated)
    batch = [asyncio.create_task(batcher.infer({"input": rows(1, i)}, 1)) for i in range(4)]
    await queued(batcher, 4)
    gated.fail_rows = 4  # the batch of the four queued requests fails
    gated.gate.set()
    await blocker
    outcomes = await asyncio.gather(*batch, return_exceptions=True)
    assert all(isinstance(o, EngineFailed) and o.status == 500 for o in outcomes), outcomes
    gated.fail_rows = None
    after = await batcher.infer({"input": rows(1, 5)}, 1)
    np.testing.assert_allclose(after["logits"], reference(rows(1, 5)), rtol=1e-5, atol=1e-6)
    await batcher.close()


async def test_a_cancelled_request_is_not_executed(gated) -> None:
    batcher = await make_batcher(gated)
    gated.gate.clear()
    running = asyncio.create_task(batcher.infer({"input": rows(1, 0)}, 1))
    await started(gated)
    gone = asyncio.create_task(batcher.infer({"input": rows(5, 1)}, 5))
    kept = asyncio.create_task(batcher.infer({"input": rows(2, 2)}, 2))
    await queued(batcher, 2)
    gone.cancel()
    await asyncio.wait([gone])
    gated.gate.set()
    await asyncio.gather(running, kept)
    assert gone.cancelled()
    assert gated.batches == [1, 2]
    await batcher.close()


async def test_a_lone_request_pays_no_queue_delay(gated) -> None:
    # A clock that never moves: had the batcher waited for the queue delay (or for more
    # requests), its time would never come, and the request would never be answered.
    policy = BatchingPolicy(
        execution_slots=2, preferred_batch_sizes=[8], max_queue_delay_microseconds=1_000_000
    )
    batcher = Batcher(gated, policy, clock=lambda: 1000.0)
    await batcher.start()
    await at_once(batcher.infer({"input": rows(1, 0)}, 1), "a lone request", 60)
    await batcher.close()


async def test_execution_slots_run_batches_concurrently(gated) -> None:
    batcher = await make_batcher(gated, execution_slots=2, max_queue_delay_microseconds=0)
    gated.gate.clear()
    first = asyncio.create_task(batcher.infer({"input": rows(1, 0)}, 1))
    await started(gated)
    second = asyncio.create_task(batcher.infer({"input": rows(1, 1)}, 1))
    await started(gated, running=2)
    gated.gate.set()
    await asyncio.gather(first, second)
    assert gated.max_running == 2
    await batcher.close()


async def test_drain_refuses_new_requests_and_answers_queued_ones(gated) -> None:
    batcher = await make_batcher(gated, preferred_batch_sizes=[8])
    gated.gate.clear()
    running = asyncio.create_task(batcher.infer({"input": rows(1, 0)}, 1))
    await started(gated)
    waiting = [asyncio.create_task(batcher.infer({"input": rows(1, i)}, 1)) for i in range(5)]
    await queued(batcher, 5)
    drain = asyncio.create_task(batcher.drain(timeout_seconds=60))
    await eventually(lambda: batcher.draining, what="the drain", every=0.002, in_thread=False)
    assert not batcher.accepting
    with pytest.raises(NotReady):
        await batcher.infer({"input": rows(1, 7)}, 1)
    gated.gate.set()
    assert await drain is True
    results = await asyncio.gather(running, *waiting)
    assert all(r["logits"].shape == (1, 10) for r in results)
    await batcher.close()


async def test_a_lone_fast_request_runs_on_the_event_loop(gated, reference) -> None:
    # "Fast" is generous here: a busy test machine must not make the tiny model slow.
    batcher = Batcher(gated, BatchingPolicy(execution_slots=1), inline_below_seconds=1.0)
    await batcher.start()
    first = await batcher.infer({"input": rows(1, 0)}, 1)  # unknown speed: a worker thread
    second = await batcher.infer({"input": rows(2, 1)}, 2)  # known fast, server idle: inline
    assert gated.threads[0] != threading.get_ident()
    assert gated.threads[1] == threading.get_ident()
    np.testing.assert_allclose(first["logits"], reference(rows(1, 0)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second["logits"], reference(rows(2, 1)), rtol=1e-5, atol=1e-6)
    gated.fail_rows = 1
    with pytest.raises(EngineFailed):  # an inline engine error is the request's 500
        await batcher.infer({"input": rows(1, 2)}, 1)
    await batcher.close()


async def test_a_small_batch_goes_to_a_thread_while_another_batch_runs(gated) -> None:
    # Pins the inline guard: on the event loop, a small batch would stall the loop (every
    # other request's reading and answering) while a worker thread still runs a batch; it
    # runs inline only when nothing else runs, and once alone again it does.
    batcher = Batcher(gated, BatchingPolicy(execution_slots=2), inline_below_seconds=1.0)
    await batcher.start()
    await batcher.infer({"input": rows(1, 0)}, 1)  # small batches are now known fast
    gated.held_rows = 5  # 5 rows: a worker thread's batch, held there
    gated.gate.clear()
    held = asyncio.create_task(batcher.infer({"input": rows(5, 1)}, 5))
    await started(gated)
    await asyncio.wait_for(batcher.infer({"input": rows(1, 2)}, 1), 5)
    assert gated.threads[-1] != threading.get_ident(), (
        "a small batch ran on the event loop while another batch ran in a worker thread"
    )
    gated.gate.set()
    await held
    await batcher.infer({"input": rows(1, 3)}, 1)
    assert gated.threads[-1] == threading.get_ident(), "alone again, it runs inline"
    await batcher.close()


async def test_slow_batches_always_run_in_worker_threads(gated) -> None:
    batcher = Batcher(gated, BatchingPolicy(execution_slots=1), inline_below_seconds=0.0)
    await batcher.start()
    for seed in range(3):
        await batcher.infer({"input": rows(1, seed)}, 1)
    assert threading.get_ident() not in gated.threads
    await batcher.close()


class StartedBatches(NoObserver):
    """Records the batches the batcher starts, in order."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def batch_started(self, rows: int, queue_seconds) -> None:
        self.rows.append(rows)


async def test_a_freed_slot_starts_the_queued_batch_before_the_finished_one_is_answered(
    gated,
) -> None:
    # Answering wakes every handler of the finished batch; if the next batch waited for
    # them, the engine would idle while their responses are encoded.
    observer = StartedBatches()
    batcher = Batcher(
        gated, BatchingPolicy(execution_slots=1), observer=observer, inline_below_seconds=0.0
    )
    await batcher.start()
    gated.gate.clear()

    async def first_request() -> int:
        await batcher.infer({"input": rows(1, 0)}, 1)
        return len(observer.rows)  # batches started when this request got its answer

    first = asyncio.create_task(first_request())
    await started(gated)
    waiting = [asyncio.create_task(batcher.infer({"input": rows(1, i)}, 1)) for i in (1, 2)]
    await queued(batcher, 2)
    gated.gate.set()
    assert await first == 2
    await asyncio.gather(*waiting)
    assert observer.rows == [1, 2]
    await batcher.close()


async def test_unset_execution_slots_take_the_engines_choice(gated) -> None:
    # ONNX Runtime's threads already fill the cores: one slot, so requests arriving while
    # it runs queue into the next batch instead of running beside it.
    assert BatchingPolicy().execution_slots is None
    assert gated.default_execution_slots == 1
    batcher = Batcher(gated, BatchingPolicy(max_queue_delay_microseconds=0))
    await batcher.start()
    gated.gate.clear()
    first = asyncio.create_task(batcher.infer({"input": rows(1, 0)}, 1))
    await started(gated)
    second = asyncio.create_task(batcher.infer({"input": rows(1, 1)}, 1))
    await queued(batcher, 1)  # queued behind the held slot, not run beside it
    assert gated.running == 1
    gated.gate.set()
    await asyncio.gather(first, second)
    assert gated.max_running == 1
    await batcher.close()
