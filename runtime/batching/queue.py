"""The dynamic batcher: one per model, in front of an engine's execution slots.

`Batcher` composes the three parts and is what the rest of the runtime uses:

- `admission`: which arriving requests are taken (before their body is read,
  `maxQueueSize` bounding those admitted and not yet running) and their deadlines,
  counted from arrival;
- `scheduler`: the queue, one future per request, and the task that asks the pure
  `policy` what to flush and when, and answers expired requests without running them;
- `slot_runner`: the execution slots, their worker threads, the inline shortcut for small
  fast batches, and the watchdog's bound on a running batch.

`assembler` packs and splits batches; `adaptive` chooses the queue delay and preferred
batch size under batching policy Adaptive, against `slo_p99_latency_milliseconds`. Time
comes from one injected monotonic clock, also read in the worker threads to time the
engine's compute.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.adaptive import BatchSetting
from kubeinfer.runtime.batching.admission import Admission, Admissions
from kubeinfer.runtime.batching.observer import BatchObserver, NoObserver
from kubeinfer.runtime.batching.scheduler import Scheduler
from kubeinfer.runtime.batching.shapes import RequestShape, ShapePlan
from kubeinfer.runtime.batching.slot_runner import SlotRunner
from kubeinfer.runtime.batching.watchdog import EngineWatchdog
from kubeinfer.runtime.engines.base import Engine
from kubeinfer.runtime.engines.batching_probe import BatchingProbe
from kubeinfer.runtime.protocol.errors import NotReady

__all__ = ["Admission", "Batcher"]


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
        slo_p99_latency_milliseconds: float | None = None,
        shapes: ShapePlan | None = None,
        model_name: str = "",
        probe: BatchingProbe | None = None,
        configured_max_batch_size: int | None = None,
    ) -> None:
        """`probe`: what the load found of whether the model batches (None: not probed),
        `policy` already the one in effect (`effective_max_batch_size`), and
        `configured_max_batch_size` the one the configuration asked for; both reported in
        `batching_status`. `model_name` goes into the errors that name the model."""
        if policy.max_batch_size > engine.max_batch_size:
            raise ValueError(
                f"maxBatchSize {policy.max_batch_size} exceeds the engine's {engine.max_batch_size}"
            )
        observer = observer or NoObserver()
        self._probe = probe
        self._configured_max_batch_size = configured_max_batch_size or policy.max_batch_size
        self.shapes = shapes or ShapePlan(engine.inputs, engine.outputs, policy)
        """Which shapes requests may take and which batches they join (`shapes`)."""
        self._clock = clock
        self._admissions = Admissions(policy)
        self._runner = SlotRunner(
            engine,
            policy.execution_slots,
            clock=clock,
            observer=observer,
            inline_below_seconds=inline_below_seconds,
            stuck_liveness_seconds=stuck_liveness_seconds,
            pad_values=self.shapes.pad_values,
            model_name=model_name,
        )
        self._scheduler = Scheduler(
            policy,
            self._runner,
            clock=clock,
            observer=observer,
            slo_p99_latency_milliseconds=slo_p99_latency_milliseconds,
        )

    @property
    def batching_setting(self) -> BatchSetting:
        """The queue delay and preferred batch size in force (policy Adaptive: its latest
        choice; Static: the configured ones)."""
        return self._scheduler.setting

    def batching_status(self) -> dict[str, Any]:
        """The policy and the setting in force, as JSON (the runtime's GET /v2/batching):
        `maxBatchSize` is the one in effect; `modelBatches` (null: not found out) and
        `modelBatchesReason` what the load found of whether the model batches, and
        `configuredMaxBatchSize` what the configuration asked for (set aside for a model
        served one request per run); `outputRowMismatches` the batches failed because an
        output did not hold their rows."""
        status = self._scheduler.status()
        if self._probe is not None:
            status["modelBatches"] = self._probe.batches
            status["modelBatchesReason"] = self._probe.reason
        status["configuredMaxBatchSize"] = self._configured_max_batch_size
        status["outputRowMismatches"] = self._runner.output_row_mismatches
        return status

    @property
    def watchdog(self) -> EngineWatchdog:
        return self._runner.watchdog

    @property
    def accepting(self) -> bool:
        return self._admissions.accepting

    @property
    def draining(self) -> bool:
        return self._admissions.draining

    @property
    def queued(self) -> int:
        return self._scheduler.queued

    @property
    def admitted(self) -> int:
        """Requests admitted and not yet running: queued, or still being read or decoded."""
        return self._scheduler.queued + self._admissions.unqueued

    @property
    def idle(self) -> bool:
        """Nothing admitted, queued, running or left to answer (a stuck batch aside: its
        requests are answered)."""
        return (
            self._scheduler.settled
            and not self._admissions.unqueued
            and self._runner.busy_slots <= self.watchdog.stuck_batches
        )

    @property
    def stuck_threads(self) -> bool:
        """A batch's worker thread has not returned (the process cannot join it at exit)."""
        return self._runner.stuck_threads

    async def start(self) -> None:
        """Creates the slots (their buffers are allocated here, once) and the scheduler."""
        self._runner.start()
        self._scheduler.start()
        self._admissions.open()

    def admit(self, now: float | None = None) -> Admission:
        """Admits one request arriving now, before anything of it is read; raises NotReady
        (not started, draining, or the engine stuck) or Overloaded (maxQueueSize requests
        admitted and not yet running). `release` it if it ends before `infer`."""
        return self._admissions.admit(
            self._clock() if now is None else now, self._scheduler.queued, self.watchdog
        )

    def release(self, admission: Admission) -> None:
        """Gives back the place of an admitted request that will not be queued; idempotent."""
        self._admissions.release(admission)

    async def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        rows: int,
        timeout_seconds: float | None = None,
        *,
        admission: Admission | None = None,
        shape: RequestShape | None = None,
    ) -> dict[str, np.ndarray]:
        """Runs one request (already checked by `self.shapes.check`, which gives its rows
        and, for a model with variable axes, its `shape`) in some batch and returns its
        outputs; raises Overloaded, NotReady, DeadlineExceeded, EngineTimeout or
        EngineFailed. An `admission` from `admit` queues it in the place it holds (also
        while draining: it was admitted before); its deadline counts from its arrival."""
        if admission is None:
            admission = self.admit()
        try:
            if not self._scheduler.running:
                raise NotReady("the server stopped")
            if timeout_seconds is not None:
                admission.set_timeout(timeout_seconds)
            answer = self._scheduler.enqueue(inputs, rows, admission, shape)
        finally:
            self.release(admission)  # queued now: the queue counts it
        return await answer

    async def drain(self, timeout_seconds: float) -> bool:
        """Stops admission and waits until every admitted request is answered (those still
        being read or decoded are queued and run too); False if that took longer than
        `timeout_seconds`."""
        self._admissions.stop(draining=True)
        self._scheduler.drain()
        deadline = self._clock() + timeout_seconds
        while not self.idle:
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    async def close(self, timeout_seconds: float = 5.0) -> None:
        """Stops the scheduler, fails whatever is left, and releases the slots. A stuck
        batch is not waited for past `timeout_seconds`, and its slot is left open (its
        thread is still inside it): see `stuck_threads`."""
        self._admissions.stop(draining=False)
        await self._scheduler.stop(timeout_seconds)
        self._runner.close()
