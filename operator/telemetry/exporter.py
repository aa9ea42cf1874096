"""The operator's own /metrics: each InferenceDeployment's conditions and replicas as the
last pass wrote them, and whether that pass could read the serving pods' metrics.

The runtime pods export what they do; what only the operator knows (a build failed, a
shadow failed, the quality watch found drift, the autoscaler is held at maxReplicas, the
metrics it decides from cannot be read, a pod was taken out for answering wrong) is in
the status. kube-state-metrics exports a
Deployment's status the same way, and Flux its objects' (`gotk_reconcile_condition`), so
an alert needs no reader of the API. The series are named in `kubeinfer.contract.metric_series`.

`StatusBoard` is what the reconciler records after each pass (and forgets when the object
is gone); `BoardCollector` turns the board into metric families at scrape time, so a
scrape sees exactly the objects the operator holds now. `serve_metrics` serves the
registry over aiohttp for the operator's whole life, standby included: a standby's board
is empty (only the leader reconciles), so the series come from one replica at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass

from kubeinfer.contract import metric_series as series
from kubeinfer.operator.api.v1alpha1.status import InferenceDeploymentStatus
from kubeinfer.operator.state.observed import ObservedState
from kubeinfer.operator.telemetry.activity import Activity
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

Key = tuple[str, str]


@dataclass(frozen=True)
class Report:
    """One object's last pass: the status written, and per metrics reader the pass used,
    whether its read failed."""

    status: InferenceDeploymentStatus
    unavailable: tuple[tuple[str, bool], ...] = ()
    pod_prices: tuple[tuple[str, float], ...] = ()
    """(pod, price per hour) of each serving pod running on a priced node (the cost)."""


def metrics_readers(observed: ObservedState) -> tuple[tuple[str, bool], ...]:
    """(reader, failed) for each read of the serving pods' metrics the gather step made:
    the shadow's aggregates, the quality watch's window, the autoscaler's signals, the
    inferences the cost divides."""
    readings = (
        ("shadow", observed.shadow),
        ("quality", observed.quality),
        ("scaling", observed.scaling_signals),
        ("cost", observed.cost),
    )
    return tuple((reader, bool(reading.error)) for reader, reading in readings if reading)


def pod_prices(observed: ObservedState) -> tuple[tuple[str, float], ...]:
    """(pod, price per hour) of each serving pod the pass found running on a priced node:
    what the dashboard's cost panel sums over time."""
    return tuple(
        (run.pod, run.price_per_hour)
        for run in observed.cost_history.runs
        if run.running and run.price_per_hour is not None
    )


class StatusBoard:
    """The last report per InferenceDeployment (namespace, name), and the operator's own
    `activity` (kept across kopf runs: a standby's counters stay where the leader left
    them)."""

    def __init__(self) -> None:
        self._reports: dict[Key, Report] = {}
        self.activity = Activity()
        self.wake: Callable[[str, str], bool] | None = None
        """The reconciler's wake, while this replica reconciles (an activator holding a
        request for an object at zero posts it: `serve_metrics`)."""

    def record(self, key: Key, report: Report) -> None:
        self._reports[key] = report

    def forget(self, key: Key) -> None:
        self._reports.pop(key, None)

    def clear(self) -> None:
        """Forgets every object: this replica no longer reconciles (its kopf run ended)."""
        self._reports.clear()

    def items(self) -> list[tuple[Key, Report]]:
        return sorted(self._reports.items())


class BoardCollector(Collector):
    """The board as metric families, read at each scrape."""

    def __init__(self, board: StatusBoard) -> None:
        self.board = board

    def collect(self) -> Iterator[Metric]:
        yield from families(self.board.items())
        yield from activity_families(self.board.activity)


