"""The recorded burst (idle, 8x the load for 5 minutes, idle) replayed through
`recommend` against simulated pods that take 30, 60 or 120 s to become ready
(tests/support/scaling_simulation.py; the figures: tests/benchmarks/autoscaling_trace_replay.py).

What it shows, and checks: the plain HPA reads the backlog that builds while its pods
start as new demand and adds pods it does not need (here 20 where 8 serve the burst at
target); with startup awareness the count stops at what the first reading called for (10),
reaches capacity as early, changes direction no more often, is back at the minimum no
later, refuses no more requests and costs fewer pod-minutes, wherever in the 15 s between
two passes the burst begins. Where awareness cannot know better (pods with the runtime's
default 1024-deep queues, whose first reading already calls for maxReplicas) or falls
short (a 16x burst, larger than a reading of saturated pods can tell), it costs at most
one pass."""

from __future__ import annotations

import pytest
from scaling_simulation import STARTUPS, burst_setup, replay

PASS_SECONDS = 15.0


@pytest.mark.parametrize("startup", STARTUPS)
@pytest.mark.parametrize("offset", [1.0, 7.0, 14.0], ids=lambda s: f"pass-{s:.0f}s-in")
def test_awareness_cuts_the_overshoot_without_delaying_capacity(startup, offset):
    plain = replay(burst_setup(startup, aware=False, pass_offset_seconds=offset))
    aware = replay(burst_setup(startup, aware=True, pass_offset_seconds=offset))
    assert plain.overshoot >= 2, "the scenario no longer shows the HPA's cascade"
    assert aware.peak_replicas < plain.peak_replicas
    assert aware.overshoot <= 1.25
    assert plain.time_to_capacity_seconds is not None
    assert aware.time_to_capacity_seconds is not None
    assert aware.time_to_capacity_seconds <= plain.time_to_capacity_seconds + PASS_SECONDS
    assert aware.direction_changes <= plain.direction_changes
    assert aware.back_to_min_seconds is not None and plain.back_to_min_seconds is not None
    assert aware.back_to_min_seconds <= plain.back_to_min_seconds
    # The pods the plain HPA added refused no fewer requests: they cost, and bought nothing.
    assert aware.refused_share <= plain.refused_share + 1e-9
    assert aware.pod_minutes < plain.pod_minutes


@pytest.mark.parametrize("startup", STARTUPS)
@pytest.mark.parametrize(
    "variant",
    [{"max_queue_per_pod": 1024}, {"burst_factor": 16.0}],
    ids=["deep-queues", "burst-beyond-a-saturated-reading"],
)
def test_where_awareness_cannot_help_it_costs_at_most_one_pass(startup, variant):
    plain = replay(burst_setup(startup, aware=False, **variant))
    aware = replay(burst_setup(startup, aware=True, **variant))
    assert aware.time_to_capacity_seconds is not None
    assert plain.time_to_capacity_seconds is not None
    assert aware.time_to_capacity_seconds <= plain.time_to_capacity_seconds + PASS_SECONDS
    assert aware.peak_replicas <= plain.peak_replicas


def test_the_replay_is_deterministic():
    setup = burst_setup(60.0, aware=True)
    assert replay(setup) == replay(setup)
