"""Runs batches on an engine's execution slots: the worker-thread pool, the inline
shortcut, the measured speed of small batches, and the watchdog's bound on a batch.

Each slot has its own buffers and a worker thread to run in (the engine blocks; the event
loop must not), so `executionSlots` batches run concurrently. Whether a batch runs
inline, on the event loop, is the policy's decision (`policy.runs_inline`); this module
measures what that decision needs (`small_batches`) and carries it out.

A batch in a worker thread is bounded by the latest deadline of its requests
(`watchdog.batch_bound`): past it, its requests are answered `EngineTimeout` through
`on_stuck` (nobody waits for them any more) and the engine counts as stuck until the
batch returns, however long that takes.

Whatever happens, a batch ends as one `BatchOutcome`: each request's outputs, or the one
error all of them get. A batch whose outputs do not hold its rows
(`assembler.check_output_rows`) is such an error, counted (`output_row_mismatches`, the
observer's metric) and logged with the model, the output and both counts. The slot goes
back before the outcome is returned, so the caller can start the next batch on it before
answering this one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from kubeinfer.runtime.batching import assembler
from kubeinfer.runtime.batching.observer import BatchObserver
from kubeinfer.runtime.batching.policy import SmallBatchSpeed
from kubeinfer.runtime.batching.shapes import RequestShape
from kubeinfer.runtime.batching.watchdog import EngineWatchdog
from kubeinfer.runtime.engines.base import Engine, ExecutionSlot, slot_buffer_bytes
from kubeinfer.runtime.protocol.errors import EngineFailed, EngineTimeout, OutputRowsMismatch

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class BatchRan:
    """The engine ran the batch: each request's outputs, in the batch's order, and the
    compute seconds (packing, running, copying out; no thread hand-offs)."""

    outputs: list[Outputs]
    compute_seconds: float


@dataclass(frozen=True, slots=True)
class BatchFailed:
    """Every request of the batch gets `error`: the engine failed on it, or (given to
    `on_stuck`) it outlived its requests' deadlines."""

    error: EngineFailed | EngineTimeout


BatchOutcome = BatchRan | BatchFailed


@dataclass(frozen=True, slots=True)
class SlotLease:
    """A slot taken for one batch of `requests` requests, until the batch's outcome."""

    slot: ExecutionSlot
    requests: int


