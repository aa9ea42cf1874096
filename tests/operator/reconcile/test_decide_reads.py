"""What a pass reads beyond the objects is declared once (`reconcile.reads`): the gather
step reads exactly that, and `decide` reads nothing else.

- The declaration, as a table over the life of objects: a settled object of one engine
  with no autoscaling, shadow, watch or PodMonitor reads nothing; each feature reads its
  own signals, and only once there is something to read.
- The gather (`kube.gather`) over an in-memory copy of the children (the same objects the
  table tests' passes wrote) reads exactly what the declaration names: each pod list, each
  metrics read, the GPU nodes and the PodMonitor, no more and no less.
- `decide` never reads a signal the declaration does not name: the table tests' passes
  (`decide_scenarios.Cluster.reconcile`) hand it `Unread` in place of each such signal,
  and `Unread` fails on any use; every `ObservedState` field is a child, the discovery's
  answer or a declared signal, so a new signal cannot go undeclared.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from decide_scenarios import DIGEST_B, T0, Cluster, Unread, as_gathered, make_spec
from kubeinfer.operator.kube import gather as gather_step
from kubeinfer.operator.kube.client import POD, POD_MONITOR
from kubeinfer.operator.kube.cost_reads import CostInputs
from kubeinfer.operator.metrics_sources.source import MetricsUnavailable
from kubeinfer.operator.reconcile.reads import SIGNALS, Reads, signals_to_read
from kubeinfer.operator.settings import Cost
from kubeinfer.operator.state import names
from kubeinfer.operator.state.gpu_nodes import gpu_node
from kubeinfer.operator.state.known_answers import AnswerReadings
from kubeinfer.operator.state.observed import ObservedState
from kubeinfer.operator.state.scaling_inputs import ScalingHistory, ScalingSignals
from kubeinfer.operator.state.shadow_readings import ShadowAggregates, ShadowReading
from test_decide_fleet import served, two_products
from test_decide_scaling import autoscaled
from test_quality_watch_children import watched, watching
from test_shadow_rollout import CANDIDATE, shadowing_cluster

ROOT = Path(__file__).resolve().parents[3]
LATER = T0 + timedelta(minutes=30)


def ready() -> Cluster:
    cluster = Cluster(make_spec())
    cluster.build_to_ready()
    return cluster


def unsettled() -> Cluster:
    cluster = ready()
    cluster.roll_out(ready=0)  # a pod not ready: it may say why
    return cluster


def objective(rolled_out: bool) -> Cluster:
    cluster = Cluster(make_spec(slo={"p99LatencyMilliseconds": 50}))
    if rolled_out:
        cluster.build_to_ready()
    return cluster


def checked(rolled_out: bool = True) -> Cluster:
    cluster = Cluster(make_spec(knownAnswers={}))
    if rolled_out:
        cluster.build_to_ready()
    return cluster


def with_pod_monitors() -> Cluster:
    cluster = ready()
    cluster.pod_monitors = True
    return cluster


def shadow_pending(candidate_settled: bool) -> Cluster:
    cluster = shadowing_cluster()
    if not candidate_settled:
        cluster.roll_out(ready=0, name=CANDIDATE)
    return cluster


def priced(rolled_out: bool = True) -> Cluster:
    cluster = Cluster(make_spec())
    cluster.cost_settings = Cost(price_per_node_hour={"cpu": 0.4})
    if rolled_out:
        cluster.build_to_ready()
    return cluster


def quality_watched() -> Cluster:
    cluster = Cluster(watched(), name="demo")
    watching(cluster)
    return cluster


STATES = {
    "a settled object of one engine reads nothing": (ready, set()),
    "known answers on, a Deployment: its pods' answers": (checked, {"answers"}),
    "known answers on, no Deployment yet: nothing": (lambda: checked(False), set()),
    "a Deployment not settled: its pods": (unsettled, {"runtime_pods"}),
    "an objective before any Deployment: nothing yet": (lambda: objective(False), set()),
    "an objective once the Deployment exists: the load": (
        lambda: objective(True),
        {"scaling_signals"},
    ),
    "autoscaling: the pods, their count and the load": (
        autoscaled,
        {"runtime_pods", "serving_pods", "scaling_signals"},
    ),
    "PodMonitors served: the object's": (with_pod_monitors, {"pod_monitor"}),
    "a Pending candidate: its aggregates": (lambda: shadow_pending(True), {"shadow"}),
    "a Pending candidate not settled: its pods too": (
        lambda: shadow_pending(False),
        {"shadow", "candidate_pods"},
    ),
    "a quality watch begun: its window": (quality_watched, {"quality"}),
    "a mixed fleet: the GPU nodes": (lambda: served(two_products()), {"gpu_nodes"}),
    "prices set, a Deployment: the serving pods and their nodes for the cost": (
        priced,
        {"cost"},
    ),
    "prices set, no Deployment yet: nothing": (lambda: priced(False), set()),
}


def declared(reads: Reads) -> set[str]:
    return {signal for signal in SIGNALS if getattr(reads, signal)}


def children_of(cluster: Cluster) -> ObservedState:
    """What the gather step starts from: the children, the stored status, and the
    discovery's answer, with every signal at its default (nothing read yet)."""
    observed = cluster.observe()
    defaults = {f.name: f.default for f in dataclasses.fields(ObservedState)}
    factories = {
        f.name: f.default_factory()  # type: ignore[misc]
        for f in dataclasses.fields(ObservedState)
        if f.default_factory is not dataclasses.MISSING
    }
    signals = {
        field: factories[field] if field in factories else defaults[field]
        for fields in SIGNALS.values()
        for field in fields
    }
    return dataclasses.replace(observed, **signals)


