"""Every PromQL expression of the chart's dashboard and alert rules, as shipped
(`helm/kubeinfer/files/monitoring/`), run by a real Prometheus scraping real `kubeinfer
serve` processes under load and the operator's exporter (`monitoring_world`): one
Prometheus, one load run, every expression in one pass.

- Every dashboard query returns data, finite figures, with the dashboard's variables set
  to all values and Grafana's `$__rate_interval` to a window spanning the load. The GPU panel
  is the exception on a machine without a GPU: the runtime exports GPU memory only where
  NVML sees a device (`kubeinfer.runtime.engines.gpu_memory`), so there the test checks that
  Prometheus accepts the query and that no GPU gauge exists, and on a GPU machine it must
  return data like the others.
- Every alert's expression holds where its situation was made: p99 above the SLO of the
  pod that has one, a shifted slice below 90 % agreement on 200 rows or more, a quality
  reference nobody answers, and the operator's verdicts on the board (pods taken out for
  wrong answers and their suspect node among them).
- The cost panel returns data for the serving pod the board prices (its figure against the
  formula, on hand-made series: test_cost_panel_real.py).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from kubeinfer.cli.monitoring import dashboard
from kubeinfer.cli.monitoring.render import DASHBOARD, RULES
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.api.v1alpha1.conditions import (
    ConditionStatus,
    ConditionType,
    Reason,
    set_condition,
)
from kubeinfer.operator.api.v1alpha1.status import InferenceDeploymentStatus, WrongAnswersStatus
from kubeinfer.operator.telemetry.exporter import Report
from kubeinfer.runtime.engines.gpu_memory import GpuMemoryReader
from monitoring_world import World, running_world
from prometheus_harness import require_prometheus

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
VARIABLES = {"$namespace": ".*", "$model": ".*", "$__rate_interval": "30s"}
"""Every value of the dashboard's variables; a rate window that spans the whole load."""
REQUESTS, CHUNKS = 960, 8
SLO_MILLISECONDS = 0.01
"""Far below what any request takes: the latency alert must hold."""
NOW = datetime(2025, 1, 1, tzinfo=UTC)


def status(
    replicas: int, ready: int, *conditions: tuple[ConditionType, str, Reason]
) -> InferenceDeploymentStatus:
    listed: list = []
    for type_, value, reason in conditions:
        listed = set_condition(listed, type_, ConditionStatus(value), reason, "", 1, NOW)
    return InferenceDeploymentStatus(conditions=listed, replicas=replicas, ready_replicas=ready)


def wrong_answers(status: InferenceDeploymentStatus) -> InferenceDeploymentStatus:
    """Two pods of different engines taken out on one node, as the operator records them."""
    records = [
        WrongAnswersStatus(pod=f"tiny-{n}", node="node-1", engine_digest=f"sha256:{n}",
                           reason=Reason.KNOWN_ANSWERS_FAILED, detected=NOW)
        for n in ("a", "b")
    ]  # fmt: skip
    return status.model_copy(update={"wrong_answers": records, "suspect_nodes": ["node-1"]})


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads((ROOT / DASHBOARD).read_text())
    return [
        (f"{panel['title']} / {target['legendFormat']}", target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]


def alert_queries() -> list[tuple[str, str]]:
    rules = yaml.safe_load((ROOT / RULES).read_text())
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def substituted(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, float]]:
    require_prometheus()
    with running_world(tmp_path_factory.mktemp("monitoring"), SLO_MILLISECONDS) as world:
        R, S = ConditionType, "True"
        world.board.record(
            ("ns-a", "tiny"),
            Report(
                wrong_answers(
                    status(
                        3,
                        2,
                        (R.READY, S, Reason.READY),
                        (R.SHADOW_PASSED, "False", Reason.SHADOW_FAILED),
                        (R.DEGRADED, S, Reason.QUALITY_DRIFT),
                        (R.SCALING_LIMITED, S, Reason.TOO_MANY_REPLICAS),
                    )
                ),
                (("scaling", True), ("quality", False)),
                pod_prices=(("tiny-serving", 3.6),),  # its node's share, for the cost panel
            ),
        )
        world.board.record(
            ("ns-b", "broken"),
            Report(status(1, 0, (R.ENGINE_READY, "False", Reason.ENGINE_BUILD_FAILED))),
        )
        # Prometheus scrapes its targets only seconds after it starts (its discovery sends
        # targets in batches): the price is in from the first scrape after the record.
        world.wait_for_scrape_after(time.time())
        priced = time.time()
        for chunk in range(CHUNKS):  # over many scrapes, as counters grow in production
            world.load(requests=REQUESTS // CHUNKS, seed=chunk)
            world.wait_for_scrape_after(time.time())  # each chunk in a scrape of its own
        world.settle()
        # not a wait: the cost panel counts a pod's seconds in subquery steps, one at least
        time.sleep(max(0.0, priced + dashboard.COST_RESOLUTION_SECONDS + 1 - time.time()))
        loaded = time.time()
        world.wait_for_scrape_after(loaded)
        assert set(world.statuses) == {200}
        yield world, loaded


def test_every_dashboard_query_returns_figures(world: tuple[World, float]) -> None:
    prometheus, at = world
    gpu = GpuMemoryReader().read() is not None
    empty = []
    for what, expr in dashboard_queries():
        result = prometheus.query(substituted(expr), at)
        if not result and not gpu and series.GPU_MEMORY_USED.name in expr:
            continue  # no GPU here: checked below
        if not result:
            empty.append(what)
            continue
        figures = [float(sample["value"][1]) for sample in result]
        assert all(math.isfinite(f) for f in figures), (what, result)
    assert not empty, f"no data for {empty}"
    if not gpu:
        assert prometheus.query(series.GPU_MEMORY_TOTAL.name, at) == []


def test_every_alert_holds_where_its_situation_was_made(world: tuple[World, float]) -> None:
    prometheus, at = world
    firing = {name: prometheus.query(substituted(expr), at) for name, expr in alert_queries()}
    assert all(firing.values()), [name for name, result in firing.items() if not result]

    def labels(alert: str, key: str) -> set[str]:
        return {sample["metric"][key] for sample in firing[alert]}

    assert "acme" in labels("KubeinferQualitySliceAgreementLow", "slice")
    assert labels("KubeinferQualityReferenceBehind", "namespace") == {"ns-b"}
    assert labels("KubeinferEngineBuildFailed", "name") == {"broken"}
    assert labels("KubeinferMetricsUnavailable", "reader") == {"scaling"}
    assert labels("KubeinferLatencyAboveSlo", "namespace") == {"ns-a"}  # only it has an SLO
    for alert in ("KubeinferShadowFailed", "KubeinferQualityDrift", "KubeinferScalingLimitedAtMax",
                  "KubeinferWrongAnswers"):  # fmt: skip
        assert labels(alert, "namespace") == {"ns-a"}, alert
    assert labels("KubeinferWrongAnswers", "pod") == {"tiny-a", "tiny-b"}
    assert labels("KubeinferSuspectNode", "node") == {"node-1"}
