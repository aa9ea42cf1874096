"""The chart's alert rules, as typed values: what each alert watches, how long it must
hold, and what it tells the person paged. Rendered once into the chart
(`helm/kubeinfer/files/monitoring/prometheus-rules.yaml`, a Prometheus rule file, which
the chart's PrometheusRule embeds and a Prometheus without the prometheus-operator loads
as `rule_files`).

Two kinds of source. The operator's own series (`kubeinfer operator --metrics-port`) carry
its verdicts: a failed build, a failed shadow, quality drift, the autoscaler held at
maxReplicas, metrics it cannot read, a pod taken out for wrong answers, a suspect node.
An alert on them says what the status says, with the operator's own judgement (its
significance test, its backoff), so it never disagrees with `kubectl describe`. The
runtime's series carry what only Prometheus sees over time: p99 against the object's SLO,
and the quality watch's plain thresholds (a class or a slice below 90 % agreement over an
hour on 200 rows or more; a reference losing most samples), which complement the
operator's verdict for a dashboard's Prometheus.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kubeinfer.cli.monitoring import promql
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason

Severity = Literal["critical", "warning", "info"]
OBJECT = ("namespace", "name")
DESCRIBE = "`kubectl describe infd -n {{ $labels.namespace }} {{ $labels.name }}`"


@dataclass(frozen=True)
class Alert:
    """One alerting rule."""

    name: str
    expr: str
    severity: Severity
    summary: str
    description: str = ""
    for_: str = ""
    """How long `expr` must hold before the alert fires; empty: at once."""

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_:
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {"summary": self.summary}
        if self.description:
            rule["annotations"]["description"] = self.description
        return rule


@dataclass(frozen=True)
class Group:
    name: str
    alerts: tuple[Alert, ...]

    def rules(self) -> dict[str, Any]:
        return {"name": self.name, "rules": [alert.rule() for alert in self.alerts]}


def _condition(type_: ConditionType, status: ConditionStatus, reason: Reason) -> str:
    labels = {"type": type_.value, "status": status.value, "reason": reason.value}
    return promql.condition(series.INFERENCE_DEPLOYMENT_CONDITION, labels, OBJECT)


FALSE, TRUE = ConditionStatus.FALSE, ConditionStatus.TRUE

OPERATOR = Group(
    "kubeinfer-operator",
    (
        Alert(
            "KubeinferEngineBuildFailed",
            _condition(ConditionType.ENGINE_READY, FALSE, Reason.ENGINE_BUILD_FAILED),
            "warning",
            "InferenceDeployment {{ $labels.namespace }}/{{ $labels.name }}: its engine build "
            "failed",
            "The build Job failed; the operator retries after its backoff, and a version "
            f"already serving keeps serving. The build's own message: {DESCRIBE}.",
        ),
        Alert(
            "KubeinferShadowFailed",
            _condition(ConditionType.SHADOW_PASSED, FALSE, Reason.SHADOW_FAILED),
            "warning",
            "InferenceDeployment {{ $labels.namespace }}/{{ $labels.name }}: the candidate "
            "failed its shadow test",
            "A threshold broke (or maxDurationSeconds passed without minSamples): the "
            "candidate was rolled back and is not tried again until the spec changes. Its "
            f"figures against the thresholds: {DESCRIBE} (status.candidate).",
        ),
        Alert(
            "KubeinferQualityDrift",
            _condition(ConditionType.DEGRADED, TRUE, Reason.QUALITY_DRIFT),
            "warning",
            "InferenceDeployment {{ $labels.namespace }}/{{ $labels.name }}: the served "
            "engine drifts from its reference",
            "The quality watch found a class or a slice significantly below its threshold. "
            f"The groups and figures: {DESCRIBE} (status.qualityWatch); the worst inputs: "
            "GET /v2/quality/exemplars on a serving pod.",
        ),
        Alert(
            "KubeinferScalingLimitedAtMax",
            _condition(ConditionType.SCALING_LIMITED, TRUE, Reason.TOO_MANY_REPLICAS),
            "warning",
            "InferenceDeployment {{ $labels.namespace }}/{{ $labels.name }}: the load asks "
            "for more replicas than maxReplicas",
            "The autoscaler is held at spec.autoscaling.maxReplicas; latency grows with the "
            "load from here. Raise maxReplicas or add capacity.",
            for_="15m",
        ),
        Alert(
            "KubeinferWrongAnswers",
            promql.gauge(
                series.INFERENCE_DEPLOYMENT_WRONG_ANSWERS, (*OBJECT, "pod", "node", "reason")
            )
            + " == 1",
            "critical",
            "InferenceDeployment {{ $labels.namespace }}/{{ $labels.name }}: pod "
            "{{ $labels.pod }} on node {{ $labels.node }} answered wrong "
            "({{ $labels.reason }})",
            "The operator's known-answer check found the pod's engine answering its probes "
            "wrong (KnownAnswersFailed) or otherwise than its peers on the same engine and "
            "hardware (AnswersDifferFromPeers). The pod was taken out of its Service and "
            "ReplicaSet (a replacement started) and kept as evidence. Read `kubectl infd "
            "answers -n {{ $labels.namespace }} {{ $labels.name }}` and `kubectl logs -n "
            "{{ $labels.namespace }} {{ $labels.pod }}`, then delete the pod; the alert "
            "resolves when it is gone.",
        ),
        Alert(
            "KubeinferSuspectNode",
            promql.gauge(series.INFERENCE_DEPLOYMENT_SUSPECT_NODE, ("node",)) + " == 1",
            "warning",
            "Node {{ $labels.node }}: pods of different engines answered wrong on it",
            "The node (its device, its CPU), not one engine, is the likely cause. Cordon it "
            "(or let the operator taint it: settings.knownAnswers.taintSuspectNodes, "
            "docs/known-answers.md) and check its hardware.",
        ),
        Alert(
            "KubeinferMetricsUnavailable",
            promql.gauge(series.INFERENCE_DEPLOYMENT_METRICS_UNAVAILABLE, (*OBJECT, "reader"))
            + " == 1",
            "warning",
            "InferenceDeployment {{ $labels.namespace }}/{{ $labels.name }}: the operator "
            "cannot read the serving pods' metrics ({{ $labels.reader }})",
            "What the reader decides waits meanwhile: a shadow verdict waits, the autoscaler "
            "holds the count (never scales down), the quality watch judges nothing. Check "
            "spec.monitoring.prometheus.url (or the chart's prometheus.url) and that "
            "Prometheus scrapes the serving pods with their namespace and pod labels.",
            for_="10m",
        ),
    ),
)

SERVED = ("namespace", "model", "version")

SERVING = Group(
    "kubeinfer-serving",
    (
        Alert(
            "KubeinferLatencyAboveSlo",
            promql.quantile(0.99, series.REQUEST_DURATION, SERVED, "5m")
            + f"\n> on ({', '.join(SERVED)})\n"
            + promql.gauge(series.SLO_P99_LATENCY, SERVED),
            "warning",
            "{{ $labels.model }} v{{ $labels.version }} in {{ $labels.namespace }}: p99 "
            "{{ $value | humanizeDuration }} over the last 5 minutes, above its objective",
            "p99 of the serving pods' request latency (arrival to response, all pods "
            "together) above the InferenceDeployment's slo.p99LatencyMilliseconds, which "
            "the runtime exports as kubeinfer_slo_p99_latency_seconds. The operator's own "
            "judgement over the SLO's window is the SLOMet condition: "
            "`kubectl get infd -n {{ $labels.namespace }}`.",
            for_="10m",
        ),
    ),
)

QUALITY_LABELS = ("namespace", "model", "serving_version")
QUALITY = {"role": "quality"}


def _agreement_low(group: str, rows: series.Series, agreements: series.Series) -> str:
    by = (*QUALITY_LABELS, group)
    low = promql.ratio(agreements, rows, by, "1h", QUALITY, increase=True)
    enough = promql.summed_increase(rows, by, "1h", **QUALITY)
    return f"(\n{low}\n) < 0.9\nand\n{enough} >= 200"


QUALITY_WATCH = Group(
    "kubeinfer-quality-watch",
    (
        Alert(
            "KubeinferQualityClassAgreementLow",
            _agreement_low(
                "reference_class",
                series.SHADOW_CLASS_TOP1_ROWS,
                series.SHADOW_CLASS_TOP1_AGREEMENTS,
            ),
            "warning",
            "{{ $labels.model }} v{{ $labels.serving_version }}: class "
            "{{ $labels.reference_class }} agrees with its reference on "
            "{{ $value | humanizePercentage }} of rows",
            "Top-1 agreement of the served engine with its full-precision reference, over the "
            "last hour, for the rows the reference puts in this class. See `kubectl get infd "
            "-n {{ $labels.namespace }} -o jsonpath='{.items[*].status.qualityWatch}'` and "
            "GET /v2/quality/exemplars on a serving pod.",
            for_="15m",
        ),
        Alert(
            "KubeinferQualitySliceAgreementLow",
            _agreement_low(
                "slice", series.SHADOW_SLICE_TOP1_ROWS, series.SHADOW_SLICE_TOP1_AGREEMENTS
            ),
            "warning",
            "{{ $labels.model }} v{{ $labels.serving_version }}: slice {{ $labels.slice }} "
            "agrees with its reference on {{ $value | humanizePercentage }} of rows",
            for_="15m",
        ),
        Alert(
            "KubeinferQualityReferenceBehind",
            promql.summed_rate(
                series.SHADOW_REQUESTS, QUALITY_LABELS, "10m", outcome="!=compared", **QUALITY
            )
            + "\n/\n"
            + promql.summed_rate(series.SHADOW_REQUESTS, QUALITY_LABELS, "10m", **QUALITY)
            + "\n> 0.5",
            "info",
            "{{ $labels.model }} v{{ $labels.serving_version }}: the quality reference loses "
            "{{ $value | humanizePercentage }} of the sampled requests",
            "Dropped (queue full), timed out or refused: the watch's effective sample rate is "
            "below what samplePercent asks, so drift takes longer to see.",
            for_="15m",
        ),
    ),
)

GROUPS = (OPERATOR, SERVING, QUALITY_WATCH)


def rule_groups() -> dict[str, Any]:
    """The rule file's content."""
    return {"groups": [group.rules() for group in GROUPS]}


def alerts() -> tuple[Alert, ...]:
    return tuple(alert for group in GROUPS for alert in group.alerts)
