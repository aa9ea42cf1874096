"""When a pass asks for the next (`reconcile.requeue`), as a table: a build under way is
polled, a failed build is looked at when its backoff ends (each engine's, on a mixed GPU
fleet), a shadow test, the quality watch and the autoscaler at their poll intervals; the
soonest wins, and nothing asks for nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.reconcile.requeue import build_wait_seconds, requeue_after
from kubeinfer.operator.settings import Requeue
from kubeinfer.operator.state.engine_state import EnginePhase, EngineState

NOW = datetime(2025, 1, 1, tzinfo=UTC)
POLLS = Requeue(build_poll_seconds=10, shadow_poll_seconds=15, autoscale_poll_seconds=20)
BUILT = EngineState(EnginePhase.BUILT, "key", digest="sha256:a")
BUILDING = EngineState(EnginePhase.BUILDING, "key", job_attempt=0)


def failed(retry_in_seconds: float) -> EngineState:
    return EngineState(
        EnginePhase.FAILED, "key", retry_at=NOW + timedelta(seconds=retry_in_seconds)
    )


@pytest.mark.parametrize(
    ("engine", "fallback", "expected"),
    [
        (BUILT, None, None),
        (BUILDING, None, 10),
        (failed(25), None, 25),
        (failed(0.2), None, 1.0),  # at least a second: never a busy loop
        (failed(-5), None, 1.0),
        (EngineState(EnginePhase.FAILED, "key"), None, None),  # no retry planned
        (BUILT, BUILDING, 10),  # the quality watch's fallback builds
        (failed(2), BUILDING, 10),  # a building fallback is polled, not the retry
        (EngineState(EnginePhase.PINNED, "key", digest="sha256:p"), BUILT, None),
    ],
)
def test_the_builds_say(engine, fallback, expected):
    assert build_wait_seconds(POLLS, engine, fallback, NOW) == expected


@pytest.mark.parametrize(
    ("engine", "shadowing", "autoscaling", "watching", "expected"),
    [
        (BUILT, False, False, False, None),
        (BUILT, True, False, False, 15),
        (BUILT, False, True, False, 20),
        (BUILT, False, False, True, 15),
        (BUILT, False, True, True, 15),  # the soonest of those that apply
        (BUILDING, True, True, True, 10),
        (failed(300), False, True, False, 20),
        (failed(3), True, True, False, 3),
    ],
)
def test_the_soonest_wanted_pass_wins(engine, shadowing, autoscaling, watching, expected):
    got = requeue_after(
        POLLS,
        [(engine, None)],
        NOW,
        shadowing=shadowing,
        autoscaling=autoscaling,
        watching=watching,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("engines", "expected"),
    [
        ([], None),  # a mixed fleet with no eligible GPU product
        ([(BUILT, None), (BUILT, None)], None),
        ([(BUILT, None), (BUILDING, None)], 10),  # one product's engine builds
        ([(failed(30), None), (failed(5), None)], 5),  # the sooner retry
    ],
)
def test_each_engine_of_a_fleet_has_its_say(engines, expected):
    got = requeue_after(POLLS, engines, NOW, shadowing=False, autoscaling=False, watching=False)
    assert got == expected
