"""The operator's /metrics for the cost: each serving pod running on a priced node as
`kubeinfer_inferencedeployment_pod_price_per_hour` (its share times its node's price), the
series the dashboard's cost panel sums over time; none for a pod gone or unpriced; and a
failed read of the inferences as `..._metrics_unavailable{reader="cost"}`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from decide_scenarios import make_spec
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus
from kubeinfer.operator.state.cost_readings import CostHistory, CostReading, PodRun
from kubeinfer.operator.state.observed import ObservedState, OwnerRef
from kubeinfer.operator.telemetry.exporter import Report, families, metrics_readers, pod_prices

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def observed(reading: CostReading | None) -> ObservedState:
    runs = (
        PodRun("clf-a", "gpu-1", NOW - timedelta(hours=1), NOW, 1 / 8, 32.0),
        PodRun("clf-b", "gpu-1", NOW - timedelta(hours=1), NOW - timedelta(minutes=5),
               1 / 8, 32.0, running=False),
        PodRun("clf-c", "t4-1", NOW - timedelta(hours=1), NOW, 1.0, None),
    )  # fmt: skip
    return ObservedState(
        OwnerRef("clf", "ml", "uid", 1), make_spec(), InferenceDeploymentStatus(),
        cost=reading, cost_history=CostHistory(runs),
    )  # fmt: skip


def samples(name: str, report: Report) -> dict[tuple[str, ...], float]:
    (family,) = [f for f in families([(("ml", "clf"), report)]) if f.name == name]
    return {tuple(s.labels.values()): s.value for s in family.samples}


def test_each_running_priced_pod_exports_its_price_per_hour() -> None:
    prices = pod_prices(observed(None))
    assert prices == (("clf-a", 4.0),), "the gone pod and the unpriced one export nothing"
    report = Report(InferenceDeploymentStatus(), pod_prices=prices)
    family = series.INFERENCE_DEPLOYMENT_POD_PRICE_PER_HOUR
    assert samples(family.name, report) == {("ml", "clf", "clf-a"): 4.0}
    assert samples(family.name, Report(InferenceDeploymentStatus())) == {}


def test_a_failed_read_of_the_inferences_is_a_reader_unavailable() -> None:
    failed = metrics_readers(observed(CostReading(error="Prometheus: down")))
    assert failed == (("cost", True),)
    assert metrics_readers(observed(CostReading({}, 3600))) == (("cost", False),)
    assert metrics_readers(observed(None)) == (), "not read: not said"
    report = Report(InferenceDeploymentStatus(), unavailable=failed)
    unavailable = samples(series.INFERENCE_DEPLOYMENT_METRICS_UNAVAILABLE.name, report)
    assert unavailable == {("ml", "clf", "cost"): 1}
