"""When to run a batch: every scheduling decision of the dynamic batcher, as a pure function.

`next_decision(policy, pending, free_slots, busy_slots, now)` looks at the queue (rows,
arrival time and deadline of each waiting request, oldest first), the execution slots
and a monotonic `now`, and returns a `FlushDecision`: which requests have expired (answered
with a timeout, never executed) and then either `Flush(count)` (run the first `count`
requests as one batch now, on the event loop or in a worker thread) or `WaitUntil(t)`
(nothing to do before monotonic time `t`, or before the next event when `t` is None).
No asyncio, no clock: the scheduler supplies `now`, and the slot runner what it has
measured of small batches (`SmallBatchSpeed`), so table tests drive both by hand.

The rules, in order:

1. A batch never exceeds `maxBatchSize` rows; a request carrying its own batch dimension
   counts by its rows and is never split. A batch holds requests of one batch shape
   (`Pending.shape`, for models with variable axes besides the batch: `shapes`): the
   oldest request's, with the requests of that shape queued after it, in order, while
   they fit; the others keep their places for the next batch.
2. With no free slot nothing runs: requests keep queueing, which is how batches form
   while execution is busy.
3. When a slot is free the queued requests go at once, up to `maxBatchSize` (or as many
   of the oldest one's shape as are queued, when others of another shape wait too), unless
   waiting (up to `maxQueueDelayMicroseconds` after the oldest request arrived) can help:
   another batch is in flight (so requests are arriving, and a small batch started now
   would compete with it for the same cores or GPU) and a better size is still ahead, the
   next of `preferredBatchSizes` or, when none is configured, `maxBatchSize`. Reaching a
   preferred size, or passing the largest one, flushes at once. With no batch in flight
   nothing waits, so a lone request on an idle server pays no delay, and with one
   execution slot batches form purely while that slot is busy. The one exception is
   the company a request's transport says may be a few event-loop turns behind it
   (`Pending.company_turns`; gRPC's requests reach the batcher one at a time, a few
   turns apart, where REST's reach it together): with nothing in flight and a better
   size ahead, the queue waits until that many turns of the event loop in a row have
   seen no new arrival (`quiet_turns`, counted by the scheduler), never past
   `maxQueueDelayMicroseconds` after the oldest arrival.
4. While draining (after SIGTERM) nothing waits: everything queued goes as fast as slots
   free up.
5. A flushed batch runs inline, on the event loop, only when it is small (at most
   `SMALL_BATCH_ROWS` rows), no other batch is running, and the model's small batches
   are known (measured) to take less than `inline_below_seconds`: handing a batch that
   short to a worker thread and back costs more than the batch itself (two thread
   wake-ups). Never while another batch runs: the loop would stall every other
   request's reading and answering behind it. Everything else runs in a worker thread,
   since the engine blocks and the event loop must not.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.engines.base import BatchShape


@dataclass(frozen=True, slots=True)
class Pending:
    """What the policy needs to know about one queued request."""

    rows: int
    arrived_at: float
    deadline: float
    company_turns: int = 0
    """How many quiet turns of the event loop in a row this request may wait, with nothing
    in flight, for others its transport may still be handing over (rule 3); 0 waits for
    none."""
    shape: BatchShape | None = None
    """The batch shape it joins (rule 1); None for a model without variable axes."""


SMALL_BATCH_ROWS = 4
"""A batch of at most this many rows is small: it may run inline (rule 5), and its compute
time is what `SmallBatchSpeed` averages."""


@dataclass(frozen=True, slots=True)
class SmallBatchSpeed:
    """What is known of the model's small batches: the moving average of their compute
    seconds (None until one has run), and the bound under which one may run inline."""

    inline_below_seconds: float = 0.0
    average_seconds: float | None = None

    def measured(self, rows: int, compute_seconds: float) -> SmallBatchSpeed:
        """With one more finished batch counted: only small batches that took measurable
        time (a failed batch reports none), weighting the latest by a fifth, so a model
        that slows down (a busier GPU) leaves the inline path within a few batches."""
        if rows > SMALL_BATCH_ROWS or compute_seconds <= 0:
            return self
        average = self.average_seconds
        if average is not None:
            compute_seconds = 0.8 * average + 0.2 * compute_seconds
        return replace(self, average_seconds=compute_seconds)

    def fast(self) -> bool:
        return self.average_seconds is not None and self.average_seconds < self.inline_below_seconds


NEVER_MEASURED = SmallBatchSpeed()
"""Nothing measured and no bound: every batch runs in a worker thread."""


@dataclass(frozen=True, slots=True)
class Flush:
    """Run the first `count` (non-expired) queued requests as one batch now: on the event
    loop when `inline`, else in a worker thread."""

    count: int
    rows: int
    inline: bool = False
    members: tuple[int, ...] | None = None
    """Positions (among the non-expired queued requests) of the `count` requests to run,
    when they are not simply the first `count` (requests of another shape wait between
    them, rule 1)."""


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Nothing to run before monotonic time `at`; None means until the next event
    (a request arrives or a slot frees)."""

    at: float | None


