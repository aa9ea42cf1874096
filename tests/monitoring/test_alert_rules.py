"""The chart's alert rules (`helm/kubeinfer/files/monitoring/prometheus-rules.yaml`,
rendered from `kubeinfer.cli.monitoring.alerts`) run by Prometheus' own rule engine
(`promtool test rules`, from the same Debian package as the server) on series shaped as
the operator and the runtime export them, one alert at a time:

- the operator's verdicts: a failed build, a failed shadow, quality drift fire at once on
  the matching condition, never on the same type with another status or reason; scaling
  held at maxReplicas fires only after 15 minutes; metrics unavailable names its reader
  and fires after 10 minutes, not for a reader that reads; a pod taken out for wrong
  answers fires at once, critical, and resolves once the pod is deleted; a suspect node
  fires once, however many objects name it;
- the quality watch's plain thresholds: a class and a slice below 90 % agreement over an
  hour on 200 rows or more fire, healthy ones and a class with too few rows do not; a
  reference losing most samples fires its own alert.

Series names come from the contract, so a renamed series fails here; promtool also checks
the rendered annotations."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.cli.monitoring.render import RULES
from kubeinfer.contract import metric_series as series
from required_tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
RULE_FILE = ROOT / RULES
OBJECT = 'namespace="serving", name="clf"'
QUALITY = (
    'namespace="serving", model="resnet", serving_version="1", candidate_version="1", '
    'candidate_digest="sha256:ref", role="quality"'
)
DESCRIBE = "`kubectl describe infd -n serving clf`"


def promtool() -> str:
    return require_tool(
        "promtool",
        "promtool is not installed (it comes with Debian's prometheus package)",
        "the real-Prometheus tests",
    )


def counter(name: str, labels: str, per_minute: float, minutes: int = 120) -> dict[str, str]:
    """A counter growing by `per_minute` each minute, as promtool's series notation."""
    return {"series": f"{name}{{{labels}}}", "values": f"0+{per_minute}x{minutes}"}


