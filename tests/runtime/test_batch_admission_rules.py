"""The batcher's admission rules (`batching.admission`), pure: no engine, no event loop,
time passed in by hand.

Covers: nothing is admitted before the batcher opens, nor once it stops (draining says
so); a stuck engine refuses with how long it has been stuck; maxQueueSize counts the
queued requests and the admitted ones not yet queued, refusing at the bound and not
below it; a place is given back once however often it is released; the deadline is the
default timeout from arrival, or the request's own timeout from arrival; an expired
request's answer says how long since arrival and how long in the queue.
"""

from __future__ import annotations

import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.admission import Admissions
from kubeinfer.runtime.batching.watchdog import EngineWatchdog
from kubeinfer.runtime.protocol.errors import DeadlineExceeded, NotReady, Overloaded

RUNNING = EngineWatchdog(liveness_seconds=60)


def admissions(max_queue_size: int = 3, default_timeout_ms: int = 2000) -> Admissions:
    gate = Admissions(
        BatchingPolicy(
            max_queue_size=max_queue_size, default_timeout_milliseconds=default_timeout_ms
        )
    )
    gate.open()
    return gate


def test_nothing_is_admitted_before_the_batcher_opens() -> None:
    gate = Admissions(BatchingPolicy())
    assert gate.accepting is False and gate.draining is False
    with pytest.raises(NotReady, match=r"^not started$"):
        gate.admit(0.0, 0, RUNNING)
    assert gate.unqueued == 0


def test_draining_refuses_and_says_it_is_shutting_down() -> None:
    gate = admissions()
    gate.stop(draining=True)
    assert gate.accepting is False and gate.draining is True
    with pytest.raises(NotReady, match=r"^the server is shutting down$"):
        gate.admit(0.0, 0, RUNNING)
    gate.stop(draining=False)  # closing after a drain: still a shutdown
    assert gate.draining


def test_a_stop_without_a_drain_is_not_a_drain() -> None:
    gate = admissions()
    gate.stop(draining=False)
    assert gate.accepting is False and gate.draining is False
    with pytest.raises(NotReady, match=r"^not started$"):
        gate.admit(0.0, 0, RUNNING)


def test_a_stuck_engine_refuses_saying_for_how_long() -> None:
    stuck = EngineWatchdog(liveness_seconds=60)
    stuck.batch_stuck(10.0)
    with pytest.raises(NotReady, match=r"has not returned a batch for 2\.5 s"):
        admissions().admit(12.5, 0, stuck)


@pytest.mark.parametrize(
    ("queued", "unqueued", "admitted"),
    [(0, 0, True), (2, 0, True), (0, 2, True), (1, 1, True), (3, 0, False), (1, 2, False)],
)
def test_the_queue_bound_counts_queued_and_unqueued_requests(queued, unqueued, admitted) -> None:
    gate = admissions(max_queue_size=3)
    for _ in range(unqueued):
        gate.admit(0.0, 0, RUNNING)
    if admitted:
        gate.admit(0.0, queued, RUNNING)
        assert gate.unqueued == unqueued + 1
    else:
        with pytest.raises(Overloaded, match=r"full \(3 requests\)"):
            gate.admit(0.0, queued, RUNNING)
        assert gate.unqueued == unqueued


def test_a_place_is_given_back_once() -> None:
    gate = admissions()
    first, second = gate.admit(0.0, 0, RUNNING), gate.admit(0.0, 0, RUNNING)
    gate.release(first)
    gate.release(first)
    assert gate.unqueued == 1 and first.holds_place is False and second.holds_place
    gate.release(second)
    assert gate.unqueued == 0


def test_the_deadline_counts_from_arrival() -> None:
    admission = admissions(default_timeout_ms=2000).admit(100.0, 0, RUNNING)
    assert (admission.arrived_at, admission.deadline, admission.stage) == (
        100.0,
        102.0,
        "reading",
    )
    admission.set_timeout(0.5)  # the request's own timeout, decoded later
    assert admission.deadline == 100.5


def test_an_expired_request_is_told_where_its_time_went() -> None:
    admission = admissions().admit(100.0, 0, RUNNING)
    answer = admission.expired(now=101.5, queued_at=101.0)
    assert isinstance(answer, DeadlineExceeded) and answer.status == 504
    assert str(answer) == (
        "the request's deadline passed 1500.0 ms after it arrived, 500.0 ms of them in "
        "the queue; it was not executed"
    )
