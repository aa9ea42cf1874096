"""The batcher's scheduler: the queue of admitted requests, one future per request, and
the one task that asks the policy what to do and does it.

Each step takes the queue as it stands (requests whose caller went away dropped), asks
`policy.next_decision` with the clock's `now` and the slot runner's free slots and
measured speed, answers the requests it found expired with `DeadlineExceeded` (never
run), and either flushes a batch onto a slot (inline or in a worker thread, as the
decision says) and decides again, or sleeps until the time the decision names or the
next event: a request queued that could change the decision, or a batch finished. When
the decision is to wait some turns of the event loop for company (requests a transport
hands over turns apart), it lets them pass, counting those with no arrival, and decides
again at the first arrival or once they have passed.

A batch finishing in a worker thread neither answers its requests nor starts the next
batch itself: it leaves its outcome for the scheduler and wakes it, and the scheduler's
next pass starts what the freed slot can take and answers the finished batch, in that
order and without yielding in between. Answering wakes every handler of the batch; were
they woken before the next batch started, the loop would encode all their responses
while the engine sat idle (the engine measured ~80% busy that way, ~96% this way).

With batching policy Adaptive the scheduler also measures what `adaptive.next_setting`
needs (the rows queued, with the clock's `now`; each finished batch's rows and compute
seconds, and whether another batch ran beside it on another slot at some time) and, at
most every DECISION_INTERVAL_SECONDS, at a step, asks it for the queue delay and preferred
batch size that the policy's flush rules then read, and for the batches it lets run at
once. With Static it measures nothing and the configured policy is the one read.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubeinfer.contract.runtime_config import BatchingPolicy, BatchingPolicyKind
from kubeinfer.runtime.batching.adaptive import (
    DECISION_INTERVAL_SECONDS,
    BatchSetting,
    LatencyTarget,
    MeasuredLoad,
    next_setting,
    status_of,
)
from kubeinfer.runtime.batching.admission import Admission
from kubeinfer.runtime.batching.observer import BatchObserver
from kubeinfer.runtime.batching.policy import Flush, Pending, WaitTurns, WaitUntil, next_decision
from kubeinfer.runtime.batching.shapes import RequestShape
from kubeinfer.runtime.batching.slot_runner import (
    BatchFailed,
    BatchOutcome,
    BatchRan,
    Outputs,
    SlotLease,
    SlotRunner,
)
from kubeinfer.runtime.batching.watchdog import batch_bound
from kubeinfer.runtime.protocol.errors import (
    EngineFailed,
    EngineTimeout,
    InferenceServerError,
    NotReady,
)

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class _Request:
    inputs: Mapping[str, np.ndarray]
    view: Pending
    future: asyncio.Future[Outputs]
    admission: Admission
    shape: RequestShape | None = None


@dataclass(slots=True, eq=False)
class _Overlap:
    """Whether a batch has run beside another one (on another slot) at some time."""

    beside: bool


@dataclass(frozen=True, slots=True)
class _Finished:
    """A batch that ran, waiting for the scheduler to answer its requests."""

    batch: list[_Request]
    outcome: BatchOutcome
    rows: int
    overlap: _Overlap


class Scheduler:
    """Queues requests and flushes them in batches onto the slot runner's slots."""

    def __init__(
        self,
        policy: BatchingPolicy,
        runner: SlotRunner,
        *,
        clock: Callable[[], float],
        observer: BatchObserver,
        slo_p99_latency_milliseconds: float | None = None,
    ) -> None:
        adaptive = policy.policy == BatchingPolicyKind.ADAPTIVE
        if adaptive and slo_p99_latency_milliseconds is None:
            raise ValueError("batching policy Adaptive needs an SLO (sloP99LatencyMilliseconds)")
        self._configured = policy
        self._policy = policy
        """What `policy.next_decision` reads: the configured policy, with the adaptive
        setting's delay and preferred size under Adaptive."""
        self._slo_p99_latency_milliseconds = slo_p99_latency_milliseconds
        self._adaptive = adaptive
        self._load = MeasuredLoad()
        self.setting = BatchSetting.of_policy(policy)
        """The queue delay and preferred batch size in force (Static: the configured ones)."""
        self._decide_at = 0.0
        self._running: list[_Overlap] = []  # of the batches in worker threads
        self._runner = runner
        self._clock = clock
        self._observer = observer
        self._queue: deque[_Request] = deque()
        self._arrivals = 0
        self._quiet_turns = 0
        """Loop turns in a row, waited for company (`WaitTurns`), that saw no arrival."""
        self._finished: deque[_Finished] = deque()
        self.draining = False
        """Nothing waits for a better batch size any more (policy rule 4)."""
        self._stopped = False
        self._wakeup: asyncio.Event | None = None
        self._next_wake: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self._stuck_batches: set[asyncio.Task[None]] = set()
        # Reported only where there is something to report: Static's values are its config.
        if slo_p99_latency_milliseconds is not None:
            observer.slo_p99_latency(slo_p99_latency_milliseconds / 1000)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def settled(self) -> bool:
        """Nothing queued, and every finished batch answered."""
        return not self._queue and not self._finished

    @property
    def running(self) -> bool:
        return self._task is not None and not self._stopped

    def start(self) -> None:
        """Starts the scheduling task (the slot runner has started: its slots exist)."""
        if self._adaptive:
            self._report(self.setting)
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._schedule(), name="kubeinfer-batcher")

    def enqueue(
        self,
        inputs: Mapping[str, np.ndarray],
        rows: int,
        admission: Admission,
        shape: RequestShape | None = None,
    ) -> asyncio.Future[Outputs]:
        """Queues one request (with its `shape`, for a model with variable axes); its
        future gets its outputs or its error."""
        assert self._wakeup is not None, "enqueue before start"
        now = self._clock()
        if self._adaptive:
            self._load = self._load.arrived(rows, now)
        request = _Request(
            inputs,
            # Queued now (the policy's delay and the queue histogram count from here);
            # the deadline counts from the request's arrival.
            Pending(
                rows,
                now,
                admission.deadline,
                admission.company_turns,
                None if shape is None else shape.batch_shape,
            ),
            asyncio.get_running_loop().create_future(),
            admission,
            shape,
        )
        admission.stage = "waiting"
        self._queue.append(request)
        self._arrivals += 1
        self._quiet_turns = 0
        # Wake the scheduler only when it could act: a slot is free, or this request's
        # deadline comes before the time it already plans to wake at.
        if (
            self._runner.free_slots
            or self._next_wake is None
            or request.view.deadline < self._next_wake
        ):
            self._wakeup.set()
        return request.future

    def drain(self) -> None:
        """From now on nothing waits: everything queued runs as slots free up."""
        self.draining = True
        if self._wakeup is not None:
            self._wakeup.set()

    async def stop(self, timeout_seconds: float) -> None:
        """Stops scheduling and fails whatever is queued; waits up to `timeout_seconds`
        for the running batches (not for a stuck one: its requests are answered)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail_queued(NotReady("the server stopped"))
        self._answer_finished()
        running = self._batches - self._stuck_batches
        if running:
            await asyncio.wait(running, timeout=timeout_seconds)

    async def _schedule(self) -> None:
        assert self._wakeup is not None
        while True:
            self._wakeup.clear()
            wait_until: float | WaitTurns | None
            try:
                wait_until = self._flush_ready()
            except Exception:  # a bug here must not leave callers waiting forever
                log.exception("Batch scheduler failed; failing the queued requests")
                self._fail_queued(EngineFailed("internal batching error"))
                wait_until = None
            self._answer_finished()  # after the freed slots took the next batches
            if isinstance(wait_until, WaitTurns):
                self._next_wake = self._clock()
                await self._wait_turns(wait_until.turns)
                continue
            self._next_wake = wait_until
            await self._sleep_until(wait_until)

    async def _wait_turns(self, turns: int) -> None:
        """Lets up to `turns` turns of the event loop pass, for requests a transport is
        still handing over; returns at the first arrival (which counts the quiet turns
        from zero again), so the policy sees every request that joins."""
        arrivals = self._arrivals
        for _ in range(turns):
            await asyncio.sleep(0)
            if self._arrivals != arrivals:
                return
            self._quiet_turns += 1

    async def _sleep_until(self, wait_until: float | None) -> None:
        assert self._wakeup is not None
        if wait_until is None:
            await self._wakeup.wait()
            return
        # A timer that sets the same event: cheaper than wait_for's task per wait.
        timer = asyncio.get_running_loop().call_later(
            max(0.0, wait_until - self._clock()), self._wakeup.set
        )
        try:
            await self._wakeup.wait()
        finally:
            timer.cancel()

    def _flush_ready(self) -> float | WaitTurns | None:
        """Flushes batches until the policy says wait; returns the monotonic time to wake
        at (None: at the next event), or the loop turns to wait for company."""
        while True:
            action = self._step()
            if isinstance(action, WaitUntil):
                return action.at
            if isinstance(action, WaitTurns):
                return action

    def _step(self) -> Flush | WaitUntil | WaitTurns:
        """One policy decision, applied."""
        queue = self._queue
        if any(r.future.done() for r in queue):  # callers that went away
            self._queue = queue = deque(r for r in queue if not r.future.done())
        now = self._clock()
        if self._adaptive and now >= self._decide_at:
            self._adapt(now)
        free_slots, busy_slots = self._runner.free_slots, self._runner.busy_slots
        limit = self.setting.concurrent_batches
        if limit is not None:  # Adaptive's: a stuck batch does not count against it
            working = busy_slots - self._runner.watchdog.stuck_batches
            free_slots = max(0, min(free_slots, limit - working))
        decision = next_decision(
            self._policy,
            [r.view for r in queue],
            free_slots,
            busy_slots,
            now,
            self.draining,
            small_batches=self._runner.small_batches,
            quiet_turns=self._quiet_turns,
        )
        if decision.expired:
            expired = set(decision.expired)
            kept: deque[_Request] = deque()
            for index, request in enumerate(queue):
                if index in expired:
                    request.future.set_exception(
                        request.admission.expired(now, request.view.arrived_at)
                    )
                else:
                    kept.append(request)
            self._queue = queue = kept
        action = decision.action
        if isinstance(action, Flush):
            if action.members is None:
                batch = [queue.popleft() for _ in range(action.count)]
            else:  # requests of another shape keep their places (policy rule 1)
                chosen = set(action.members)
                batch = [r for i, r in enumerate(queue) if i in chosen]
                self._queue = queue = deque(r for i, r in enumerate(queue) if i not in chosen)
            self._observer.queue_depth(len(queue))
            self._start(batch, action, now)
        else:
            self._observer.queue_depth(len(queue))
        return action

    def _adapt(self, now: float) -> None:
        """Asks the adaptive policy for the setting to run with, from what was measured."""
        assert self._slo_p99_latency_milliseconds is not None
        configured = self._configured
        target = LatencyTarget.of_slo(
            self._slo_p99_latency_milliseconds,
            configured.slo_margin_percent,
            configured.max_batch_size,
            self._runner.free_slots + self._runner.busy_slots,
        )
        setting = next_setting(
            target,
            self._load.engine,
            self._load.arrivals.rows_per_second(now),
            sum(r.view.rows for r in self._queue),
            BatchSetting.of_policy(configured),
            previous=self.setting,
        )
        self._decide_at = now + DECISION_INTERVAL_SECONDS
        if setting != self.setting:
            changed = (
                setting.queue_delay_microseconds != self.setting.queue_delay_microseconds
                or setting.preferred_batch_size != self.setting.preferred_batch_size
                or setting.concurrent_batches != self.setting.concurrent_batches
            )
            self.setting = setting
            self._policy = setting.applied_to(configured)
            if changed:
                self._report(setting)

    def _report(self, setting: BatchSetting) -> None:
        self._observer.batching_setting(
            setting.queue_delay_microseconds / 1e6,
            setting.preferred_batch_size,
            setting.concurrent_batches or self._runner.free_slots + self._runner.busy_slots,
        )

    def status(self) -> dict[str, Any]:
        """The batching policy and the setting in force, for the status endpoint."""
        load = self._load if self._adaptive else None
        return status_of(
            self._configured, self._slo_p99_latency_milliseconds, self.setting, load, self._clock()
        )

    def _start(self, batch: list[_Request], flush: Flush, now: float) -> None:
        lease = self._runner.take(len(batch))
        for request in batch:
            request.admission.stage = "running"
        self._observer.batch_started(flush.rows, [now - r.view.arrived_at for r in batch])
        inputs = [r.inputs for r in batch]
        if flush.inline:  # alone (policy rule 5), and nothing starts before it ends
            outcome = self._runner.run_inline(lease, inputs, flush.rows, _shapes(batch))
            self._finished.append(_Finished(batch, outcome, flush.rows, _Overlap(False)))
            return
        overlap = _Overlap(beside=bool(self._running))
        for running in self._running:
            running.beside = True
        self._running.append(overlap)
        task = asyncio.create_task(self._run_in_thread(lease, batch, flush.rows, overlap))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _run_in_thread(
        self, lease: SlotLease, batch: list[_Request], rows: int, overlap: _Overlap
    ) -> None:
        task = asyncio.current_task()
        assert task is not None

        def answer_stuck(error: EngineTimeout) -> None:
            self._stuck_batches.add(task)
            _answer(batch, BatchFailed(error))

        outcome = await self._runner.run_in_thread(
            lease,
            [r.inputs for r in batch],
            rows,
            bound=batch_bound(r.view.deadline for r in batch),
            oldest_arrival=min(r.admission.arrived_at for r in batch),
            on_stuck=answer_stuck,
            shapes=_shapes(batch),
        )
        self._stuck_batches.discard(task)
        self._running.remove(overlap)
        if self._stopped:  # no scheduler to start the next batch first: answer now
            _answer(batch, outcome)
            return
        self._finished.append(_Finished(batch, outcome, rows, overlap))
        assert self._wakeup is not None
        self._wakeup.set()

    def _answer_finished(self) -> None:
        while self._finished:
            finished = self._finished.popleft()
            if self._adaptive and isinstance(finished.outcome, BatchRan):
                seconds = finished.outcome.compute_seconds
                beside = finished.overlap.beside
                self._load = self._load.batch_ran(finished.rows, seconds, beside=beside)
            _answer(finished.batch, finished.outcome)

    def _fail_queued(self, error: InferenceServerError) -> None:
        while self._queue:
            request = self._queue.popleft()
            if not request.future.done():
                request.future.set_exception(error)


def _shapes(batch: list[_Request]) -> list[RequestShape] | None:
    """The requests' shapes, for a model with variable axes (all of them have one)."""
    if batch[0].shape is None:
        return None
    return [r.shape for r in batch if r.shape is not None]


def _answer(batch: list[_Request], outcome: BatchOutcome) -> None:
    """Every request of a batch gets its outputs, or the batch's one error; a request
    answered already (its caller gone, or the watchdog's timeout) is skipped."""
    if isinstance(outcome, BatchFailed):
        for request in batch:
            if not request.future.done():
                request.future.set_exception(outcome.error)
        return
    for request, outputs in zip(batch, outcome.outputs, strict=True):
        if not request.future.done():
            request.future.set_result(outputs)
