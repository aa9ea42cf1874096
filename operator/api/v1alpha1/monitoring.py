"""Where the operator reads the runtime pods' metrics (the spec's `monitoring`: Prometheus,
and PromQL overrides of the named queries) and the latency objective reported against
them (`slo`)."""

from __future__ import annotations

from kubeinfer.contract.api_model import ApiModel
from pydantic import Field


class PrometheusSpec(ApiModel):
    """A Prometheus server that scrapes the runtime pods."""

    url: str | None = Field(default=None, pattern=r"^https?://.+$", max_length=2048)
    """Prometheus base URL; the operator's default (Helm value prometheus.url) when unset."""


class QueryOverrides(ApiModel):
    """PromQL that replaces one of the operator's named queries for this object, when the
    figures come from Prometheus (e.g. where a recording rule or other labels serve
    better). `$namespace` and `$pods` stand for the object's namespace and a regex of its
    serving pods' names, escaped as the inside of a double-quoted string, so write them
    in double quotes: `{namespace="$namespace", pod=~"$pods"}` (`$$` is a literal `$`).
    Each query must answer one series or a scalar (aggregate with `avg`, `max`...); no
    series reads as no figure. A query Prometheus refuses, or one answering several
    series, makes the autoscaler hold the count, with the field named in the status.
    Without Prometheus (the pods' own /metrics), the built-in definitions apply."""

    requests_in_progress_per_replica: str | None = Field(
        default=None, min_length=1, max_length=4096
    )
    """Replaces `requests_in_progress_per_replica`: requests received and not yet answered per
    pod. The built-in is `avg(sum by (namespace, pod)
    (kubeinfer_requests_in_progress{...}))`, over every pod Prometheus scrapes; with
    kube-state-metrics, `avg((<the same sum>) and on (namespace, pod)
    (kube_pod_status_ready{condition="true"} == 1))` averages over the ready ones only."""

    gpu_memory_used_ratio: str | None = Field(default=None, min_length=1, max_length=4096)
    """Replaces `gpu_memory_used_ratio`: the highest used/total ratio over the pods' GPUs
    (built-in: `max(kubeinfer_gpu_memory_used_bytes{...} /
    (kubeinfer_gpu_memory_total_bytes{...} > 0))`)."""


class MonitoringSpec(ApiModel):
    """Where the operator reads the runtime pods' metrics: shadow verdicts and the
    autoscaler read them. From Prometheus when a URL is set here or in the operator's
    settings; otherwise the operator reads each runtime pod's /metrics itself."""

    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec)
    """The Prometheus to query."""

    queries: QueryOverrides = Field(default_factory=QueryOverrides)
    """PromQL overrides of the named queries, for this object."""


class SloSpec(ApiModel):
    """Service level objectives: the status reports the serving pods' p99 against them
    (`status.slo`, the SLOMet condition), and the autoscaler may scale up on a sustained
    miss (autoscaling.scaleUpOnSloMissAfterSeconds)."""

    p99_latency_milliseconds: float | None = Field(default=None, gt=0, le=3_600_000)
    """Objective for the serving pods' p99 request latency (arrival to response), in
    milliseconds."""
