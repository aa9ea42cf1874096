"""The dynamic batcher's mechanism: one asyncio queue per model in front of an engine's
execution slots.

Everything that decides *when* lives in `policy.next_decision` and everything that decides
*how* to pack lives in `assembler`; this module only applies them: it admits requests
(`admit`, at their arrival, before their body is read: `maxQueueSize` bounds the requests
admitted and not yet running, so a full server refuses with `Overloaded`, a 503 with
Retry-After, without reading or decoding anything), keeps one future per request, runs a
scheduler task that asks the policy what to do, answers expired requests with
`DeadlineExceeded` without running them (deadlines count from arrival), skips requests
whose caller went away (cancelled futures), and runs each batch on a free slot in a worker
thread (the engine blocks; the event loop must not), so `executionSlots` batches run
concurrently. An engine exception is given to every request of its batch. A batch still
running at the latest deadline of its requests is answered `EngineTimeout` and counted
stuck by the `watchdog` until it returns. Time comes from an injected monotonic clock.

One shortcut: a batch of at most 4 rows, when no other batch is running and the model's
small batches are known to take less than `inline_below_seconds`, runs right on the event
loop, as a hand-written unbatched server would. Handing a sub-millisecond batch to a
worker thread and back costs more than the batch itself (two thread wake-ups: ~50 us on an
idle machine, 0.5 ms on a busy one). It is still the scheduler that runs it, after the
handlers whose requests arrived together have queued theirs, so requests arriving while
it runs wait in their sockets and form the next batch: batching is not lost. Larger or
slower batches go to the worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching import assembler
from kubeinfer.runtime.batching.observer import BatchObserver, NoObserver
from kubeinfer.runtime.batching.policy import Flush, Pending, next_decision
from kubeinfer.runtime.batching.watchdog import EngineWatchdog, batch_bound
from kubeinfer.runtime.engines.base import Engine, ExecutionSlot
from kubeinfer.runtime.protocol.errors import (
    DeadlineExceeded,
    EngineFailed,
    EngineTimeout,
    InferenceServerError,
    NotReady,
    Overloaded,
)

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Admission:
    """A request admitted at `arrived_at`: it holds a place (counted against
    maxQueueSize) until it is queued or `release`d, whichever comes first."""

    arrived_at: float
    deadline: float
    """By the default timeout; the request's own `timeout` replaces it once decoded."""
    stage: str = "reading"
    """reading (its body), waiting (decoding or queued), running (in a batch)."""
    holds_place: bool = True


@dataclass(slots=True, eq=False)
class _Request:
    inputs: Mapping[str, np.ndarray]
    view: Pending
    future: asyncio.Future[dict[str, np.ndarray]]
    admission: Admission