@pytest.mark.parametrize(("state", "expected"), STATES.values(), ids=STATES.keys())
def test_each_feature_reads_its_own_signals_once_there_is_something_to_read(state, expected):
    assert declared(signals_to_read(children_of(state()), LATER)) == expected


def test_every_observed_field_is_a_child_the_discovery_or_a_declared_signal():
    """The children's fields are those `read_children` fills; the rest must be declared
    signals (or the PodMonitor discovery's answer, or the cost's settings the gather is
    handed), so none can be read unannounced."""
    tree = ast.parse((ROOT / "operator" / "kube" / "children.py").read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ObservedState"
    ]
    (call,) = calls
    children = {keyword.arg for keyword in call.keywords}
    signals = {field for fields in SIGNALS.values() for field in fields}
    everything = {f.name for f in dataclasses.fields(ObservedState)}
    assert children.isdisjoint(signals)
    assert everything == children | signals | {"pod_monitors_available", "cost_settings"}


# -- the gather reads exactly what is declared ---------------------------------------------


def _matches(labels: dict[str, str], selector: str) -> bool:
    wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(key) == value for key, value in wanted.items())


class InMemoryCluster:
    """The `Lister` the gather reads children with, over the objects a table test's
    passes wrote and the pods it made; it records every list."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.lists: list[tuple[str, str]] = []

    async def list(self, resource: Any, namespace: str, label_selector: str) -> list[dict]:
        self.lists.append((resource.kind, label_selector))
        if resource == POD:
            found = [*self.cluster.runtime_pods, *self.cluster.candidate_pods]
        else:
            found = [o for (kind, _), o in self.cluster.objects.items() if kind == resource.kind]
        return [o for o in found if _matches(o["metadata"].get("labels") or {}, label_selector)]


class UnansweringSource:
    """A metrics source that answers nothing (each read then says why)."""

    description = "a source that answers nothing"
    answers_windows = False

    async def evaluate(self, queries: Any, now: Any) -> Any:
        raise MetricsUnavailable("not answered")

    async def evaluate_grouped(self, queries: Any, now: Any) -> Any:
        raise MetricsUnavailable("not answered")


class Sources:
    def for_object(self, prometheus_url: str | None) -> UnansweringSource:
        return UnansweringSource()


def body_of(cluster: Cluster) -> dict[str, Any]:
    return {
        "metadata": {
            "name": cluster.name,
            "namespace": cluster.namespace,
            "uid": cluster.uid,
            "generation": cluster.generation,
            "annotations": dict(cluster.annotations),
        },
        "spec": cluster.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "status": cluster.status.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def what_the_gather_read(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The signals one real gather step read over `cluster`'s objects."""
    metrics: list[str] = []

    def recording(signal: str, real: Any) -> Any:
        def recorded(*args: Any) -> Any:
            metrics.append(signal)
            return real(*args)

        return recorded

    for signal, read in (
        ("shadow", "read_shadow_aggregates"),
        ("scaling_signals", "read_scaling_signals"),
        ("quality", "read_quality_tallies"),
    ):
        monkeypatch.setattr(gather_step, read, recording(signal, getattr(gather_step, read)))
    nodes: list[str] = []

    async def gpu_nodes() -> tuple:
        nodes.append("gpu_nodes")
        return tuple(n for n in map(gpu_node, getattr(cluster, "nodes", [])) if n is not None)

    async def answers() -> AnswerReadings:
        nodes.append("answers")
        return AnswerReadings((), {}, {}, (), None)

    async def no_nodes() -> dict:
        return {}

    prices = cluster.cost_settings
    cost = CostInputs(prices, no_nodes) if prices is not None else None
    lister = InMemoryCluster(cluster)
    observed = asyncio.run(
        gather_step.gather(
            lister, Sources(), body_of(cluster), cluster.spec, ScalingHistory(),  # type: ignore[arg-type]
            cluster.pod_monitors, LATER, gpu_nodes=gpu_nodes, answers=answers, cost=cost,
        )
    )  # fmt: skip
    runtime = names.selector_string(names.runtime_selector(cluster.name))
    candidate = names.selector_string(names.candidate_selector(cluster.name))
    serving = names.selector_string(names.serving_selector(cluster.name))
    listed = {
        "cost": ("Pod", serving) in lister.lists,
        "runtime_pods": ("Pod", runtime) in lister.lists,
        "candidate_pods": ("Pod", candidate) in lister.lists,
        "pod_monitor": any(kind == POD_MONITOR.kind for kind, _ in lister.lists),
        "serving_pods": observed.serving_pods is not None,
    }
    return {*metrics, *nodes, *(signal for signal, read in listed.items() if read)}


