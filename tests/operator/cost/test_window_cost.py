"""The cost of 1,000 inferences (`kubeinfer.contract.cost`), against the same figures
worked out by hand: several pods on GPU and CPU nodes, one of them idle, time with no pod
at all, a window that answered nothing; each pod's share of its node; refused inputs; and
the PromQL form's shape (its run on a real Prometheus is tests/monitoring/
test_cost_panel_real.py)."""

from __future__ import annotations

import math

import pytest
from kubeinfer.contract import cost
from kubeinfer.contract.cost import PodUsage, node_share, window_cost
from kubeinfer.operator.metrics_sources import queries

A100_HOUR, CPU_HOUR = 3.6, 0.4


def test_several_pods_an_idle_one_and_time_at_zero_against_a_hand_computation() -> None:
    """Over one hour: pod a holds 1 of its node's 8 GPUs for the whole hour, pod b 2 of 8
    for 30 minutes, pod c (idle: it answered nothing) half of a CPU node's 8 cores for 15
    minutes; the last 15 minutes no pod ran (the object at zero), which costs nothing, and
    the 7,200 inferences of the hour still divide.

    a: 1/8 x 3.6 x 1 h = 0.45; b: 2/8 x 3.6 x 0.5 h = 0.45; c: 4/8 x 0.4 x 0.25 h = 0.05;
    cost 0.95, per 1,000 of 7,200: 0.95 / 7.2 = 0.131944...; pod-hours 1 + 0.5 + 0.25."""
    pods = [
        PodUsage(1 / 8, A100_HOUR, 3600),
        PodUsage(2 / 8, A100_HOUR, 1800),
        PodUsage(4 / 8, CPU_HOUR, 900),
    ]
    figure = window_cost(pods, 7200)
    assert figure.cost == pytest.approx(0.95)
    assert figure.pod_hours == pytest.approx(1.75)
    assert figure.inferences == 7200
    assert figure.per_thousand_inferences == pytest.approx(0.95 / 7.2)


def test_an_idle_pod_costs_what_it_ran() -> None:
    """The idle pod c alone: it answered nothing, but the window's inferences (answered by
    the others) divide its cost as much as theirs; without it the figure is lower."""
    busy = [PodUsage(1 / 8, A100_HOUR, 3600)]
    idle = PodUsage(4 / 8, CPU_HOUR, 900)
    with_idle = window_cost([*busy, idle], 1000).per_thousand_inferences
    without = window_cost(busy, 1000).per_thousand_inferences
    assert with_idle is not None and without is not None
    assert with_idle - without == pytest.approx(4 / 8 * CPU_HOUR * 0.25)


def test_no_inference_in_the_window_is_no_figure_not_a_division_by_zero() -> None:
    figure = window_cost([PodUsage(1.0, A100_HOUR, 3600)], 0)
    assert figure.per_thousand_inferences is None
    assert figure.cost == pytest.approx(A100_HOUR) and figure.pod_hours == pytest.approx(1)
    nobody = window_cost([], 0)
    assert (nobody.cost, nobody.pod_hours, nobody.per_thousand_inferences) == (0, 0, None)


def test_a_window_at_zero_throughout_with_inferences_held_costs_nothing() -> None:
    """No pod ran, yet inferences are counted (a pod answered them and left at the window's
    very start): the pods that ran cost nothing in it, so 1,000 of them cost 0."""
    assert window_cost([], 50).per_thousand_inferences == 0


@pytest.mark.parametrize(
    ("gpus", "node_gpus", "cpu", "node_cpu", "share"),
    [
        (1, 8, 4, 96, 1 / 8),  # a GPU pod: its GPUs, whatever CPU it asks
        (2, 4, 0, 0, 1 / 2),
        (0, 8, 4, 96, 4 / 96),  # a CPU pod on a GPU node: its CPU share
        (0, 0, 0.5, 8, 0.5 / 8),
        (0, 0, 16, 8, 1.0),  # more than the node: the whole node
        (1, 0, 1, 8, None),  # GPUs asked where the node has none allocatable
        (0, 0, 0, 8, None),  # no CPU asked: no share known
        (0, 0, 1, 0, None),
    ],
)
def test_a_pods_share_of_its_node(gpus, node_gpus, cpu, node_cpu, share) -> None:
    assert node_share(gpus, node_gpus, cpu, node_cpu) == share


@pytest.mark.parametrize(
    "pod",
    [
        lambda: PodUsage(-0.1, 1, 1),
        lambda: PodUsage(1.5, 1, 1),
        lambda: PodUsage(0.5, math.nan, 1),
        lambda: PodUsage(0.5, 1, -1),
        lambda: PodUsage(0.5, math.inf, 1),
    ],
)
def test_figures_that_cannot_be_a_pod_are_refused(pod) -> None:
    with pytest.raises(ValueError, match=r"must be|at most"):
        pod()


def test_inferences_that_cannot_be_counts_are_refused() -> None:
    for inferences in (-1, math.nan, math.inf):
        with pytest.raises(ValueError, match="inferences"):
            window_cost([], inferences)


def test_the_promql_divides_the_pods_cost_by_their_inferences_over_the_same_window() -> None:
    text = cost.per_thousand_inferences_promql(3600, 60, 'namespace=~"$namespace"')
    price = 'kubeinfer_inferencedeployment_pod_price_per_hour{namespace=~"$namespace"}'
    assert text.startswith("1000 * sum_over_time(sum by (namespace, name) (max by ")
    assert f"({price}))[3600s:60s]) * 60 / 3600\n/\n" in text
    assert 'kubeinfer_requests_total{code="200", namespace=~"$namespace"}[3600s]' in text
    assert f"group by (namespace, name, pod) (max_over_time({price}[3600s]))" in text
    assert text.endswith(") > 0)")
    with pytest.raises(ValueError, match="resolution"):
        cost.per_thousand_inferences_promql(60, 120)


def test_the_inferences_grow_in_the_window_as_the_operators_other_windows_do() -> None:
    """One definition of a counter's growth in a window: the contract's copy is the text
    the quality watch's queries use, with the same margin."""
    assert cost.GROWTH_IN_WINDOW_BY == queries.GROWTH_IN_WINDOW_BY
    assert cost.WINDOW_BASE_MARGIN_SECONDS == queries.WINDOW_BASE_MARGIN_SECONDS