def families(reports: Iterable[tuple[Key, Report]]) -> list[Metric]:
    """The operator's series for these reports."""
    condition = _gauge(series.INFERENCE_DEPLOYMENT_CONDITION)
    replicas = _gauge(series.INFERENCE_DEPLOYMENT_REPLICAS)
    ready = _gauge(series.INFERENCE_DEPLOYMENT_READY_REPLICAS)
    unavailable = _gauge(series.INFERENCE_DEPLOYMENT_METRICS_UNAVAILABLE)
    wrong = _gauge(series.INFERENCE_DEPLOYMENT_WRONG_ANSWERS)
    suspect = _gauge(series.INFERENCE_DEPLOYMENT_SUSPECT_NODE)
    price = _gauge(series.INFERENCE_DEPLOYMENT_POD_PRICE_PER_HOUR)
    for (namespace, name), report in reports:
        status = report.status
        for c in status.conditions:
            condition.add_metric([namespace, name, c.type.value, c.status.value, c.reason], 1)
        replicas.add_metric([namespace, name], status.replicas)
        ready.add_metric([namespace, name], status.ready_replicas)
        for reader, failed in report.unavailable:
            unavailable.add_metric([namespace, name, reader], 1 if failed else 0)
        for record in status.wrong_answers:
            wrong.add_metric([namespace, name, record.pod, record.node, record.reason], 1)
        for node in status.suspect_nodes:
            suspect.add_metric([namespace, name, node], 1)
        for pod, per_hour in report.pod_prices:
            price.add_metric([namespace, name, pod], per_hour)
    return [condition, replicas, ready, unavailable, wrong, suspect, price]


def activity_families(activity: Activity) -> list[Metric]:
    """The operator's own counters and its passes' durations."""
    duration = series.OPERATOR_RECONCILE_DURATION
    histogram = HistogramMetricFamily(duration.name, duration.help)
    buckets = [(_bound(b), n) for b, n in activity.pass_seconds.cumulative()]
    histogram.add_metric([], buckets, activity.pass_seconds.total)
    counted = (
        (series.OPERATOR_RECONCILES, activity.passes),
        (series.OPERATOR_API_REQUESTS, activity.api_requests),
        (series.OPERATOR_WATCH_EVENTS, activity.watch_events),
        (series.OPERATOR_OWNER_READS, activity.owner_reads),
        (series.OPERATOR_METRICS_QUERIES, activity.metrics_queries),
    )
    result: list[Metric] = [histogram]
    for family, counts in counted:
        counter = CounterMetricFamily(family.name, family.help, labels=family.labels)
        for label, count in sorted(counts.items()):
            counter.add_metric([label], count)
        result.append(counter)
    return result


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _gauge(family: series.Series) -> GaugeMetricFamily:
    assert family.kind == "gauge", family.name
    return GaugeMetricFamily(family.name, family.help, labels=family.labels)


def board_registry(board: StatusBoard) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BoardCollector(board))
    return registry


WAKE_PATH = "/v1/activator/wake"
"""Where an activator posts `{"namespace": ..., "service": ...}` when it holds a request
for an object at zero pods (its `--wake-url`)."""


@contextlib.asynccontextmanager
async def serve_metrics(
    registry: CollectorRegistry, port: int, host: str = "0.0.0.0", board: StatusBoard | None = None
) -> AsyncIterator[int]:
    """Serves `registry` at http://host:port/metrics for the block, and with `board` the
    activator's wakes at WAKE_PATH (202, or 503 on a replica that does not reconcile);
    yields the port bound (`port` 0 picks a free one)."""
    from aiohttp import web
    from kubeinfer.operator.state.activator_view import parse_wake

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def wake(request: web.Request) -> web.Response:
        try:
            asked = parse_wake(await request.json())
        except ValueError:
            asked = None
        if asked is None:
            return web.json_response(
                {"error": 'expected {"namespace": "...", "service": "..."}'}, status=400
            )
        handler = board.wake if board is not None else None
        if handler is None or not handler(*asked):
            return web.json_response({"error": "this replica does not reconcile"}, status=503)
        return web.json_response({"woken": f"{asked[0]}/{asked[1]}"}, status=202)

    app = web.Application(client_max_size=4096)
    app.router.add_get("/metrics", metrics)
    if board is not None:
        app.router.add_post(WAKE_PATH, wake)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        yield int(sockets[0].getsockname()[1]) if sockets else port
    finally:
        await runner.cleanup()