class SlotRunner:
    """The execution slots of one engine and the threads they run in.

    Use: `start()`, then for each batch `take()` a slot (while `free_slots`) and hand the
    lease to `run_inline` or `run_in_thread`; `close()` at the end.
    """

    def __init__(
        self,
        engine: Engine,
        slots: int | None,
        *,
        clock: Callable[[], float],
        observer: BatchObserver,
        inline_below_seconds: float,
        stuck_liveness_seconds: float,
        pad_values: Mapping[str, float] | None = None,
        model_name: str = "",
    ) -> None:
        self._engine = engine
        self._model_name = model_name
        self.output_row_mismatches = 0
        """Batches failed because an output's rows were not the batch's (since start)."""
        self._pad_values = pad_values or {}
        self._slot_count = slots or engine.default_execution_slots
        self._clock = clock
        self._observer = observer
        self.watchdog = EngineWatchdog(stuck_liveness_seconds)
        self.small_batches = SmallBatchSpeed(inline_below_seconds)
        self._free: list[ExecutionSlot] = []
        self.busy_slots = 0
        self._running_requests = 0  # in the batches on the slots (the autoscaler's)
        self._abandoned_threads = 0
        self._executor: ThreadPoolExecutor | None = None

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def stuck_threads(self) -> bool:
        """A batch's worker thread has not returned (the process cannot join it at exit)."""
        return self.busy_slots > 0 or self._abandoned_threads > 0

    def start(self) -> None:
        """Creates the slots (their buffers are allocated here, once) and their threads,
        and reports the memory those buffers hold (log and metrics)."""
        self._free = [self._engine.create_slot() for _ in range(self._slot_count)]
        total = self._slot_count * slot_buffer_bytes(self._engine)
        self._observer.engine_buffers(total)
        log.info(
            "Allocated engine buffers slots=%d bytes=%d (%.1f MiB) max_batch_size=%d",
            self._slot_count, total, total / 2**20, self._engine.max_batch_size,
        )  # fmt: skip
        self._executor = ThreadPoolExecutor(
            max_workers=self._slot_count, thread_name_prefix="kubeinfer-slot"
        )

    def take(self, requests: int) -> SlotLease:
        """A free slot, for a batch of `requests` requests (the caller checked `free_slots`)."""
        lease = SlotLease(self._free.pop(), requests)
        self.busy_slots += 1
        self._running_requests += requests
        self._report_in_flight()
        return lease

    def run_inline(
        self,
        lease: SlotLease,
        inputs: Sequence[Mapping[str, np.ndarray]],
        rows: int,
        shapes: Sequence[RequestShape] | None = None,
    ) -> BatchOutcome:
        """Runs a batch on the event loop (`policy.runs_inline` chose it: small, alone and
        known fast) and gives its slot back. `shapes`: each request's, for a model with
        variable axes (they share one batch shape)."""
        outcome: BatchOutcome
        try:
            outcome = self._execute(lease.slot, inputs, rows, shapes)
        except Exception as error:
            outcome = self._failed(rows, error)
        self._give_back(lease, rows, outcome)
        return outcome

    async def run_in_thread(
        self,
        lease: SlotLease,
        inputs: Sequence[Mapping[str, np.ndarray]],
        rows: int,
        *,
        bound: float,
        oldest_arrival: float,
        on_stuck: Callable[[EngineTimeout], None],
        shapes: Sequence[RequestShape] | None = None,
    ) -> BatchOutcome:
        """Runs a batch in a worker thread and gives its slot back. Past monotonic time
        `bound` it calls `on_stuck` once and goes on waiting. Cancelled while the thread
        still runs (the loop is ending), the slot stays taken: the thread is in it."""
        running = asyncio.get_running_loop().run_in_executor(
            self._executor, self._execute, lease.slot, inputs, rows, shapes
        )
        outcome: BatchOutcome
        try:
            done, _ = await asyncio.wait({running}, timeout=max(0.0, bound - self._clock()))
            if done:
                outcome = running.result()
            else:
                outcome = await self._outlive(running, lease, rows, oldest_arrival, on_stuck)
        except asyncio.CancelledError:
            if not running.done():
                self._abandoned_threads += 1
                raise
            outcome = self._failed(rows, EngineFailed("the batch was cancelled before it finished"))
        except Exception as error:
            outcome = self._failed(rows, error)
        self._give_back(lease, rows, outcome)
        return outcome

    async def _outlive(
        self,
        running: asyncio.Future[BatchRan],
        lease: SlotLease,
        rows: int,
        oldest_arrival: float,
        on_stuck: Callable[[EngineTimeout], None],
    ) -> BatchOutcome:
        """A batch past its bound: its requests get EngineTimeout now, and the engine
        counts as stuck until the batch returns."""
        now = self._clock()
        self.watchdog.batch_stuck(now)
        self._observer.stuck_batches(self.watchdog.stuck_batches)
        log.error(
            "Engine has not returned a batch past its requests' deadlines requests=%d "
            "seconds_since_arrival=%.3f; readiness is off until it returns",
            lease.requests, now - oldest_arrival,
        )  # fmt: skip
        on_stuck(
            EngineTimeout(
                f"the engine did not finish this request's batch by its deadline "
                f"({(now - oldest_arrival) * 1000:.0f} ms after the oldest request arrived); "
                "the engine may be stuck"
            )
        )
        outcome: BatchOutcome
        try:
            outcome = await asyncio.shield(running)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            outcome = self._failed(rows, error)
        self.watchdog.batch_returned()
        self._observer.stuck_batches(self.watchdog.stuck_batches)
        log.warning("Engine returned the stuck batch after %.3f s", self._clock() - now)
        return outcome

    def _execute(
        self,
        slot: ExecutionSlot,
        inputs: Sequence[Mapping[str, np.ndarray]],
        rows: int,
        shapes: Sequence[RequestShape] | None = None,
    ) -> BatchRan:
        """Pack into the slot's buffers, run, copy each request's rows out before the slot
        is reused (in a worker thread, or inline). A batch of a model with variable axes
        runs at its requests' one batch shape, padded and cut back where they need it."""
        started = self._clock()
        if not shapes:
            ranges = assembler.pack(inputs, slot.input_views(rows))
            ran = slot.run(rows)
            assembler.check_output_rows(self._model_name, ran, rows)
            return BatchRan(assembler.split(ran, ranges), self._clock() - started)
        shape = shapes[0].batch_shape
        views = slot.input_views(rows, shape)
        ranges = assembler.pack_padded(inputs, views, self._pad_values)
        cuts = [request.cut for request in shapes]
        ran = slot.run(rows, shape)
        assembler.check_output_rows(self._model_name, ran, rows)
        return BatchRan(assembler.split(ran, ranges, cuts), self._clock() - started)

    def _give_back(self, lease: SlotLease, rows: int, outcome: BatchOutcome) -> None:
        compute_seconds = outcome.compute_seconds if isinstance(outcome, BatchRan) else 0.0
        self._observer.batch_finished(compute_seconds)
        self.small_batches = self.small_batches.measured(rows, compute_seconds)
        self._free.append(lease.slot)
        self.busy_slots -= 1
        self._running_requests -= lease.requests
        self._report_in_flight()

    def _report_in_flight(self) -> None:
        self._observer.inflight_batches(self.busy_slots)
        self._observer.inflight_requests(self._running_requests)

    def close(self) -> None:
        """Stops the threads and releases the free slots. A slot still busy (a stuck
        batch's thread is inside it) is left open and its thread not waited for."""
        if self._executor is not None:
            self._executor.shutdown(wait=not self.busy_slots, cancel_futures=True)
        for slot in self._free:
            slot.close()
        self._free = []

    def _failed(self, rows: int, error: BaseException) -> BatchFailed:
        """The batch's one error: an output's rows not the batch's (counted, and logged
        without a traceback: it is the model's answer, not a crash), or the engine's."""
        if isinstance(error, OutputRowsMismatch):
            self.output_row_mismatches += 1
            self._observer.output_rows_mismatched()
            log.error("Failed a batch whose outputs do not hold its rows: %s", error)
            return BatchFailed(error)
        log.error("Engine failed on a batch of %d rows", rows, exc_info=error)
        return BatchFailed(EngineFailed(f"the engine failed on this request's batch: {error}"))