@dataclass(frozen=True, slots=True)
class WaitTurns:
    """Nothing to run yet: decide again once `turns` more turns of the event loop have
    passed with no new arrival, or at the next arrival (requests that may still join are
    being handed over; rule 3's company)."""

    turns: int


@dataclass(frozen=True, slots=True)
class FlushDecision:
    expired: tuple[int, ...]
    """Positions (in `pending`) of requests past their deadline: answer them with a
    timeout and remove them before applying `action`, whose counts exclude them."""
    action: Flush | WaitUntil | WaitTurns


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _batch_of_oldest(
    live: Sequence[Pending], max_batch_rows: int
) -> tuple[int, int, tuple[int, ...] | None]:
    """Rule 1: the requests, rows and (when not a prefix) positions of the batch the
    oldest request starts. At least one request: admission refuses requests with more
    rows than maxBatchSize."""
    shape = live[0].shape
    count, rows, skipped = 0, 0, False
    members: list[int] = []
    for position, p in enumerate(live):
        if p.shape != shape:
            skipped = True
            continue
        if rows + p.rows > max_batch_rows and count > 0:
            break
        count, rows = count + 1, rows + p.rows
        members.append(position)
    return count, rows, tuple(members) if skipped else None


def runs_inline(rows: int, busy_slots: int, small_batches: SmallBatchSpeed) -> bool:
    """Rule 5: a small batch, alone, of a model whose small batches are known fast."""
    return busy_slots == 0 and rows <= SMALL_BATCH_ROWS and small_batches.fast()


def next_decision(
    policy: BatchingPolicy,
    pending: Sequence[Pending],
    free_slots: int,
    busy_slots: int,
    now: float,
    draining: bool = False,
    *,
    small_batches: SmallBatchSpeed = NEVER_MEASURED,
    quiet_turns: int = 0,
) -> FlushDecision:
    """The batcher's next step; see the module docstring for the rules. `quiet_turns`:
    the turns of the event loop in a row, waited for company, that saw no new arrival."""
    expired = tuple(i for i, p in enumerate(pending) if p.deadline <= now)
    live = [p for p in pending if p.deadline > now] if expired else pending
    earliest_deadline = min((p.deadline for p in live), default=None)
    if not live or free_slots <= 0:
        return FlushDecision(expired, WaitUntil(earliest_deadline))

    count, rows, members = _batch_of_oldest(live, policy.max_batch_size)
    flush = Flush(count, rows, runs_inline(rows, busy_slots, small_batches), members)
    if count < len(live) or rows >= policy.max_batch_size or draining:
        return FlushDecision(expired, flush)

    # Waiting can help only while a better size is ahead (the next preferred size, or
    # maxBatchSize when none is configured), and either another batch is in flight
    # (requests are arriving and would otherwise go in a small batch competing with it)
    # or the transport has said company may be a few loop turns behind.
    preferred = policy.preferred_batch_sizes  # sorted and unique (BatchingPolicy)
    company_turns = max(p.company_turns for p in live) if busy_slots == 0 else 0
    if (busy_slots == 0 and quiet_turns >= company_turns) or rows in preferred:
        return FlushDecision(expired, flush)
    if preferred and bisect.bisect_right(preferred, rows) == len(preferred):
        return FlushDecision(expired, flush)  # past the largest preferred size
    flush_at = live[0].arrived_at + policy.max_queue_delay_microseconds / 1e6
    if now >= flush_at:
        return FlushDecision(expired, flush)
    if busy_slots == 0:
        return FlushDecision(expired, WaitTurns(company_turns - quiet_turns))
    return FlushDecision(expired, WaitUntil(_min(flush_at, earliest_deadline)))
