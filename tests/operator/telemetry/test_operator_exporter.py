"""The operator's own series (`kubeinfer.operator.telemetry.exporter`), without a
cluster: a status's conditions and replicas as gauges labelled with the object's
namespace and name, the metrics readers a pass used with whether each failed, each pod
taken out for wrong answers and each suspect node as a sample of one, the board
following records, forgets and a lost lease, and the families served over real HTTP in
Prometheus' text format. The control-plane test (`test_operator_metrics_endpoint.py`)
checks the same series from a running operator."""

from __future__ import annotations

import asyncio
import http.client
from dataclasses import replace
from datetime import UTC, datetime

from decide_scenarios import Cluster, make_spec
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.api.v1alpha1.conditions import (
    ConditionStatus,
    ConditionType,
    Reason,
    set_condition,
)
from kubeinfer.operator.api.v1alpha1.status import InferenceDeploymentStatus, WrongAnswersStatus
from kubeinfer.operator.state.quality_readings import QualityReading
from kubeinfer.operator.state.scaling_inputs import ScalingSignals
from kubeinfer.operator.state.shadow_readings import ShadowReading
from kubeinfer.operator.telemetry.exporter import (
    Report,
    StatusBoard,
    board_registry,
    families,
    metrics_readers,
    serve_metrics,
)
from prometheus_client.parser import text_string_to_metric_families

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def status(
    replicas: int, ready: int, *conditions: tuple[ConditionType, str, Reason]
) -> InferenceDeploymentStatus:
    listed: list = []
    for type_, value, reason in conditions:
        listed = set_condition(listed, type_, ConditionStatus(value), reason, "", 1, NOW)
    return InferenceDeploymentStatus(conditions=listed, replicas=replicas, ready_replicas=ready)


def samples(reports: list) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in families(reports)
        for s in family.samples
    }


def test_each_condition_is_a_sample_of_one_with_its_type_status_and_reason() -> None:
    built = status(
        3,
        2,
        (ConditionType.READY, "True", Reason.READY),
        (ConditionType.SCALING_LIMITED, "True", Reason.TOO_MANY_REPLICAS),
    )
    got = samples([(("serving", "clf"), Report(built, (("scaling", False), ("shadow", True))))])
    condition = series.INFERENCE_DEPLOYMENT_CONDITION.name
    obj = (("name", "clf"), ("namespace", "serving"))
    assert got == {
        (condition, (*obj, ("reason", "Ready"), ("status", "True"), ("type", "Ready")), 1),
        (
            condition,
            (*obj, ("reason", "TooManyReplicas"), ("status", "True"), ("type", "ScalingLimited")),
            1,
        ),
        (series.INFERENCE_DEPLOYMENT_REPLICAS.name, obj, 3),
        (series.INFERENCE_DEPLOYMENT_READY_REPLICAS.name, obj, 2),
        (series.INFERENCE_DEPLOYMENT_METRICS_UNAVAILABLE.name, (*obj, ("reader", "scaling")), 0),
        (series.INFERENCE_DEPLOYMENT_METRICS_UNAVAILABLE.name, (*obj, ("reader", "shadow")), 1),
    }


def test_each_pod_taken_out_for_wrong_answers_and_each_suspect_node_is_a_sample_of_one() -> None:
    records = [
        WrongAnswersStatus(pod="clf-a", node="node-1", reason="KnownAnswersFailed", detected=NOW),
        WrongAnswersStatus(pod="clf-b", node="node-1", reason="AnswersDifferFromPeers",
                           detected=NOW),
    ]  # fmt: skip
    built = status(2, 2).model_copy(update={"wrong_answers": records, "suspect_nodes": ["node-1"]})
    got = samples([(("serving", "clf"), Report(built))])
    obj = (("name", "clf"), ("namespace", "serving"))
    wrong = series.INFERENCE_DEPLOYMENT_WRONG_ANSWERS.name
    assert {s for s in got if s[0] == wrong} == {
        (wrong, (*obj, ("node", "node-1"), ("pod", "clf-a"), ("reason", "KnownAnswersFailed")), 1),
        (wrong, (*obj, ("node", "node-1"), ("pod", "clf-b"), ("reason", "AnswersDifferFromPeers")),
         1),
    }  # fmt: skip
    suspect = series.INFERENCE_DEPLOYMENT_SUSPECT_NODE.name
    assert {s for s in got if s[0] == suspect} == {(suspect, (*obj, ("node", "node-1")), 1)}
    # Nothing taken out: no sample (an absent series, as for a condition not held).
    assert not {s for s in samples([(("serving", "clf"), Report(status(1, 1)))]) if s[0] == wrong}


def test_only_the_readers_a_pass_used_are_reported_each_failed_when_it_has_an_error() -> None:
    observed = Cluster(make_spec()).observe()
    assert metrics_readers(observed) == ()
    read = replace(
        observed,
        shadow=ShadowReading(None, "http://prometheus:9090: connection refused"),
        quality=QualityReading(),
        scaling_signals=ScalingSignals(requests_in_progress_per_replica=1.0),
    )
    assert metrics_readers(read) == (("shadow", True), ("quality", False), ("scaling", False))


async def test_the_board_is_served_as_it_is_at_each_scrape() -> None:
    board = StatusBoard()
    board.record(("a", "x"), Report(status(1, 1, (ConditionType.READY, "True", Reason.READY))))
    board.record(("b", "y"), Report(status(2, 0)))

    def scrape(port: int) -> dict[tuple[str, str], float]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type", "").startswith("text/plain")
        text = response.read().decode()
        connection.close()
        return {
            (s.labels["namespace"], s.labels["name"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == series.INFERENCE_DEPLOYMENT_REPLICAS.name
        }

    async with serve_metrics(board_registry(board), 0, host="127.0.0.1") as port:
        assert await asyncio.to_thread(scrape, port) == {("a", "x"): 1, ("b", "y"): 2}
        board.forget(("a", "x"))
        assert await asyncio.to_thread(scrape, port) == {("b", "y"): 2}
        board.clear()  # the lease is lost: a standby reports nothing
        assert await asyncio.to_thread(scrape, port) == {}