def gauge(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def condition(type_: str, status: str, reason: str, values: str = "1x60") -> dict[str, str]:
    labels = f'{OBJECT}, type="{type_}", status="{status}", reason="{reason}"'
    return gauge(series.INFERENCE_DEPLOYMENT_CONDITION.name, labels, values)


def run_promtool(tmp_path: Path, inputs: list[dict[str, str]], cases: list[dict[str, Any]]) -> None:
    tool = promtool()
    spec = {
        "rule_files": [str(RULE_FILE)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": cases}],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = subprocess.run([tool, "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def firing(alert: str, at: str, labels: dict[str, str], annotations: dict[str, str]) -> dict:
    expected = {"exp_labels": labels, "exp_annotations": annotations}
    return {"eval_time": at, "alertname": alert, "exp_alerts": [expected]}


def silent(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def test_promtool_accepts_the_rule_file() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULE_FILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


OPERATOR_VERDICTS = [
    (
        "KubeinferEngineBuildFailed",
        ("EngineReady", "False", "EngineBuildFailed"),
        ("EngineReady", "False", "EngineBuilding"),
        "InferenceDeployment serving/clf: its engine build failed",
        "The build Job failed; the operator retries after its backoff, and a version already "
        f"serving keeps serving. The build's own message: {DESCRIBE}.",
    ),
    (
        "KubeinferShadowFailed",
        ("ShadowPassed", "False", "ShadowFailed"),
        ("ShadowPassed", "False", "ShadowAborted"),
        "InferenceDeployment serving/clf: the candidate failed its shadow test",
        "A threshold broke (or maxDurationSeconds passed without minSamples): the candidate "
        "was rolled back and is not tried again until the spec changes. Its figures against "
        f"the thresholds: {DESCRIBE} (status.candidate).",
    ),
    (
        "KubeinferQualityDrift",
        ("Degraded", "True", "QualityDrift"),
        ("Degraded", "False", "QualityDrift"),
        "InferenceDeployment serving/clf: the served engine drifts from its reference",
        "The quality watch found a class or a slice significantly below its threshold. The "
        f"groups and figures: {DESCRIBE} (status.qualityWatch); the worst inputs: GET "
        "/v2/quality/exemplars on a serving pod.",
    ),
]


@pytest.mark.parametrize(
    ("alert", "matching", "other", "summary", "description"),
    OPERATOR_VERDICTS,
    ids=[case[0] for case in OPERATOR_VERDICTS],
)
def test_an_operator_verdict_fires_at_once_on_its_condition_only(
    tmp_path: Path,
    alert: str,
    matching: tuple[str, str, str],
    other: tuple[str, str, str],
    summary: str,
    description: str,
) -> None:
    # The matching condition from minute 10; the same type otherwise before it.
    inputs = [condition(*other, values="1x9 _x50"), condition(*matching, values="_x9 1x50")]
    labels = {"namespace": "serving", "name": "clf", "severity": "warning"}
    annotations = {"summary": summary, "description": description}
    run_promtool(tmp_path, inputs, [silent(alert, "5m"), firing(alert, "10m", labels, annotations)])


def test_scaling_held_at_max_replicas_fires_after_fifteen_minutes(tmp_path: Path) -> None:
    alert = "KubeinferScalingLimitedAtMax"
    inputs = [
        condition("ScalingLimited", "True", "TooManyReplicas"),
        # Another object held at its minimum: no alert for it.
        gauge(
            series.INFERENCE_DEPLOYMENT_CONDITION.name,
            'namespace="serving", name="small", type="ScalingLimited", status="True", '
            'reason="TooFewReplicas"',
            "1x60",
        ),
    ]
    labels = {"namespace": "serving", "name": "clf", "severity": "warning"}
    annotations = {
        "summary": "InferenceDeployment serving/clf: the load asks for more replicas than "
        "maxReplicas",
        "description": "The autoscaler is held at spec.autoscaling.maxReplicas; latency grows "
        "with the load from here. Raise maxReplicas or add capacity.",
    }
    run_promtool(
        tmp_path, inputs, [silent(alert, "14m"), firing(alert, "16m", labels, annotations)]
    )


def test_metrics_unavailable_names_its_reader_after_ten_minutes(tmp_path: Path) -> None:
    alert = "KubeinferMetricsUnavailable"
    name = series.INFERENCE_DEPLOYMENT_METRICS_UNAVAILABLE.name
    inputs = [
        gauge(name, f'{OBJECT}, reader="scaling"', "1x60"),
        gauge(name, f'{OBJECT}, reader="shadow"', "0x60"),
    ]
    labels = {"namespace": "serving", "name": "clf", "reader": "scaling", "severity": "warning"}
    annotations = {
        "summary": "InferenceDeployment serving/clf: the operator cannot read the serving "
        "pods' metrics (scaling)",
        "description": "What the reader decides waits meanwhile: a shadow verdict waits, the "
        "autoscaler holds the count (never scales down), the quality watch judges nothing. "
        "Check spec.monitoring.prometheus.url (or the chart's prometheus.url) and that "
        "Prometheus scrapes the serving pods with their namespace and pod labels.",
    }
    run_promtool(tmp_path, inputs, [silent(alert, "9m"), firing(alert, "11m", labels, annotations)])


def test_a_pod_taken_out_for_wrong_answers_fires_at_once_and_resolves_when_it_is_gone(
    tmp_path: Path,
) -> None:
    alert = "KubeinferWrongAnswers"
    wrong = series.INFERENCE_DEPLOYMENT_WRONG_ANSWERS.name
    pod = f'{OBJECT}, pod="clf-7d9c-x2k4p", node="node-1", reason="KnownAnswersFailed"'
    # Taken out at minute 5, deleted at minute 20 (the series goes with the pod).
    inputs = [gauge(wrong, pod, "_x4 1x15 _x20")]
    labels = {"namespace": "serving", "name": "clf", "pod": "clf-7d9c-x2k4p", "node": "node-1",
              "reason": "KnownAnswersFailed", "severity": "critical"}  # fmt: skip
    annotations = {
        "summary": "InferenceDeployment serving/clf: pod clf-7d9c-x2k4p on node node-1 "
        "answered wrong (KnownAnswersFailed)",
        "description": "The operator's known-answer check found the pod's engine answering "
        "its probes wrong (KnownAnswersFailed) or otherwise than its peers on the same engine "
        "and hardware (AnswersDifferFromPeers). The pod was taken out of its Service and "
        "ReplicaSet (a replacement started) and kept as evidence. Read `kubectl infd answers "
        "-n serving clf` and `kubectl logs -n serving clf-7d9c-x2k4p`, then delete the pod; "
        "the alert resolves when it is gone.",
    }
    cases = [silent(alert, "3m"), firing(alert, "6m", labels, annotations), silent(alert, "30m")]
    run_promtool(tmp_path, inputs, cases)


def test_a_suspect_node_fires_once_per_node_whichever_objects_name_it(tmp_path: Path) -> None:
    alert = "KubeinferSuspectNode"
    suspect = series.INFERENCE_DEPLOYMENT_SUSPECT_NODE.name
    inputs = [
        gauge(suspect, 'namespace="serving", name="clf", node="node-1"', "1x30"),
        gauge(suspect, 'namespace="other", name="llm", node="node-1"', "1x30"),
    ]
    labels = {"node": "node-1", "severity": "warning"}
    annotations = {
        "summary": "Node node-1: pods of different engines answered wrong on it",
        "description": "The node (its device, its CPU), not one engine, is the likely cause. "
        "Cordon it (or let the operator taint it: settings.knownAnswers.taintSuspectNodes, "
        "docs/known-answers.md) and check its hardware.",
    }
    run_promtool(tmp_path, inputs, [firing(alert, "5m", labels, annotations)])


QUALITY_DESCRIPTION = (
    "Top-1 agreement of the served engine with its full-precision reference, over the last "
    "hour, for the rows the reference puts in this class. See `kubectl get infd -n serving "
    "-o jsonpath='{.items[*].status.qualityWatch}'` and GET /v2/quality/exemplars on a "
    "serving pod."
)


def test_the_quality_rules_fire_on_a_falling_class_a_falling_slice_and_a_reference_behind(
    tmp_path: Path,
) -> None:
    rows, agreements = (
        series.SHADOW_CLASS_TOP1_ROWS.total,
        series.SHADOW_CLASS_TOP1_AGREEMENTS.total,
    )
    slice_rows, slice_agreements = (
        series.SHADOW_SLICE_TOP1_ROWS.total,
        series.SHADOW_SLICE_TOP1_AGREEMENTS.total,
    )
    requests = series.SHADOW_REQUESTS.total
    inputs = [
        # Class 3 at 80 %, class 1 at 99 %, class 7 at 50 % but on too few rows.
        counter(rows, f'{QUALITY}, reference_class="3"', 10),
        counter(agreements, f'{QUALITY}, reference_class="3"', 8),
        counter(rows, f'{QUALITY}, reference_class="1"', 100),
        counter(agreements, f'{QUALITY}, reference_class="1"', 99),
        counter(rows, f'{QUALITY}, reference_class="7"', 1),
        counter(agreements, f'{QUALITY}, reference_class="7"', 0.5),
        # Slice acme at 70 %, the rest at 99 %.
        counter(slice_rows, f'{QUALITY}, slice="acme"', 10),
        counter(slice_agreements, f'{QUALITY}, slice="acme"', 7),
        counter(slice_rows, f'{QUALITY}, slice="other"', 100),
        counter(slice_agreements, f'{QUALITY}, slice="other"', 99),
        # Of every 10 sampled requests, 7 dropped.
        counter(requests, f'{QUALITY}, outcome="compared"', 3),
        counter(requests, f'{QUALITY}, outcome="dropped"', 7),
    ]
    common = {"namespace": "serving", "model": "resnet", "serving_version": "1"}
    cases = [
        firing(
            "KubeinferQualityClassAgreementLow",
            "90m",
            {**common, "reference_class": "3", "severity": "warning"},
            {
                "summary": "resnet v1: class 3 agrees with its reference on 80% of rows",
                "description": QUALITY_DESCRIPTION,
            },
        ),
        firing(
            "KubeinferQualitySliceAgreementLow",
            "90m",
            {**common, "slice": "acme", "severity": "warning"},
            {"summary": "resnet v1: slice acme agrees with its reference on 70% of rows"},
        ),
        firing(
            "KubeinferQualityReferenceBehind",
            "90m",
            {**common, "severity": "info"},
            {
                "summary": "resnet v1: the quality reference loses 70% of the sampled requests",
                "description": "Dropped (queue full), timed out or refused: the watch's "
                "effective sample rate is below what samplePercent asks, so drift takes longer "
                "to see.",
            },
        ),
        # Not yet: the hour's window is short of 200 rows, then `for` holds.
        silent("KubeinferQualityClassAgreementLow", "10m"),
    ]
    run_promtool(tmp_path, inputs, cases)


def test_p99_above_the_objective_fires_after_ten_minutes_for_the_version_that_misses_it(
    tmp_path: Path,
) -> None:
    alert = "KubeinferLatencyAboveSlo"
    bucket = f"{series.REQUEST_DURATION.name}_bucket"

    def histogram(version: str, lowest_bound_reached: float) -> list[dict[str, str]]:
        labels = f'namespace="serving", pod="clf-a", model="clf", version="{version}"'
        return [
            counter(bucket, f'{labels}, le="{le}"', 10 if float(le) >= lowest_bound_reached else 0)
            for le in ("0.05", "0.5", "1", "+Inf")
        ]

    slo = series.SLO_P99_LATENCY.name
    inputs = [
        *histogram("1", 1.0),  # every request between 0.5 s and 1 s: p99 0.995 s
        *histogram("2", 0.05),  # every request under 50 ms
        *histogram("3", 1.0),  # as slow as v1, with no objective
        gauge(slo, 'namespace="serving", pod="clf-a", model="clf", version="1"', "0.2x60"),
        gauge(slo, 'namespace="serving", pod="clf-a", model="clf", version="2"', "0.2x60"),
    ]
    labels = {"namespace": "serving", "model": "clf", "version": "1", "severity": "warning"}
    annotations = {
        "summary": "clf v1 in serving: p99 995ms over the last 5 minutes, above its objective",
        "description": "p99 of the serving pods' request latency (arrival to response, all "
        "pods together) above the InferenceDeployment's slo.p99LatencyMilliseconds, which the "
        "runtime exports as kubeinfer_slo_p99_latency_seconds. The operator's own judgement "
        "over the SLO's window is the SLOMet condition: `kubectl get infd -n serving`.",
    }
    run_promtool(tmp_path, inputs, [silent(alert, "9m"), firing(alert, "12m", labels, annotations)])
