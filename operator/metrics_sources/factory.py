"""The operator's metrics sources: an object's own Prometheus
(`spec.monitoring.prometheus.url`), else the operator's
(`KUBEINFER_METRICS__PROMETHEUS_URL`, the Helm value `prometheus.url`), else a direct read
of the runtime pods' /metrics.

`MetricsSources` makes each source once and keeps it for the operator's life, owned by
the reconciler: one HTTP session per Prometheus (connections reused across passes and
objects; the autoscaler's signals read for every object at once, once per autoscale
poll: `shared_reads`) and one for the direct reads, so the caps on queries in flight hold per
operator, not per pass; `close` releases them at shutdown.
"""

from __future__ import annotations

from kubeinfer.operator.metrics_sources.direct import DirectRead, ListPods
from kubeinfer.operator.metrics_sources.prometheus import PrometheusSource
from kubeinfer.operator.metrics_sources.source import MetricsSource
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.telemetry.activity import Activity


class MetricsSources:
    """One source per Prometheus URL and one direct reader, made on first use."""

    def __init__(
        self, settings: OperatorSettings, list_pods: ListPods, activity: Activity | None = None
    ) -> None:
        self.settings = settings
        self.activity = activity if activity is not None else Activity()
        """Where the sources count their queries."""
        self._list_pods = list_pods
        self._prometheus: dict[str, PrometheusSource] = {}
        self._direct: DirectRead | None = None

    def for_object(self, prometheus_url: str | None) -> MetricsSource:
        """The source for an object whose spec names `prometheus_url` (or None)."""
        url = (prometheus_url or self.settings.metrics.prometheus_url or "").rstrip("/")
        timeout = self.settings.metrics.timeout_seconds
        if url:
            if url not in self._prometheus:
                self._prometheus[url] = PrometheusSource(
                    url, timeout, self.activity, self.settings.requeue.autoscale_poll_seconds
                )
            return self._prometheus[url]
        if self._direct is None:
            self._direct = DirectRead(self._list_pods, timeout, self.activity)
        return self._direct

    async def close(self) -> None:
        for source in self._prometheus.values():
            source.close()
        self._prometheus.clear()
        if self._direct is not None:
            await self._direct.close()
            self._direct = None
