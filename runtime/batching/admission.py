"""The batcher's admission: which arriving requests it takes, counted against
`maxQueueSize`, and when each one's deadline falls.

A request is admitted on its arrival, before its body is read, so a full server refuses
with `Overloaded` (a 503 with Retry-After) without reading or decoding anything. From
then on it holds a place until it is queued (the queue counts it from there) or released
(it ended before it was queued). Its deadline counts from its arrival: the default
timeout, replaced by the request's own `timeout` once it is decoded.

No asyncio and no clock: the caller passes `now` (its monotonic clock's reading) and
what the admission depends on elsewhere (how many are queued, the engine watchdog).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.watchdog import EngineWatchdog
from kubeinfer.runtime.protocol.errors import DeadlineExceeded, NotReady, Overloaded


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
    company_turns: int = 0
    """Set by a transport that hands requests to the batcher a few event-loop turns apart:
    how many quiet turns this one may wait for company (`policy.Pending.company_turns`)."""

    def set_timeout(self, timeout_seconds: float) -> None:
        """The request's own timeout, counted from its arrival like the default."""
        self.deadline = self.arrived_at + timeout_seconds

    def expired(self, now: float, queued_at: float) -> DeadlineExceeded:
        """The answer to a request whose deadline passed in the queue."""
        since_arrival_ms = (now - self.arrived_at) * 1000
        queued_ms = (now - queued_at) * 1000
        return DeadlineExceeded(
            f"the request's deadline passed {since_arrival_ms:.1f} ms after "
            f"it arrived, {queued_ms:.1f} ms of them in the queue; it was "
            "not executed"
        )


class Admissions:
    """Admits requests while open, up to `maxQueueSize` admitted and not yet running."""

    def __init__(self, policy: BatchingPolicy) -> None:
        self._policy = policy
        self.accepting = False
        self.draining = False
        self.unqueued = 0
        """Admitted and not yet queued: their bodies are being read or decoded."""

    def open(self) -> None:
        self.accepting = True

    def stop(self, *, draining: bool) -> None:
        """Refuses every later request; `draining` says why (a shutdown: the requests
        admitted before still run)."""
        self.accepting = False
        self.draining = self.draining or draining

    def admit(self, now: float, queued: int, watchdog: EngineWatchdog) -> Admission:
        """Admits one request arriving at `now`; raises NotReady (not open, draining, or
        the engine stuck) or Overloaded (`queued` plus the unqueued admissions already
        fill maxQueueSize)."""
        if not self.accepting:
            raise NotReady("the server is shutting down" if self.draining else "not started")
        if watchdog.stuck:
            raise NotReady(
                f"the engine has not returned a batch for "
                f"{watchdog.stuck_for(now):.1f} s; retry later"
            )
        if queued + self.unqueued >= self._policy.max_queue_size:
            raise self._full_queue()
        self.unqueued += 1
        return Admission(now, now + self._policy.default_timeout_milliseconds / 1000)

    def _full_queue(self) -> Overloaded:
        return Overloaded(
            f"the queue is full ({self._policy.max_queue_size} requests); retry later"
        )

    def release(self, admission: Admission) -> None:
        """Gives back the place of an admitted request (queued, or ended before);
        idempotent."""
        if admission.holds_place:
            admission.holds_place = False
            self.unqueued -= 1
