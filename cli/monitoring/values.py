"""The chart's `monitoring:` values, typed: the PodMonitors, the PrometheusRule and the
Grafana dashboard the chart can install (`helm/kubeinfer/templates/monitoring-*.yaml`).
`kubeinfer.cli.chart.values.ChartValues` holds this model as its `monitoring` field, so
values.yaml and values.schema.json carry it like every other value.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"
LABELS_SCHEMA: JsonDict = {
    "propertyNames": {"pattern": LABEL_KEY, "maxLength": 316},
    "additionalProperties": {"type": "string", "pattern": LABEL_VALUE, "maxLength": 63},
}
"""Kubernetes' rules for label keys and values, so a bad label fails `helm install`, not
the API server halfway through it."""


class _Values(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Toggle(_Values):
    enabled: bool = False
    """Whether the chart installs it."""


class OperatorPodMonitor(Toggle):
    """A PodMonitor scraping the operator pods at their `metrics` port (needs metricsPort),
    with honorLabels: each series carries the namespace of its InferenceDeployment. The
    alerts on the operator's verdicts and the dashboard's replicas read these series."""


class RuntimePodMonitor(Toggle):
    """A PodMonitor scraping every serving pod in the watched namespaces. Only with
    settings.metrics.podMonitors `off` (the chart refuses it otherwise): in `auto` the
    operator creates a PodMonitor per InferenceDeployment, and both would scrape each pod
    twice, doubling every sum the operator reads."""


class PrometheusRule(Toggle):
    """The alert rules (files/monitoring/prometheus-rules.yaml) as a PrometheusRule: a
    build, a shadow or the quality watch failing, scaling held at maxReplicas, p99 above
    the object's SLO, metrics the operator cannot read, a pod taken out for wrong
    answers, a suspect node."""


class Dashboard(Toggle):
    """The Grafana dashboard (files/monitoring/grafana-dashboard.json) in a ConfigMap that
    Grafana's dashboard sidecar loads."""

    namespace: str = Field(default="", pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$", max_length=63)
    """Where the sidecar looks for dashboards; empty: the release's namespace."""

    labels: dict[str, str] = Field(
        default_factory=lambda: {"grafana_dashboard": "1"}, json_schema_extra=LABELS_SCHEMA
    )
    """The ConfigMap's labels: the sidecar's label (grafana_dashboard: "1" in the Grafana
    and kube-prometheus-stack charts)."""

    annotations: dict[str, str] = Field(default_factory=dict)
    """The ConfigMap's annotations (e.g. grafana_folder, for a sidecar that files
    dashboards into folders)."""


class MonitoringValues(_Values):
    """Monitoring with the prometheus-operator and Grafana. The PodMonitors and the
    PrometheusRule need the prometheus-operator's CRDs; the dashboard, Grafana's dashboard
    sidecar."""

    operator_pod_monitor: OperatorPodMonitor = OperatorPodMonitor()
    runtime_pod_monitor: RuntimePodMonitor = RuntimePodMonitor()
    prometheus_rule: PrometheusRule = PrometheusRule()
    dashboard: Dashboard = Dashboard()

    labels: dict[str, str] = Field(default_factory=dict, json_schema_extra=LABELS_SCHEMA)
    """Labels added to the PodMonitors and the PrometheusRule, for a Prometheus that
    selects them by label (e.g. release: kube-prometheus-stack)."""