@pytest.mark.parametrize(("state", "expected"), STATES.values(), ids=STATES.keys())
def test_the_gather_reads_exactly_what_is_declared(state, expected, monkeypatch):
    cluster = state()
    assert what_the_gather_read(cluster, monkeypatch) == expected
    assert declared(signals_to_read(children_of(cluster), LATER)) == expected


# -- decide reads nothing undeclared -------------------------------------------------------


def test_an_unread_signal_fails_the_test_on_any_use():
    unread = Unread("serving_pods")
    for use in (bool, len, iter, lambda u: u.ready, lambda u: u == 3, lambda u: 1 in u):
        with pytest.raises(AssertionError, match="decide read 'serving_pods'"):
            use(unread)


def test_the_passes_hand_decide_the_signals_the_gather_reads_and_unread_the_others():
    cluster = ready()
    cluster.signals = ScalingSignals(requests_in_progress_per_replica=9.0)
    cluster.reading = ShadowReading(ShadowAggregates(compared=10))
    gathered = as_gathered(cluster.observe(), LATER)
    assert isinstance(gathered.scaling_signals, Unread)  # no autoscaling, no objective
    assert isinstance(gathered.runtime_pods, Unread)  # the Deployment has settled
    assert isinstance(gathered.shadow, Unread) and isinstance(gathered.gpu_nodes, Unread)
    cluster = autoscaled()
    cluster.signals = ScalingSignals(requests_in_progress_per_replica=9.0)
    gathered = as_gathered(cluster.observe(), LATER)
    assert gathered.scaling_signals == cluster.signals


def test_a_whole_life_reads_only_what_the_gather_brings():
    """Build, roll out, a new version under shadow test, promotion, autoscaling and an
    objective: every pass goes through `as_gathered` (an undeclared read would fail)."""
    cluster = Cluster(
        make_spec(
            rollout={"strategy": "Shadow", "shadow": {"minSamples": 10}},
            slo={"p99LatencyMilliseconds": 50},
        )
    )
    cluster.build_to_ready()
    uri = {"uri": "https://models.example.com/mlp-2.onnx"}
    cluster.update_spec(make_spec(model={"version": "2", "source": uri}, **{
        "rollout": {"strategy": "Shadow", "shadow": {"minSamples": 10}},
        "slo": {"p99LatencyMilliseconds": 50},
    }))  # fmt: skip
    cluster.reconcile(T0 + timedelta(minutes=5))
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(job["metadata"]["name"], DIGEST_B, at=T0 + timedelta(minutes=6))
    cluster.reconcile(T0 + timedelta(minutes=7))
    cluster.roll_out(name=CANDIDATE)
    cluster.reading = ShadowReading(ShadowAggregates(compared=20))
    cluster.signals = ScalingSignals(p99_seconds=0.01)
    cluster.reconcile(T0 + timedelta(minutes=8))
    assert cluster.status.candidate is not None
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=9))
    assert cluster.status.slo is not None and cluster.status.slo.met is True
