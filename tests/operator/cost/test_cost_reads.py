"""The cost's reads (`metrics_sources.cost`, `kube.cost_reads`): the inferences of the
priced pods by name, in the growth-in-window form, from a source that keeps the past;
from one that does not (the direct read), the window from earlier reads, with the
quality watch's rules (a new pod counts all, a restarted one from zero, a gone one its
last read, and the seconds covered); a source that cannot answer, or answers what is no
count, says why; and one pass' reads: the serving pods on the shared node list, the window
remembered, the inferences only when due and only of the priced pods. The same query on
a real Prometheus: tests/monitoring/test_cost_panel_real.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubeinfer.operator.kube.cost_reads import CostInputs, PricedNodes, read_cost
from kubeinfer.operator.metrics_sources.cost import inferences_query, read_inferences
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.metrics_sources.source import MetricsUnavailable
from kubeinfer.operator.reconcile.reads import CostRead
from kubeinfer.operator.settings import Cost
from kubeinfer.operator.state import names
from kubeinfer.operator.state.cost_readings import CostHistory, priced_node
from kubeinfer.operator.state.observed import ObservedState, OwnerRef
from test_cost_ledger import node, pod

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SCOPE = Scope("ml", "clf")
A, B, C = (f"clf-runtime-6b7c8d9f5-{s}" for s in ("b4b2c", "d7f4f", "x9z2q"))


class Source:
    """A metrics source answering the grouped query with the counts set, by pod."""

    description = "a test source"

    def __init__(self, windows: bool, counts: dict[str, float] | None = None) -> None:
        self.answers_windows = windows
        self.counts = counts or {}
        self.asked: list[Any] = []
        self.fail = False

    async def evaluate_grouped(self, queries, now):
        self.asked.append(queries)
        if self.fail:
            raise MetricsUnavailable("no answer within 5 s")
        return ({(pod,): value for pod, value in self.counts.items()},)


def read(source: Source, pods, at: datetime, snapshots=(), window: int = 3600):
    return asyncio.run(read_inferences(source, SCOPE, pods, window, at, snapshots))


def test_the_query_names_the_priced_pods_and_counts_answered_requests_grown_in_the_window():
    query = inferences_query(SCOPE, [B, "clf.x"], 3600)
    selector = 'kubeinfer_requests_total{namespace="ml",pod=~"' + B + '|clf\\\\.x",code="200"}'
    assert query.by == ("pod",)
    assert query.promql.startswith("sum by (pod) ((last_over_time(" + selector + "[3600s]) - ")
    assert f"last_over_time({selector}[60s] offset 3600s)" in query.promql
    assert f"resets({selector}[3660s]) > 0" in query.promql


def test_a_source_that_keeps_the_past_gives_the_windows_counts_of_the_pods_asked():
    source = Source(windows=True, counts={A: 120.0, B: 0.0, C: 7.0})
    reading, snapshots = read(source, [A, B], NOW)
    assert reading.inferences == {A: 120.0, B: 0.0} and reading.covered_seconds == 3600
    assert snapshots == () and not reading.error


def test_no_priced_pod_asks_nothing():
    source = Source(windows=True)
    reading, _ = read(source, [], NOW)
    assert reading.inferences == {} and source.asked == []


def test_a_source_that_cannot_answer_or_answers_no_count_says_why():
    source = Source(windows=True)
    source.fail = True
    reading, _ = read(source, [A], NOW)
    assert reading.inferences is None
    assert reading.error == "a test source: no answer within 5 s"
    reading, _ = read(Source(windows=True, counts={A: float("nan")}), [A], NOW)
    assert reading.inferences is None and "gave answered requests" in reading.error


def test_the_direct_reads_window_comes_from_its_earlier_reads():
    source = Source(windows=False, counts={A: 100.0, B: 50.0})
    first, snapshots = read(source, [A, B, C], NOW - timedelta(minutes=40))
    assert first.inferences == {A: 0.0, B: 0.0} and first.covered_seconds == 0
    # 20 minutes on: A answered 30 more, B restarted (its count went down: all of it is
    # new), C is new (all its counts).
    source.counts = {A: 130.0, B: 5.0, C: 12.0}
    middle, snapshots = read(source, [A, B, C], NOW - timedelta(minutes=20), snapshots)
    assert middle.inferences == {A: 30.0, B: 5.0, C: 12.0}
    assert middle.covered_seconds == 20 * 60
    # Now: A is gone (its last read stands), B answered 10 more since its restart.
    source.counts = {B: 15.0, C: 12.0}
    now, snapshots = read(source, [A, B, C], NOW, snapshots)
    assert now.inferences == {A: 30.0, B: 15.0, C: 12.0}
    assert now.covered_seconds == 40 * 60
    # Past the window, the base moves to the latest read at or before its start.
    later = NOW + timedelta(minutes=45)
    source.counts = {B: 25.0, C: 20.0}
    moved, _ = read(source, [A, B, C], later, snapshots)
    assert moved.inferences == {A: 0.0, B: 20.0, C: 8.0} and moved.covered_seconds == 3600


def test_a_direct_read_that_fails_keeps_its_past():
    source = Source(windows=False, counts={A: 1.0})
    _, snapshots = read(source, [A], NOW - timedelta(minutes=5))
    source.fail = True
    reading, kept = read(source, [A], NOW, snapshots)
    assert reading.error and kept == snapshots


class Lister:
    def __init__(self, pods: list[dict]) -> None:
        self.pods = pods
        self.lists: list[tuple[str, str, str]] = []

    async def list(self, resource, namespace, label_selector):
        self.lists.append((resource.kind, namespace, label_selector))
        return self.pods


def observed() -> ObservedState:
    from decide_scenarios import make_spec
    from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus

    return ObservedState(OwnerRef("clf", "ml", "uid", 1), make_spec(), InferenceDeploymentStatus())


def test_one_pass_remembers_the_serving_pods_and_asks_the_inferences_of_the_priced_ones():
    nodes = {n.name: n for n in map(priced_node, [node("gpu-1", 8, "96", "NVIDIA-A100-SXM4-80GB"),
                                                  node("cpu-1")])}  # fmt: skip

    async def node_list():
        return nodes

    settings = Cost(price_per_node_hour={"cpu": 0.8})  # the A100 has no price
    lister = Lister([pod(A, on="cpu-1", gpus=None), pod(B)])
    source = Source(windows=True, counts={A: 10.0, B: 99.0})
    inputs = CostInputs(settings, node_list, CostHistory())
    due = asyncio.run(read_cost(lister, source, observed(), CostRead(3600, True), inputs, NOW))
    serving = names.selector_string(names.serving_selector("clf"))
    assert lister.lists == [("Pod", "ml", serving)]
    history = due["cost_history"]
    assert [(r.pod, r.priced) for r in history.runs] == [(A, True), (B, False)]
    (query,) = source.asked[0]
    assert A in query.promql and B not in query.promql, "the unpriced pod is not asked"
    assert due["cost"].inferences == {A: 10.0}
    # Not due: the pods are remembered, nothing is asked of the metrics source.
    inputs = CostInputs(settings, node_list, history)
    later = NOW + timedelta(minutes=1)
    lister.pods = [pod(B)]
    quiet = asyncio.run(read_cost(lister, source, observed(), CostRead(3600, False), inputs, later))
    assert "cost" not in quiet and len(source.asked) == 1
    (gone, still) = quiet["cost_history"].runs
    assert (gone.pod, gone.running, gone.last_seen) == (A, False, NOW)
    assert (still.pod, still.running, still.last_seen) == (B, True, later)


def test_the_nodes_are_listed_once_per_interval_for_every_pass():
    class Client:
        lists = 0

        async def list(self, resource, namespace, label_selector):
            Client.lists += 1
            return [node("cpu-1")]

    clock = [0.0]
    nodes = PricedNodes(Client(), 60, clock=lambda: clock[0])  # type: ignore[arg-type]

    async def passes():
        for at in (0.0, 30.0, 59.0, 60.0):
            clock[0] = at
            assert set(await nodes.read()) == {"cpu-1"}

    asyncio.run(passes())
    assert Client.lists == 2


@pytest.mark.parametrize("window", [60, 3600])
def test_the_window_is_the_queries(window):
    assert f"[{window}s])" in inferences_query(SCOPE, [A], window).promql
