"""The batching policy's decisions, as a table driven by a hand-set clock.

Covers: a lone request on an idle server runs at once (with or without preferred sizes);
nothing runs without a free slot; a free slot takes the queue at once up to
maxBatchSize; requests carrying their own batch dimension count by rows and are never
split; waiting (up to maxQueueDelayMicroseconds after the oldest arrival, and never past
a request's deadline) happens only while another batch runs and a better size is ahead;
expired requests are reported and left out of the batch; draining never waits. Then a
property test of the invariants over random queues. Then rule 5, as tables: a flush runs
inline only when small, alone and known fast, from the moving average of small batches'
compute time (which only small batches with a measured time move).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.policy import (
    SMALL_BATCH_ROWS,
    Flush,
    FlushDecision,
    Pending,
    SmallBatchSpeed,
    WaitUntil,
    next_decision,
    runs_inline,
)

FAR = 1e9  # a deadline that never matters


def p(rows: int = 1, arrived: float = 0.0, deadline: float = FAR) -> Pending:
    return Pending(rows=rows, arrived_at=arrived, deadline=deadline)


def policy(preferred: tuple[int, ...] = (), delay_us: int = 1000, max_batch: int = 8):
    return BatchingPolicy(
        max_batch_size=max_batch,
        max_queue_delay_microseconds=delay_us,
        preferred_batch_sizes=list(preferred),
    )


@dataclass(frozen=True)
class Case:
    name: str
    policy: BatchingPolicy
    pending: list[Pending]
    free: int
    busy: int
    now: float
    expected: FlushDecision
    draining: bool = False


CASES = [
    Case("an empty queue waits for the next event",
         policy(), [], free=2, busy=0, now=0.0,
         expected=FlushDecision((), WaitUntil(None))),
    Case("a lone request on an idle server runs at once",
         policy(), [p()], free=2, busy=0, now=0.0,
         expected=FlushDecision((), Flush(1, 1))),
    Case("a lone request on an idle server runs at once even below a preferred size",
         policy(preferred=(4, 8)), [p()], free=2, busy=0, now=0.0,
         expected=FlushDecision((), Flush(1, 1))),
    Case("without a free slot requests keep queueing until the earliest deadline",
         policy(), [p(deadline=5.0), p(deadline=3.0)], free=0, busy=2, now=1.0,
         expected=FlushDecision((), WaitUntil(3.0))),
    Case("with one slot, the free slot takes everything queued at once",
         policy(), [p(), p(), p()], free=1, busy=0, now=0.0,
         expected=FlushDecision((), Flush(3, 3))),
    Case("a queue longer than maxBatchSize sends maxBatchSize at once, even while busy",
         policy(), [p() for _ in range(10)], free=1, busy=1, now=0.0,
         expected=FlushDecision((), Flush(8, 8))),
    Case("a request with its own batch dimension counts by rows and is never split",
         policy(), [p(rows=5), p(rows=4)], free=1, busy=1, now=0.0,
         expected=FlushDecision((), Flush(1, 5))),
    Case("a request larger than maxBatchSize (admission refuses those) still runs alone",
         policy(), [p(rows=9), p()], free=1, busy=0, now=0.0,
         expected=FlushDecision((), Flush(1, 9))),
    Case("requests whose rows add up to maxBatchSize go at once",
         policy(), [p(rows=3), p(rows=5)], free=1, busy=1, now=0.0,
         expected=FlushDecision((), Flush(2, 8))),
    Case("while another batch runs, a small batch waits for more until the delay",
         policy(), [p(arrived=0.0), p(arrived=0.0002)], free=1, busy=1, now=0.0005,
         expected=FlushDecision((), WaitUntil(0.001))),
    Case("once the oldest request has waited the delay, the batch goes",
         policy(), [p(arrived=0.0), p(arrived=0.0002)], free=1, busy=1, now=0.001,
         expected=FlushDecision((), Flush(2, 2))),
    Case("reaching a preferred size flushes at once while another batch runs",
         policy(preferred=(4,)), [p() for _ in range(4)], free=1, busy=1, now=0.0,
         expected=FlushDecision((), Flush(4, 4))),
    Case("between preferred sizes the batcher waits for the next one",
         policy(preferred=(2, 4)), [p(), p(), p()], free=1, busy=1, now=0.0,
         expected=FlushDecision((), WaitUntil(0.001))),
    Case("past the largest preferred size waiting cannot help: flush",
         policy(preferred=(2, 4)), [p() for _ in range(5)], free=1, busy=1, now=0.0,
         expected=FlushDecision((), Flush(5, 5))),
    Case("a wait never runs past a queued request's deadline",
         policy(preferred=(4,)), [p(deadline=0.0006)], free=1, busy=1, now=0.0,
         expected=FlushDecision((), WaitUntil(0.0006))),
    Case("a request past its deadline is expired and left out of the batch",
         policy(), [p(deadline=0.5), p(deadline=10.0)], free=1, busy=0, now=1.0,
         expected=FlushDecision((0,), Flush(1, 1))),
    Case("a deadline equal to now has passed",
         policy(), [p(deadline=1.0)], free=1, busy=0, now=1.0,
         expected=FlushDecision((0,), WaitUntil(None))),
    Case("expired requests are reported even when no slot is free",
         policy(), [p(deadline=0.5), p(deadline=4.0)], free=0, busy=2, now=1.0,
         expected=FlushDecision((0,), WaitUntil(4.0))),
    Case("while draining nothing waits",
         policy(preferred=(4,)), [p()], free=1, busy=1, now=0.0, draining=True,
         expected=FlushDecision((), Flush(1, 1))),
    Case("a zero queue delay never waits",
         policy(delay_us=0), [p()], free=1, busy=1, now=0.0,
         expected=FlushDecision((), Flush(1, 1))),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_next_decision(case: Case) -> None:
    decision = next_decision(
        case.policy, case.pending, case.free, case.busy, case.now, case.draining
    )
    assert decision == case.expected


def test_the_batcher_is_not_draining_unless_it_says_so() -> None:
    # The documented five-argument call: a small batch while another runs still waits.
    decision = next_decision(policy(preferred=(4,)), [p()], 1, 1, 0.0)
    assert decision == FlushDecision((), WaitUntil(0.001))


queues = st.lists(
    st.builds(
        Pending,
        rows=st.integers(1, 8),
        arrived_at=st.floats(0, 1),
        deadline=st.floats(0, 2),
    ),
    max_size=40,
)


@given(
    pending=queues,
    free=st.integers(0, 3),
    busy=st.integers(0, 3),
    now=st.floats(0, 2),
    preferred=st.lists(st.integers(1, 8), max_size=3),
    draining=st.booleans(),
)
def test_invariants(pending, free, busy, now, preferred, draining) -> None:
    """Whatever the queue: expired positions are exactly those at or past their deadline,
    a flush needs a free slot, never exceeds maxBatchSize (unless one request alone is
    that big), takes a prefix of the live requests whose rows it reports, and a wait never
    ends past the earliest live deadline."""
    rules = policy(tuple(preferred))
    decision = next_decision(rules, pending, free, busy, now, draining)
    assert decision.expired == tuple(i for i, q in enumerate(pending) if q.deadline <= now)
    live = [q for q in pending if q.deadline > now]
    action = decision.action
    if isinstance(action, Flush):
        assert free > 0 and 1 <= action.count <= len(live)
        assert action.rows == sum(q.rows for q in live[: action.count])
        assert action.rows <= rules.max_batch_size
    else:
        assert not live or free == 0 or busy > 0
        if live:
            assert action.at is not None
            assert action.at <= min(q.deadline for q in live)


def test_preferred_sizes_are_kept_sorted_and_unique_so_decisions_need_no_sort() -> None:
    assert BatchingPolicy(preferred_batch_sizes=[16, 4, 8, 4]).preferred_batch_sizes == [4, 8, 16]


# Rule 5: inline or in a worker thread. The slot runner measures small batches; the policy
# decides from that measurement, the rows and the slots busy.
FAST = SmallBatchSpeed(inline_below_seconds=0.0025, average_seconds=0.001)


@dataclass(frozen=True)
class InlineCase:
    name: str
    rows: int
    busy: int
    speed: SmallBatchSpeed
    inline: bool


INLINE_CASES = [
    InlineCase("a small batch, alone, of a model known fast runs inline",
               rows=1, busy=0, speed=FAST, inline=True),
    InlineCase("four rows are still small",
               rows=4, busy=0, speed=FAST, inline=True),
    InlineCase("five rows go to a worker thread",
               rows=5, busy=0, speed=FAST, inline=False),
    InlineCase("while another batch runs, a worker thread: the loop must not stall",
               rows=1, busy=1, speed=FAST, inline=False),
    InlineCase("before any small batch is measured, a worker thread",
               rows=1, busy=0, speed=SmallBatchSpeed(0.0025), inline=False),
    InlineCase("small batches measured slower than the bound go to a worker thread",
               rows=1, busy=0, speed=SmallBatchSpeed(0.0025, 0.003), inline=False),
    InlineCase("measured exactly at the bound is not below it",
               rows=1, busy=0, speed=SmallBatchSpeed(0.0025, 0.0025), inline=False),
    InlineCase("a zero bound never runs inline",
               rows=1, busy=0, speed=SmallBatchSpeed(0.0, 0.000001), inline=False),
]  # fmt: skip


@pytest.mark.parametrize("case", INLINE_CASES, ids=[c.name for c in INLINE_CASES])
def test_runs_inline(case: InlineCase) -> None:
    assert runs_inline(case.rows, case.busy, case.speed) is case.inline


@pytest.mark.parametrize("case", INLINE_CASES, ids=[c.name for c in INLINE_CASES])
def test_the_flush_decision_says_inline_or_thread(case: InlineCase) -> None:
    # A queue that fills maxBatchSize flushes whether or not a batch is in flight.
    rules = policy(max_batch=case.rows)
    decision = next_decision(
        rules, [p(rows=case.rows)], 1, case.busy, 0.0, small_batches=case.speed
    )
    assert decision == FlushDecision((), Flush(1, case.rows, inline=case.inline))


def test_without_a_measurement_every_flush_goes_to_a_worker_thread() -> None:
    decision = next_decision(policy(), [p()], 1, 0, 0.0)
    assert decision.action == Flush(1, 1, inline=False)


@dataclass(frozen=True)
class SpeedCase:
    name: str
    before: float | None
    rows: int
    seconds: float
    after: float | None


SPEED_CASES = [
    SpeedCase("the first small batch sets the average",
              before=None, rows=1, seconds=0.002, after=0.002),
    SpeedCase("a later one weighs a fifth",
              before=0.5, rows=2, seconds=2.0, after=0.8),
    SpeedCase("four rows count as small",
              before=0.5, rows=4, seconds=2.0, after=0.8),
    SpeedCase("five rows do not count",
              before=1.0, rows=5, seconds=2.0, after=1.0),
    SpeedCase("a batch that failed (no compute time) does not count",
              before=1.0, rows=1, seconds=0.0, after=1.0),
    SpeedCase("nor does it start the average",
              before=None, rows=1, seconds=0.0, after=None),
]  # fmt: skip


@pytest.mark.parametrize("case", SPEED_CASES, ids=[c.name for c in SPEED_CASES])
def test_small_batch_speed_is_a_moving_average(case: SpeedCase) -> None:
    speed = SmallBatchSpeed(inline_below_seconds=0.0025, average_seconds=case.before)
    measured = speed.measured(case.rows, case.seconds)
    assert measured.average_seconds == pytest.approx(case.after)
    assert measured.inline_below_seconds == 0.0025


@given(
    pending=queues,
    free=st.integers(0, 3),
    busy=st.integers(0, 3),
    now=st.floats(0, 2),
    average=st.none() | st.floats(0, 0.01),
    draining=st.booleans(),
)
def test_inline_only_alone_small_and_known_fast(pending, free, busy, now, average, draining):
    speed = SmallBatchSpeed(inline_below_seconds=0.0025, average_seconds=average)
    action = next_decision(policy(), pending, free, busy, now, draining, small_batches=speed).action
    if isinstance(action, Flush) and action.inline:
        assert busy == 0 and action.rows <= SMALL_BATCH_ROWS
        assert average is not None and average < 0.0025
