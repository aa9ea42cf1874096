"""`status.cost` written by a pass from what the gather step read (the table harness,
`decide_scenarios.Cluster`): the pods of the window with their shares and prices and the
inferences they answered give the figure a hand computation gives; it stands between
refreshes and when the inferences could not be read; a direct read's younger past covers
fewer seconds, the pods' included; nothing answered is no figure but the pods' hours; no
priced pod, or no price set, is no `status.cost` at all."""

from __future__ import annotations

from datetime import timedelta

import pytest
from decide_scenarios import T0, Cluster, make_spec
from kubeinfer.operator.settings import Cost
from kubeinfer.operator.state.cost_readings import CostHistory, CostReading, PodRun

NOW = T0 + timedelta(hours=2)
PRICES = Cost(price_per_node_hour={"NVIDIA-A100-SXM4-80GB": 32.0, "cpu": 0.8})


def priced_cluster() -> Cluster:
    cluster = Cluster(make_spec())
    cluster.cost_settings = PRICES
    cluster.build_to_ready()
    # Over the last hour: a, 1 of 8 GPUs of an A100 node (32 an hour), the whole hour;
    # b, half a CPU node (0.8 an hour), idle, gone after 30 minutes; c on a node
    # without a price (not counted, nor are its inferences).
    cluster.cost_history = CostHistory(
        runs=(
            PodRun("a", "gpu-1", NOW - timedelta(hours=3), NOW, 1 / 8, 32.0),
            PodRun("b", "cpu-1", NOW - timedelta(hours=1), NOW - timedelta(minutes=30),
                   0.5, 0.8, running=False),
            PodRun("c", "t4-1", NOW - timedelta(hours=1), NOW, 1.0, None),
        )
    )  # fmt: skip
    cluster.cost = CostReading({"a": 9000.0, "b": 0.0, "c": 500.0}, covered_seconds=3600)
    return cluster


def test_the_figure_is_the_hand_computation_of_what_was_read() -> None:
    """a: 1/8 x 32 x 1 h = 4; b: 0.5 x 0.8 x 0.5 h = 0.2; 4.2 over 9,000 inferences:
    0.466667 per 1,000; 1.5 pod-hours."""
    cluster = priced_cluster()
    cluster.reconcile(NOW)
    cost = cluster.status.cost
    assert cost is not None
    assert cost.per_thousand_inferences == pytest.approx(0.466667)
    assert (cost.inferences, cost.pod_hours, cost.window_seconds) == (9000, 1.5, 3600)
    assert cost.last_evaluated == NOW


def test_the_figure_stands_until_it_is_due_again() -> None:
    cluster = priced_cluster()
    cluster.reconcile(NOW)
    first, writes = cluster.status.cost, cluster.writes
    cluster.cost = CostReading({"a": 1.0}, covered_seconds=3600)
    cluster.reconcile(NOW + timedelta(seconds=PRICES.refresh_seconds - 1))
    assert cluster.status.cost == first and cluster.writes == writes, "nothing written"
    later = NOW + timedelta(seconds=PRICES.refresh_seconds)
    cluster.reconcile(later)
    assert cluster.status.cost is not None and cluster.status.cost.inferences == 1
    assert cluster.status.cost.last_evaluated == later


def test_inferences_that_could_not_be_read_leave_the_figure_as_it_was() -> None:
    cluster = priced_cluster()
    cluster.reconcile(NOW)
    first = cluster.status.cost
    cluster.cost = CostReading(error="Prometheus at http://p:9090: no answer within 5 s")
    cluster.reconcile(NOW + timedelta(hours=1))
    assert cluster.status.cost == first


def test_a_direct_reads_younger_past_covers_fewer_seconds_for_the_pods_too() -> None:
    """The counts cover the last 10 minutes only: a 10 minutes, b none (gone 30 minutes
    ago): 1/8 x 32 x 1/6 h = 0.666667 over 1,500 inferences."""
    cluster = priced_cluster()
    cluster.cost = CostReading({"a": 1500.0}, covered_seconds=600)
    cluster.reconcile(NOW)
    cost = cluster.status.cost
    assert cost is not None and cost.window_seconds == 600
    assert cost.pod_hours == pytest.approx(600 / 3600, abs=1e-4)
    assert cost.per_thousand_inferences == pytest.approx(4 / 6 / 1.5, rel=1e-5)


def test_a_direct_reads_first_read_has_no_past_yet() -> None:
    cluster = priced_cluster()
    cluster.cost = CostReading({"a": 0.0}, covered_seconds=0)
    cluster.reconcile(NOW)
    assert cluster.status.cost is None


def test_nothing_answered_is_no_figure_but_the_pods_hours() -> None:
    cluster = priced_cluster()
    cluster.cost = CostReading({}, covered_seconds=3600)
    cluster.reconcile(NOW)
    cost = cluster.status.cost
    assert cost is not None and cost.per_thousand_inferences is None
    assert (cost.inferences, cost.pod_hours) == (0, 1.5)


def test_no_priced_pod_in_the_window_says_nothing() -> None:
    cluster = priced_cluster()
    cluster.cost_history = CostHistory(runs=cluster.cost_history.runs[2:])  # c only
    cluster.reconcile(NOW)
    assert cluster.status.cost is None


def test_prices_removed_take_the_figure_away() -> None:
    cluster = priced_cluster()
    cluster.reconcile(NOW)
    assert cluster.status.cost is not None
    cluster.cost_settings = None
    cluster.reconcile(NOW + timedelta(minutes=1))
    assert cluster.status.cost is None