class Batcher:
    """Queues requests for one model and runs them in batches on the engine's slots.

    Use: `await start()`, then `await infer(...)` from request handlers; `await drain()`
    on shutdown (stops admission, answers everything queued), then `await close()`.
    """

    def __init__(
        self,
        engine: Engine,
        policy: BatchingPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: BatchObserver | None = None,
        inline_below_seconds: float = 0.0025,
        stuck_liveness_seconds: float = 60.0,
    ) -> None:
        if policy.max_batch_size > engine.max_batch_size:
            raise ValueError(
                f"maxBatchSize {policy.max_batch_size} exceeds the engine's {engine.max_batch_size}"
            )
        self._engine = engine
        self._policy = policy
        self._clock = clock
        self._observer = observer or NoObserver()
        self._queue: deque[_Request] = deque()
        self._slots: list[ExecutionSlot] = []
        self._free: list[ExecutionSlot] = []
        self._busy = 0
        self._running_requests = 0  # requests in the batches on the slots (the autoscaler's)
        self._stepping = False  # inside _step: a batch finishing inline must not recurse
        self._reserved = 0  # admitted, not yet queued (reading or decoding their bodies)
        self._accepting = False
        self._draining = False
        self._closed = False
        self.watchdog = EngineWatchdog(stuck_liveness_seconds)
        self._next_wake: float | None = None
        self._wakeup: asyncio.Event | None = None
        self._scheduler: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self._stuck_tasks: set[asyncio.Task[None]] = set()
        self._abandoned_threads = 0
        self._executor: ThreadPoolExecutor | None = None
        self._inline_below = inline_below_seconds
        self._small_batch_seconds: float | None = None  # moving average, batches <= 4 rows

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def admitted(self) -> int:
        """Requests admitted and not yet running: queued, or still being read or decoded."""
        return len(self._queue) + self._reserved

    @property
    def idle(self) -> bool:
        """Nothing admitted, queued or running (a stuck batch aside: its requests are
        answered)."""
        return not self._queue and not self._reserved and self._busy <= self.watchdog.stuck_batches

    async def start(self) -> None:
        """Creates the slots (their buffers are allocated here, once) and the scheduler."""
        slots = self._policy.execution_slots or self._engine.default_execution_slots
        self._slots = [self._engine.create_slot() for _ in range(slots)]
        self._free = list(self._slots)
        self._executor = ThreadPoolExecutor(
            max_workers=len(self._slots), thread_name_prefix="kubeinfer-slot"
        )
        self._wakeup = asyncio.Event()
        self._accepting = True
        self._scheduler = asyncio.create_task(self._schedule(), name="kubeinfer-batcher")

    def admit(self, now: float | None = None) -> Admission:
        """Admits one request arriving now, before anything of it is read; raises NotReady
        (not started, draining, or the engine stuck) or Overloaded (maxQueueSize requests
        admitted and not yet running). `release` it if it ends before `infer`."""
        if not self._accepting or self._wakeup is None:
            raise NotReady("the server is shutting down" if self._draining else "not started")
        if self.watchdog.stuck:
            raise NotReady(
                f"the engine has not returned a batch for "
                f"{self.watchdog.stuck_for(self._clock()):.1f} s; retry later"
            )
        if len(self._queue) + self._reserved >= self._policy.max_queue_size:
            raise Overloaded(
                f"the queue is full ({self._policy.max_queue_size} requests); retry later"
            )
        now = self._clock() if now is None else now
        self._reserved += 1
        return Admission(now, now + self._policy.default_timeout_milliseconds / 1000)

    def release(self, admission: Admission) -> None:
        """Gives back the place of an admitted request that will not be queued; idempotent."""
        if admission.holds_place:
            admission.holds_place = False
            self._reserved -= 1

    async def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        rows: int,
        timeout_seconds: float | None = None,
        *,
        admission: Admission | None = None,
    ) -> dict[str, np.ndarray]:
        """Runs one request (already checked by `assembler.check_inputs`) in some batch and
        returns its outputs; raises Overloaded, NotReady, DeadlineExceeded, EngineTimeout or
        EngineFailed. An `admission` from `admit` queues it in the place it holds (also
        while draining: it was admitted before); its deadline counts from its arrival."""
        if admission is None:
            admission = self.admit()
        try:
            if self._closed or self._wakeup is None:
                raise NotReady("the server stopped")
            if timeout_seconds is not None:
                admission.deadline = admission.arrived_at + timeout_seconds
            request = _Request(
                inputs,
                # Queued now (the policy's delay and the queue histogram count from here);
                # the deadline counts from the request's arrival.
                Pending(rows, self._clock(), admission.deadline),
                asyncio.get_running_loop().create_future(),
                admission,
            )
        finally:
            self.release(admission)
        admission.stage = "waiting"
        self._queue.append(request)
        # Wake the scheduler only when it could act: a slot is free, or this request's
        # deadline comes before the time it already plans to wake at.
        if self._free or self._next_wake is None or request.view.deadline < self._next_wake:
            self._wakeup.set()
        return await request.future

    def _run_inline(self, slot: ExecutionSlot, batch: list[_Request], rows: int) -> None:
        """Runs a small batch on the event loop (see the module docstring)."""
        outcome: _Outcome
        try:
            outcome = _execute(slot, [r.inputs for r in batch], rows)
        except Exception as error:
            outcome = error
        self._complete(slot, batch, rows, outcome)

    def _complete(
        self,
        slot: ExecutionSlot,
        batch: list[_Request],
        rows: int,
        outcome: _Outcome,
    ) -> None:
        """Answers every request of a finished batch (one engine error fans out to all of
        them) and gives the slot back."""
        seconds = 0.0
        if isinstance(outcome, Exception):
            log.error("Engine failed on a batch of %d rows", rows, exc_info=outcome)
            failure = EngineFailed(f"the engine failed on this request's batch: {outcome}")
            answers: list[tuple[asyncio.Future[dict[str, np.ndarray]], Any]] = [
                (request.future, failure) for request in batch
            ]
        else:
            results, seconds = outcome
            answers = [(r.future, result) for r, result in zip(batch, results, strict=True)]
        self._batch_done(slot, rows, seconds)
        self._running_requests -= len(batch)
        self._observer.inflight_batches(self._busy)
        self._observer.inflight_requests(self._running_requests)
        # The freed slot takes what queued meanwhile *before* this batch is answered:
        # answering wakes every handler, and the loop would encode all their responses
        # while the engine sat idle (it measured ~80% busy that way, ~96% this way).
        if not self._stepping:
            self._start_queued_batches()
        for future, answer in answers:
            if future.done():
                continue
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)

    def _start_queued_batches(self) -> None:
        try:
            while self._step() is False:
                pass
        except Exception:  # the scheduler, woken right after, handles and reports it
            log.debug("Starting the next batch early failed", exc_info=True)

    def _batch_done(self, slot: ExecutionSlot, rows: int, seconds: float) -> None:
        self._observer.batch_finished(seconds)
        if rows <= _SMALL_BATCH_ROWS and seconds > 0:
            average = self._small_batch_seconds
            self._small_batch_seconds = (
                seconds if average is None else 0.8 * average + 0.2 * seconds
            )
        self._free.append(slot)
        self._busy -= 1

    async def drain(self, timeout_seconds: float) -> bool:
        """Stops admission and waits until every admitted request is answered (those still
        being read or decoded are queued and run too); False if that took longer than
        `timeout_seconds`."""
        self._accepting = False
        self._draining = True
        if self._wakeup is not None:
            self._wakeup.set()
        deadline = time.monotonic() + timeout_seconds
        while not self.idle:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    async def close(self, timeout_seconds: float = 5.0) -> None:
        """Stops the scheduler, fails whatever is left, and releases the slots. A stuck
        batch is not waited for past `timeout_seconds`, and its slot is left open (its
        thread is still inside it): see `stuck_threads`."""
        self._accepting = False
        self._closed = True
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.gather(self._scheduler, return_exceptions=True)
        self._fail_queued(NotReady("the server stopped"))
        running = self._batches - self._stuck_tasks  # a stuck batch's requests are answered
        if running:
            await asyncio.wait(running, timeout=timeout_seconds)
        if self._executor is not None:
            self._executor.shutdown(wait=not self._busy, cancel_futures=True)
        for slot in self._free:
            slot.close()
        self._slots, self._free = [], []

    @property
    def stuck_threads(self) -> bool:
        """A batch's worker thread has not returned (the process cannot join it at exit)."""
        return self._busy > 0 or self._abandoned_threads > 0

    def _fail_queued(self, error: InferenceServerError) -> None:
        while self._queue:
            request = self._queue.popleft()
            if not request.future.done():
                request.future.set_exception(error)

    async def _schedule(self) -> None:
        assert self._wakeup is not None
        while True:
            self._wakeup.clear()
            try:
                wait_until = self._step()
            except Exception:  # a bug here must not leave callers waiting forever
                log.exception("Batch scheduler failed; failing the queued requests")
                self._fail_queued(EngineFailed("internal batching error"))
                wait_until = None
            if wait_until is False:
                continue  # flushed a batch: decide again at once
            self._next_wake = wait_until
            if wait_until is None:
                await self._wakeup.wait()
                continue
            # A timer that sets the same event: cheaper than wait_for's task per wait.
            timer = asyncio.get_running_loop().call_later(
                max(0.0, wait_until - self._clock()), self._wakeup.set
            )
            try:
                await self._wakeup.wait()
            finally:
                timer.cancel()

    def _step(self) -> float | bool | None:
        """One policy decision, applied. Returns False after starting a batch, else the
        monotonic time to wake at (None: at the next event)."""
        self._stepping = True
        try:
            return self._decide_and_start()
        finally:
            self._stepping = False

    def _decide_and_start(self) -> float | bool | None:
        queue = self._queue
        if any(r.future.done() for r in queue):  # callers that went away
            self._queue = queue = deque(r for r in queue if not r.future.done())
        now = self._clock()
        decision = next_decision(
            self._policy,
            [r.view for r in queue],
            len(self._free),
            self._busy,
            now,
            self._draining,
        )
        if decision.expired:
            expired = set(decision.expired)
            kept: deque[_Request] = deque()
            for index, request in enumerate(queue):
                if index in expired:
                    since_arrival_ms = (now - request.admission.arrived_at) * 1000
                    queued_ms = (now - request.view.arrived_at) * 1000
                    request.future.set_exception(
                        DeadlineExceeded(
                            f"the request's deadline passed {since_arrival_ms:.1f} ms after "
                            f"it arrived, {queued_ms:.1f} ms of them in the queue; it was "
                            "not executed"
                        )
                    )
                else:
                    kept.append(request)
            self._queue = queue = kept
        action = decision.action
        if not isinstance(action, Flush):
            self._observer.queue_depth(len(queue))
            return action.at
        batch = [queue.popleft() for _ in range(action.count)]
        self._observer.queue_depth(len(queue))
        slot = self._free.pop()
        self._busy += 1
        self._running_requests += len(batch)
        for request in batch:
            request.admission.stage = "running"
        self._observer.inflight_batches(self._busy)
        self._observer.inflight_requests(self._running_requests)
        self._observer.batch_started(action.rows, [now - r.view.arrived_at for r in batch])
        if (
            self._busy == 1  # this batch alone: nothing runs in a worker thread
            and action.rows <= _SMALL_BATCH_ROWS
            and self._small_batch_seconds is not None
            and self._small_batch_seconds < self._inline_below
        ):
            self._run_inline(slot, batch, action.rows)
            return False
        task = asyncio.create_task(self._run_batch(slot, batch, action.rows))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)
        return False

    async def _run_batch(self, slot: ExecutionSlot, batch: list[_Request], rows: int) -> None:
        running = asyncio.get_running_loop().run_in_executor(
            self._executor, _execute, slot, [r.inputs for r in batch], rows
        )
        bound = batch_bound(r.view.deadline for r in batch)
        outcome: _Outcome
        try:
            done, _ = await asyncio.wait({running}, timeout=max(0.0, bound - self._clock()))
            if not done:
                self._stuck_tasks.add(asyncio.current_task())  # type: ignore[arg-type]
                outcome = await self._outlive(running, batch)
            else:
                outcome = running.result()
        except asyncio.CancelledError:
            if not running.done():  # the loop is ending: the thread stays in the engine,
                self._abandoned_threads += 1  # and so does the slot
                raise
            outcome = EngineFailed("the batch was cancelled before it finished")
        except Exception as error:
            outcome = error
        self._stuck_tasks.discard(asyncio.current_task())
        self._complete(slot, batch, rows, outcome)
        assert self._wakeup is not None
        self._wakeup.set()

    async def _outlive(
        self, running: asyncio.Future[tuple[list[dict[str, np.ndarray]], float]], batch: list
    ) -> _Outcome:
        """A batch past its bound: its requests get EngineTimeout now, and the engine
        counts as stuck until the batch returns (however long that takes)."""
        started = min(r.admission.arrived_at for r in batch)
        now = self._clock()
        self.watchdog.batch_stuck(now)
        self._observer.stuck_batches(self.watchdog.stuck_batches)
        log.error(
            "Engine has not returned a batch past its requests' deadlines requests=%d "
            "seconds_since_arrival=%.3f; readiness is off until it returns",
            len(batch), now - started,
        )  # fmt: skip
        error = EngineTimeout(
            f"the engine did not finish this request's batch by its deadline "
            f"({(now - started) * 1000:.0f} ms after the oldest request arrived); "
            "the engine may be stuck"
        )
        for request in batch:
            if not request.future.done():
                request.future.set_exception(error)
        try:
            outcome: _Outcome = await asyncio.shield(running)
        except asyncio.CancelledError:
            raise
        except Exception as failure:
            outcome = failure
        self.watchdog.batch_returned()
        self._observer.stuck_batches(self.watchdog.stuck_batches)
        log.warning("Engine returned the stuck batch after %.3f s", self._clock() - now)
        return outcome


_SMALL_BATCH_ROWS = 4

# What a batch ends with: each request's outputs and the compute seconds, or the error.
_Outcome = tuple[list[dict[str, np.ndarray]], float] | Exception


def _execute(
    slot: ExecutionSlot, inputs: list[Mapping[str, np.ndarray]], rows: int
) -> tuple[list[dict[str, np.ndarray]], float]:
    """Runs in a worker thread: pack into the slot's buffers, run, copy each request's rows
    out before the slot is reused. Also returns how long that took (the compute time,
    without the thread hand-offs)."""
    started = time.perf_counter()
    ranges = assembler.pack(inputs, slot.input_views(rows))
    results = assembler.split(slot.run(rows), ranges)
    return results, time.perf_counter() - started
