"""The dashboard's cost of 1,000 inferences (`contract.cost.per_thousand_inferences_promql`)
on a real Prometheus, against `contract.cost.window_cost` on the same samples, and the
operator's own read of the inferences (`metrics_sources.cost`) on the same Prometheus.

Hand-made series, scraped as in a cluster: the operator's real exporter (a board the test
writes: each priced pod's price per hour, as a pass records it), scraped with honor_labels
as the chart's PodMonitor does, and one small exporter per serving pod of
`kubeinfer_requests_total`, whose counts the test sets. Over a window of `WINDOW` seconds:

- pod a answered 50 before the window and 30 inside it, then left before its end;
- pod b came inside the window, answered 40 and left (its target gone, its series stale);
- pod c ran through the window, priced, and answered nothing (idle: paid for);
- the window's last seconds had no pod at all (time at zero: no cost, the inferences
  still divide);
- pod d is another InferenceDeployment's: its own figure.

Prometheus measures each pod's seconds as the subquery does (a step of `RESOLUTION`
seconds where its price is present); the function, given those seconds, the prices and the
counts the test made, gives the panel's figure; and the operator's query gives the counts
the test made, pod by pod.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from kubeinfer.contract import cost
from kubeinfer.contract import metric_series as series
from kubeinfer.contract.cost import PodUsage, window_cost
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus
from kubeinfer.operator.metrics_sources.cost import read_inferences
from kubeinfer.operator.metrics_sources.prometheus import PrometheusSource
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.telemetry.exporter import Report, StatusBoard, board_registry
from ports import free_port
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_harness import PrometheusServer, _launch, require_prometheus
from waiting import wait_for

pytestmark = pytest.mark.slow

NAMESPACE = "ml"
WINDOW, RESOLUTION = 20, 2
SCRAPE = "500ms"
A, B, C = (f"clf-runtime-6b7c8d9f5-{s}" for s in ("b4b2c", "d7f4f", "x9z2q"))
D = "other-runtime-7c8d9f5b6-k8m2n"
PRICES = {A: 3600.0, B: 7200.0, C: 1800.0, D: 900.0}
"""Price per hour of each pod (its share times its node's price), as the operator exports."""


@dataclass(eq=False)  # a collector is registered by identity
class RuntimePod:
    """A serving pod's /metrics: its answered requests (and a refused one, not counted)."""

    name: str
    answered: float = 0
    port: int = 0
    _server: object = None

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(series.REQUESTS.name, "", labels=series.REQUESTS.labels)
        family.add_metric(["clf", "1", "200"], self.answered)
        family.add_metric(["clf", "1", "503"], 7)
        return [family]

    def start(self) -> RuntimePod:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self.port = free_port()
        self._server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()  # type: ignore[attr-defined]


@dataclass
class World:
    prometheus: PrometheusServer
    board: StatusBoard
    pods: dict[str, RuntimePod]
    operator_port: int
    priced: set[str] = field(default_factory=set)

    def config(self, scraped: Iterable[str]) -> str:
        runtime = [
            {"targets": [f"127.0.0.1:{self.pods[pod].port}"],
             "labels": {"namespace": NAMESPACE, "pod": pod}}
            for pod in sorted(scraped)
        ]  # fmt: skip
        return yaml.safe_dump(
            {
                "global": {"scrape_interval": SCRAPE, "scrape_timeout": SCRAPE},
                "scrape_configs": [
                    {"job_name": "runtime", "static_configs": runtime},
                    {"job_name": "operator", "honor_labels": True,
                     "static_configs": [{"targets": [f"127.0.0.1:{self.operator_port}"],
                                         "labels": {"namespace": "kubeinfer-system",
                                                    "pod": "kubeinfer-operator-0"}}]},
                ],
            }
        )  # fmt: skip

    def running(self, *pods: str) -> None:
        """The pods that run now: their prices on the board, their targets scraped (a gone
        pod's counts stay in Prometheus, as a replaced pod's do)."""
        for owner in ("clf", "other"):
            prices = tuple((p, PRICES[p]) for p in pods if p.startswith(f"{owner}-"))
            self.board.record((NAMESPACE, owner), Report(InferenceDeploymentStatus(), (), prices))
        self.prometheus.config.write_text(self.config(pods))
        self.prometheus.process.send_signal(signal.SIGHUP)  # reload the targets

    def wait_for_scrapes(self) -> None:
        """Until every target has been scraped after now."""
        after = time.time()

        def scraped() -> bool:
            oldest = self.prometheus.query("min(timestamp(up))")
            return bool(oldest) and float(oldest[0]["value"][1]) > after + 0.05

        wait_for(scraped, 20, "a scrape of every target", every=0.1)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    require_prometheus()
    directory: Path = tmp_path_factory.mktemp("cost")
    pods = {name: RuntimePod(name).start() for name in PRICES}
    board = StatusBoard()
    operator_port = free_port()
    server, _ = start_http_server(operator_port, addr="127.0.0.1", registry=board_registry(board))
    config = directory / "prometheus.yml"
    port = free_port()
    built = World(None, board, pods, operator_port)  # type: ignore[arg-type]
    config.write_text(built.config(pods))
    built.prometheus = PrometheusServer(_launch(config, port), port, (), config, SCRAPE)
    try:
        yield built
    finally:
        built.prometheus.stop()
        server.shutdown()
        for pod in pods.values():
            pod.stop()


def seconds_of(world: World, pod: str, at: float) -> float:
    """The seconds Prometheus counts pod's price present in the window (the subquery's)."""
    price = series.INFERENCE_DEPLOYMENT_POD_PRICE_PER_HOUR.name
    answer = world.prometheus.query(
        f'count_over_time(max by (pod) ({price}{{pod="{pod}"}})[{WINDOW}s:{RESOLUTION}s])', at
    )
    return float(answer[0]["value"][1]) * RESOLUTION if answer else 0.0


def test_the_panel_and_the_function_agree_on_the_same_samples(world: World) -> None:
    pods = world.pods
    pods[A].answered, pods[D].answered = 50, 5
    world.running(A, C, D)
    world.wait_for_scrapes()
    time.sleep(3)  # not a wait: a's 50 and d's 5 lie well before the window
    change = time.time()
    at = change + WINDOW - 2  # the window starts 2 s before the change
    pods[A].answered, pods[B].answered, pods[D].answered = 80, 10, 15
    world.running(A, B, C, D)
    started = {B: time.time()}
    world.wait_for_scrapes()
    pods[B].answered = 40
    world.wait_for_scrapes()
    time.sleep(max(0.0, change + 6 - time.time()))  # not a wait: b runs 6 s of the window
    world.running(A, C, D)  # b leaves
    ends = {B: time.time()}
    time.sleep(max(0.0, change + 14 - time.time()))  # not a wait: a and c run on, c idle
    world.running(D)  # a and c leave; clf has no pod from here on
    ends[A] = ends[C] = time.time()
    time.sleep(max(0.0, at + 1 - time.time()))  # not a wait: the window's last 4 s at zero
    world.wait_for_scrapes()

    expr = cost.per_thousand_inferences_promql(WINDOW, RESOLUTION, f'namespace="{NAMESPACE}"')
    panel = {s["metric"]["name"]: float(s["value"][1]) for s in world.prometheus.query(expr, at)}
    seconds = {pod: seconds_of(world, pod, at) for pod in PRICES}
    counted = {A: 30, B: 40, C: 0, D: 10}
    for owner, members in (("clf", (A, B, C)), ("other", (D,))):
        usage = [PodUsage(1.0, PRICES[pod], seconds[pod]) for pod in members]
        figure = window_cost(usage, sum(counted[pod] for pod in members))
        assert figure.per_thousand_inferences is not None
        assert panel[owner] == pytest.approx(figure.per_thousand_inferences, rel=1e-9), owner

    # The seconds measured are the pods' runs in the window, to a step and a scrape or two.
    window_start = at - WINDOW
    spans = {
        A: ends[A] - window_start, B: ends[B] - started[B], C: ends[C] - window_start,
        D: WINDOW,
    }  # fmt: skip
    for pod, span in spans.items():
        assert seconds[pod] == pytest.approx(span, abs=RESOLUTION + 1.5), pod
    # The idle pod is paid for: without it the figure would be lower.
    busy = [PodUsage(1.0, PRICES[p], seconds[p]) for p in (A, B)]
    assert panel["clf"] > (window_cost(busy, 70).per_thousand_inferences or 0)

    # The operator reads the same counts, pod by pod, from the same Prometheus.
    source = PrometheusSource(world.prometheus.url, timeout_seconds=5)
    when = datetime.fromtimestamp(at, UTC)
    reading, _ = asyncio.run(
        read_inferences(source, Scope(NAMESPACE, "clf"), [A, B, C], WINDOW, when, ())
    )
    assert reading.inferences == {A: 30, B: 40, C: 0} and not reading.error


def test_a_window_without_an_inference_has_no_figure(world: World) -> None:
    """Nothing answered in the window (the pods idle, then gone): the division is by a count
    above zero only, so the panel has no point, as the function has no figure."""
    world.running(C)
    world.wait_for_scrapes()
    at = time.time()
    expr = cost.per_thousand_inferences_promql(2, 1, f'namespace="{NAMESPACE}"')
    assert [s for s in world.prometheus.query(expr, at) if s["metric"]["name"] == "clf"] == []
    assert window_cost([PodUsage(1.0, PRICES[C], 2)], 0).per_thousand_inferences is None
