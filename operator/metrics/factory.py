"""Chooses the metrics source of one InferenceDeployment: its own Prometheus
(`spec.monitoring.prometheus.url`), else the operator's (`KUBEINFER_PROMETHEUS_URL`, the
Helm value `prometheus.url`), else a direct read of the runtime pods' /metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubeinfer.operator.kube.client import POD, KubeClient
from kubeinfer.operator.metrics.direct import DirectRead, ListPods
from kubeinfer.operator.metrics.prometheus import PrometheusSource
from kubeinfer.operator.metrics.source import MetricsSource
from kubeinfer.operator.settings import OperatorSettings


def metrics_source(
    prometheus_url: str | None, settings: OperatorSettings, list_pods: ListPods
) -> MetricsSource:
    """The source for an object whose spec names `prometheus_url` (or None)."""
    url = prometheus_url or settings.prometheus_url
    if url:
        return PrometheusSource(url, settings.metrics_timeout_seconds)
    return DirectRead(list_pods, settings.metrics_timeout_seconds)


def pods_lister(client: KubeClient) -> ListPods:
    """`ListPods` over the operator's API client."""

    async def list_pods(namespace: str, label_selector: str) -> Sequence[Mapping[str, Any]]:
        return await client.list(POD, namespace, label_selector)

    return list_pods
