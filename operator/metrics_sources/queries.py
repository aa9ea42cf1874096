"""The named queries: every figure the operator reads from the runtime pods' metrics, in
one table, each in two forms that answer the same question. Pure.

A `NamedQuery` row gives the name, what it means, the series it reads, and its
`Aggregation`, which holds both forms: the PromQL template Prometheus evaluates, and the
reduction the direct read applies to the pods' current samples (`samples.py`). Binding a
row to a `Scope` (the serving pods of one InferenceDeployment) and its arguments gives a
`Query`, which either source evaluates.

Series are selected in Prometheus by the `namespace` and `pod` labels that PodMonitors
(prometheus-operator) and the prometheus-community chart's `kubernetes-pods` job attach
(Prometheus' own example job names them `kubernetes_namespace` and `kubernetes_pod_name`,
which these queries do not see); the pod name regex matches the pods of `<owner>-runtime`
only (`promql.deployment_pod_regex`), the same pods the direct read lists by label
selector. Prometheus must scrape each pod in one job only, or its series count twice.

"So far" figures (the shadow's) take `max_over_time(series[window])` per series, then
sum or max across series: a counter only grows, so its maximum is its latest value; a
pod restarted inside the window is a new series whose old one still counts (which
`increase()` would not: it loses a new series' first sample). The window is the shadow's
age plus a margin of scrape intervals (`shadow.py`). The direct read sees the live pods
only: what a replaced pod counted is gone from it.

The aggregations (S the series, w the window; the direct read's form after the colon):

- SUM_SO_FAR `sum(max_over_time(S[w]))`: sum of the pods' current samples.
- MAX_SO_FAR `max(max_over_time(S[w]))`: largest current sample.
- P99_SO_FAR `histogram_quantile(0.99, sum by (le) (max_over_time(S_bucket[w])))`: the
  buckets summed over pods, then the same interpolation.
- P99_RECENT `histogram_quantile(0.99, sum by (le) (rate(S_bucket[w])))`: one scrape has
  no rate, so the p99 of the cumulative buckets, since each pod started (the autoscaler
  wanting a recent p99 without Prometheus must difference two reads itself).
- SUM_NOW `sum(S)`: sum of the current samples.
- MAX_RATIO_NOW `max(S / (D > 0))`: largest ratio of one pod's samples with equal labels.
- MEAN_PER_POD_NOW `avg(sum by (namespace, pod) (S))`: per pod, the sum of the current
  samples; the mean over the pods that export S.
  Prometheus averages over the pods it scrapes, the direct read over the ready ones: a
  pod still loading its engine or draining counts in Prometheus (nothing is in progress
  while it loads), and not in the direct read.

Per object, `spec.monitoring.queries` may replace a row's PromQL (`Query.overridden`);
the direct read always applies the row's own form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from kubeinfer.contract import metric_series as series
from kubeinfer.operator.metrics_sources import samples
from kubeinfer.operator.metrics_sources.promql import (
    deployment_pod_regex,
    promql_string,
    substitute_placeholders,
)
from kubeinfer.operator.metrics_sources.samples import PodSamples
from kubeinfer.operator.state import names

Reduce = Callable[[Sequence[PodSamples]], float | None]
Labels = dict[str, str]


@dataclass(frozen=True)
class Scope:
    """The serving pods of one InferenceDeployment: its runtime Deployment's pods."""

    namespace: str
    owner: str

    @property
    def label_selector(self) -> str:
        """The serving pods' labels, as the direct read lists them (the Service's selector)."""
        return names.selector_string(names.serving_selector(self.owner))

    @property
    def pod_regex(self) -> str:
        """The same pods by name, as Prometheus selects their series."""
        return deployment_pod_regex(names.runtime_name(self.owner))

    def promql_labels(self, matchers: dict[str, str]) -> str:
        """`namespace=..., pod=~..., k="v"...`: the inside of a series selector."""
        parts = [
            f"namespace={promql_string(self.namespace)}",
            f"pod=~{promql_string(self.pod_regex)}",
            *(f"{key}={promql_string(value)}" for key, value in matchers.items()),
        ]
        return ",".join(parts)


@dataclass(frozen=True)
class Aggregation:
    """How a named query aggregates its series, in both forms. The template's fields:
    `{series}` the metric with its label selector, `{bucket}` the same for a histogram's
    `_bucket` series, `{denominator}` a second metric with the same selector, `{window}`
    seconds."""

    name: str
    promql: str
    direct: str
    reduce: Callable[[Sequence[PodSamples], str, str, Labels], float | None]
    """(pods, metric, the row's denominator (empty when it has none), label matchers) ->
    value: the direct read's form."""

    @property
    def windowed(self) -> bool:
        return "{window}" in self.promql


def _sum(pods: Sequence[PodSamples], metric: str, _: str, matchers: Labels) -> float | None:
    return samples.sum_of(pods, metric, matchers)


def _max(pods: Sequence[PodSamples], metric: str, _: str, matchers: Labels) -> float | None:
    return samples.max_of(pods, metric, matchers)


def _p99(pods: Sequence[PodSamples], metric: str, _: str, matchers: Labels) -> float | None:
    return samples.quantile_of(pods, 0.99, metric, matchers)


def _ratio(pods: Sequence[PodSamples], metric: str, den: str, matchers: Labels) -> float | None:
    return samples.max_ratio_of(pods, metric, den, matchers)


def _mean(pods: Sequence[PodSamples], metric: str, _: str, matchers: Labels) -> float | None:
    return samples.mean_per_pod_of(pods, metric, matchers)


SUM_SO_FAR = Aggregation(
    "SUM_SO_FAR", "sum(max_over_time({series}[{window}s]))",
    "sum of the pods' current samples", _sum,
)  # fmt: skip
MAX_SO_FAR = Aggregation(
    "MAX_SO_FAR", "max(max_over_time({series}[{window}s]))",
    "largest of the pods' current samples", _max,
)  # fmt: skip
P99_SO_FAR = Aggregation(
    "P99_SO_FAR", "histogram_quantile(0.99, sum by (le) (max_over_time({bucket}[{window}s])))",
    "buckets summed over pods and series, then Prometheus' interpolation", _p99,
)  # fmt: skip
P99_RECENT = Aggregation(
    "P99_RECENT", "histogram_quantile(0.99, sum by (le) (rate({bucket}[{window}s])))",
    "a single scrape has no rate: the p99 of the cumulative buckets summed over pods, "
    "i.e. since each pod started. The same figure as PromQL's for one pod whose every "
    "observation is inside the window; over several pods rate() extrapolates each pod's "
    "series by its own scrape phase, so the two differ by a few percent", _p99,
)  # fmt: skip
SUM_NOW = Aggregation(
    "SUM_NOW", "sum({series})", "sum of the pods' current samples", _sum,
)  # fmt: skip
MAX_RATIO_NOW = Aggregation(
    "MAX_RATIO_NOW", "max({series} / ({denominator} > 0))",
    "largest ratio of one pod's samples with equal labels (a zero denominator is skipped)",
    _ratio,
)  # fmt: skip
MEAN_PER_POD_NOW = Aggregation(
    "MEAN_PER_POD_NOW",
    "avg(sum by (namespace, pod) ({series}))",
    "per pod, the sum of the metric's current samples; the mean over the pods that export "
    "it", _mean,
)  # fmt: skip


@dataclass(frozen=True)
class Query:
    """A named query bound to a scope and its arguments: ready for either source."""

    name: str
    scope: Scope
    promql: str
    reduce: Reduce = field(compare=False)
    """The direct read's form, over the scope's pods' samples."""
    overridden_by: str = ""
    """The object's field whose PromQL replaced the row's (`overridden`); empty for the
    row's own. Errors name it: a broken override is the object's to fix."""

    @property
    def label(self) -> str:
        """How messages name this query: its name, or with an override its name and
        `(PromQL of spec.monitoring.queries.<field>)`."""
        return f"{self.name} (PromQL of {self.overridden_by})" if self.overridden_by else self.name

    def overridden(self, template: str, field_path: str) -> Query:
        """This query with PromQL `template` from the object's field `field_path`, its
        `$namespace` and `$pods` replaced by the scope's namespace and pod regex
        (`promql.substitute_placeholders`); the direct read's form is kept."""
        promql = substitute_placeholders(
            template, namespace=self.scope.namespace, pods=self.scope.pod_regex
        )
        return replace(self, promql=promql, overridden_by=field_path)


@dataclass(frozen=True)
class NamedQuery:
    """One row of the table."""

    name: str
    meaning: str
    metric: str
    aggregation: Aggregation
    matchers: tuple[tuple[str, str], ...] = ()
    """Fixed label matchers (e.g. outcome="compared")."""
    per_candidate: bool = False
    """Selects the series of one shadow candidate (labels `candidate_digest` and
    `role="shadow"`)."""
    denominator: str = ""
    """The second metric of a ratio (MAX_RATIO_NOW)."""

    def bind(
        self, scope: Scope, *, window_seconds: int = 0, candidate_digest: str | None = None
    ) -> Query:
        """This query over `scope`; `window_seconds` for the windowed aggregations (whole
        seconds, at least 1), `candidate_digest` for the per-candidate ones."""
        if self.aggregation.windowed and window_seconds < 1:
            raise ValueError(f"query {self.name} needs a window of at least 1 second")
        matchers = dict(self.matchers)
        if self.per_candidate:
            if candidate_digest is None:
                raise ValueError(f"query {self.name} needs a candidate_digest")
            matchers["candidate_digest"] = candidate_digest
            matchers["role"] = "shadow"  # a quality watch's reference has series too
        labels = scope.promql_labels(matchers)
        promql = self.aggregation.promql.format(
            series=f"{self.metric}{{{labels}}}",
            bucket=f"{self.metric}_bucket{{{labels}}}",
            denominator=f"{self.denominator}{{{labels}}}",
            window=int(window_seconds),
        )
        aggregation, metric, denominator = self.aggregation, self.metric, self.denominator

        def reduce(pods: Sequence[PodSamples]) -> float | None:
            return aggregation.reduce(pods, metric, denominator, matchers)

        return Query(self.name, scope, promql, reduce)


# The table. Shadow rows: the serving pods' view of one candidate (its engine digest) since
# its shadow started; every shadow series also carries model, serving_version and
# candidate_version, which the digest makes redundant here.
SHADOW_COMPARED = NamedQuery(
    "shadow_compared", "Mirrored requests whose answers were compared (mismatches included).",
    series.SHADOW_REQUESTS.total, SUM_SO_FAR, (("outcome", "compared"),), per_candidate=True,
)  # fmt: skip
SHADOW_MISMATCHES = NamedQuery(
    "shadow_mismatches", "Compared requests whose outputs differed in name, shape or datatype.",
    series.SHADOW_MISMATCHES.total, SUM_SO_FAR, per_candidate=True,
)  # fmt: skip
SHADOW_DROPPED = NamedQuery(
    "shadow_dropped", "Requests the mirror could not take (its queue was full).",
    series.SHADOW_REQUESTS.total, SUM_SO_FAR, (("outcome", "dropped"),), per_candidate=True,
)  # fmt: skip
SHADOW_CANDIDATE_ERRORS = NamedQuery(
    "shadow_candidate_errors", "Mirrored requests the candidate answered with an error.",
    series.SHADOW_REQUESTS.total, SUM_SO_FAR, (("outcome", "candidate_error"),),
    per_candidate=True,
)  # fmt: skip
SHADOW_TIMEOUTS = NamedQuery(
    "shadow_timeouts", "Mirrored requests the candidate did not answer within the timeout.",
    series.SHADOW_REQUESTS.total, SUM_SO_FAR, (("outcome", "timeout"),), per_candidate=True,
)  # fmt: skip
SHADOW_MAX_ABS_DIFFERENCE = NamedQuery(
    "shadow_max_abs_difference", "Largest absolute difference of one output element.",
    series.SHADOW_MAX_ABS_DIFFERENCE.name, MAX_SO_FAR, per_candidate=True,
)  # fmt: skip
SHADOW_TOP1_ROWS = NamedQuery(
    "shadow_top1_rows", "Rows of classification-shaped outputs compared.",
    series.SHADOW_TOP1_ROWS.total, SUM_SO_FAR, per_candidate=True,
)  # fmt: skip
SHADOW_TOP1_AGREEMENTS = NamedQuery(
    "shadow_top1_agreements", "Of those rows, the ones whose argmax agreed.",
    series.SHADOW_TOP1_AGREEMENTS.total, SUM_SO_FAR, per_candidate=True,
)  # fmt: skip
SHADOW_SERVING_P99 = NamedQuery(
    "shadow_serving_p99_seconds", "p99 of the serving runtime's time on mirrored requests.",
    series.SHADOW_SERVING_DURATION.name, P99_SO_FAR, per_candidate=True,
)  # fmt: skip
SHADOW_CANDIDATE_P99 = NamedQuery(
    "shadow_candidate_p99_seconds", "p99 of the candidate's own time on the same requests.",
    series.SHADOW_CANDIDATE_DURATION.name, P99_SO_FAR, per_candidate=True,
)  # fmt: skip

# General rows, for the status and the autoscaler.
REQUEST_P99 = NamedQuery(
    "request_p99_seconds",
    "p99 of the serving pods' inference request time, arrival to response, over the "
    "window (PromQL) or since each pod started (direct read).",
    series.REQUEST_DURATION.name, P99_RECENT,
)  # fmt: skip
QUEUE_DEPTH = NamedQuery(
    "queue_depth", "Requests waiting in the batch queues of all serving pods, now.",
    series.QUEUE_DEPTH.name, SUM_NOW,
)  # fmt: skip
REQUESTS_ANSWERED = NamedQuery(
    "requests_answered",
    "Inference requests the serving pods answered, summed over them, now: with "
    "autoscaling.minReplicas 0, its changes are the activity the idle window watches.",
    series.REQUESTS.total, SUM_NOW,
)  # fmt: skip
REQUESTS_IN_PROGRESS_PER_REPLICA = NamedQuery(
    "requests_in_progress_per_replica",
    "Requests received and not yet answered (queued, running, or waiting on the runtime's "
    "event loop) per serving pod, now: the autoscaler's load signal (override: "
    "spec.monitoring.queries.requestsInProgressPerReplica).",
    series.REQUESTS_IN_PROGRESS.name, MEAN_PER_POD_NOW,
)  # fmt: skip
GPU_MEMORY_USED_RATIO = NamedQuery(
    "gpu_memory_used_ratio",
    "Fullest GPU's memory in use, as a share of its total, over every serving pod and "
    "device (none without a GPU): the autoscaler's memory pressure signal (override: "
    "spec.monitoring.queries.gpuMemoryUsedRatio).",
    series.GPU_MEMORY_USED.name, MAX_RATIO_NOW,
    denominator=series.GPU_MEMORY_TOTAL.name,
)  # fmt: skip

SHADOW_QUERIES: tuple[NamedQuery, ...] = (
    SHADOW_COMPARED, SHADOW_MISMATCHES, SHADOW_DROPPED, SHADOW_CANDIDATE_ERRORS,
    SHADOW_TIMEOUTS, SHADOW_MAX_ABS_DIFFERENCE, SHADOW_TOP1_ROWS, SHADOW_TOP1_AGREEMENTS,
    SHADOW_SERVING_P99, SHADOW_CANDIDATE_P99,
)  # fmt: skip
GENERAL_QUERIES: tuple[NamedQuery, ...] = (
    REQUEST_P99, QUEUE_DEPTH, REQUESTS_IN_PROGRESS_PER_REPLICA, GPU_MEMORY_USED_RATIO,
)  # fmt: skip
NAMED_QUERIES: dict[str, NamedQuery] = {
    query.name: query for query in (*SHADOW_QUERIES, *GENERAL_QUERIES)
}
"""Every named query, by name."""


# -- grouped queries: one figure per label value -------------------------------------------
#
# The quality watch needs a figure per reference class and per slice, and a sliding
# window over counters. The window's PromQL, per series S (w the window, m the margin):
#
#     last_over_time(S[w]) - last_over_time(S[m] offset w)    its growth since its last
#         unless resets(S[w+m]) > 0                            sample at or before the
#                                                              window's start, unless it
#                                                              reset since
#     or last_over_time(S[w])                                  else its current value
#
# The second line counts a series with no sample just before the window (a new pod, a
# class first seen inside the window) or one that reset (a restarted container) from
# zero, which is what it counted since it (re)started. Neither `increase()` nor
# `max_over_time - min_over_time` does: both lose a new series' first sample (the counts
# made before its first scrape), and `increase()` also extrapolates to the window's edges,
# which gives counts that are not whole numbers and differ from the direct read's.
# Its error: the window runs from the last scrape at or before its start to the last
# scrape before now, so it is shifted by up to one scrape interval; a series whose last
# sample before the window is older than the margin (a scrape gap longer than m) counts
# all its counts since its pod started; a reset loses what the series counted inside the
# window before it, and a reset in the margin just before the window adds the counts
# between it and the window's start. A pod gone inside the window still counts up to its
# last scrape (the series keeps its samples), as in the shadow's "so far" figures.
#
# The direct read has one scrape and no window: its form is each pod's current value,
# since the pod started, and the caller differences reads itself (`metrics.quality`).

WINDOW_BASE_MARGIN_SECONDS = 60
"""How far before the window's start a series' last sample may lie and still be its value
there: two scrape intervals of the common 30 s."""

GROWTH_IN_WINDOW_BY = (
    "sum by ({by}) ("
    "(last_over_time({series}[{window}s]) - last_over_time({series}[{margin}s] offset {window}s)"
    " unless resets({series}[{window_and_margin}s]) > 0)"
    " or last_over_time({series}[{window}s]))"
)
"""A counter's growth over the window per series, summed by the `{by}` labels (the
comment above says why this form)."""

GroupedReduce = Callable[[Sequence[PodSamples]], dict[tuple[str, ...], float]]


@dataclass(frozen=True)
class GroupedQuery:
    """A query answered with one figure per combination of its `by` labels' values
    (PromQL's `sum by`), bound to a scope: ready for either source's `evaluate_grouped`."""

    name: str
    scope: Scope
    by: tuple[str, ...]
    promql: str
    reduce: GroupedReduce = field(compare=False)
    """The direct read's form, over the scope's pods' samples."""

    @property
    def label(self) -> str:
        """How messages name this query."""
        return self.name


@dataclass(frozen=True)
class GroupedNamedQuery:
    """One row of the grouped table: a mirror counter's growth over a window, per pod and
    per value of `group_label`; the direct read's form is its current value per pod and
    value, since each pod started."""

    name: str
    meaning: str
    metric: str
    group_label: str = ""
    """The label the figure is split by besides the pod; empty for none."""
    outcome: str = ""
    """Counts only the series of this `outcome` (the mirror's requests); empty: every
    series."""

    @property
    def by(self) -> tuple[str, ...]:
        return (samples.POD_LABEL, self.group_label) if self.group_label else (samples.POD_LABEL,)

    def bind(
        self, scope: Scope, *, window_seconds: int, candidate_digest: str, role: str
    ) -> GroupedQuery:
        """This row over `scope`'s series of the mirror target `candidate_digest` in `role`
        (`shadow` or `quality`), over a window of `window_seconds` (whole seconds, at
        least 1)."""
        if window_seconds < 1:
            raise ValueError(f"query {self.name} needs a window of at least 1 second")
        matchers = {"candidate_digest": candidate_digest, "role": role}
        if self.outcome:
            matchers["outcome"] = self.outcome
        by, metric = self.by, self.metric
        promql = GROWTH_IN_WINDOW_BY.format(
            by=", ".join(by),
            series=f"{metric}{{{scope.promql_labels(matchers)}}}",
            window=int(window_seconds),
            margin=WINDOW_BASE_MARGIN_SECONDS,
            window_and_margin=int(window_seconds) + WINDOW_BASE_MARGIN_SECONDS,
        )

        def reduce(pods: Sequence[PodSamples]) -> dict[tuple[str, ...], float]:
            return samples.sum_by(pods, metric, matchers, by)

        return GroupedQuery(self.name, scope, by, promql, reduce)


# The quality watch's rows: the serving pods' comparisons with the watch's reference
# (`candidate_digest` is the reference engine's digest, `role` is `quality`).
QUALITY_TOP1_ROWS = GroupedNamedQuery(
    "quality_top1_rows", "Rows compared with the reference (argmax over the last axis).",
    series.SHADOW_TOP1_ROWS.total,
)  # fmt: skip
QUALITY_TOP1_AGREEMENTS = GroupedNamedQuery(
    "quality_top1_agreements", "Of those rows, the ones whose argmax agreed.",
    series.SHADOW_TOP1_AGREEMENTS.total,
)  # fmt: skip
QUALITY_DIFFERENCE_SUM = GroupedNamedQuery(
    "quality_abs_difference_sum",
    "Sum over compared requests of each one's largest element difference.",
    f"{series.SHADOW_ABS_DIFFERENCE.name}_sum",
)  # fmt: skip
QUALITY_DIFFERENCE_COUNT = GroupedNamedQuery(
    "quality_abs_difference_count", "Compared requests with a difference observed.",
    f"{series.SHADOW_ABS_DIFFERENCE.name}_count",
)  # fmt: skip
QUALITY_KL_SUM = GroupedNamedQuery(
    "quality_kl_divergence_sum",
    "Sum over compared requests of each one's mean KL(reference || serving), in nats.",
    f"{series.SHADOW_KL_DIVERGENCE.name}_sum",
)  # fmt: skip
QUALITY_KL_COUNT = GroupedNamedQuery(
    "quality_kl_divergence_count", "Compared requests with a KL divergence observed.",
    f"{series.SHADOW_KL_DIVERGENCE.name}_count",
)  # fmt: skip
QUALITY_CLASS_TOP1_ROWS = GroupedNamedQuery(
    "quality_class_top1_rows", "Compared rows, by the reference's top-1 class.",
    series.SHADOW_CLASS_TOP1_ROWS.total, "reference_class",
)  # fmt: skip
QUALITY_CLASS_TOP1_AGREEMENTS = GroupedNamedQuery(
    "quality_class_top1_agreements", "Of those, the rows whose argmax agreed, by class.",
    series.SHADOW_CLASS_TOP1_AGREEMENTS.total, "reference_class",
)  # fmt: skip
QUALITY_SLICE_TOP1_ROWS = GroupedNamedQuery(
    "quality_slice_top1_rows", "Compared rows, by the request's slice.",
    series.SHADOW_SLICE_TOP1_ROWS.total, "slice",
)  # fmt: skip
QUALITY_SLICE_TOP1_AGREEMENTS = GroupedNamedQuery(
    "quality_slice_top1_agreements", "Of those, the rows whose argmax agreed, by slice.",
    series.SHADOW_SLICE_TOP1_AGREEMENTS.total, "slice",
)  # fmt: skip

QUALITY_REQUESTS_SAMPLED = GroupedNamedQuery(
    "quality_requests_sampled", "Answered requests sampled for the reference, whatever "
    "became of them.", series.SHADOW_REQUESTS.total,
)  # fmt: skip
QUALITY_REQUESTS_COMPARED = GroupedNamedQuery(
    "quality_requests_compared", "Of those, the ones compared (not dropped, failed or late).",
    series.SHADOW_REQUESTS.total, outcome="compared",
)  # fmt: skip

QUALITY_QUERIES: tuple[GroupedNamedQuery, ...] = (
    QUALITY_TOP1_ROWS, QUALITY_TOP1_AGREEMENTS, QUALITY_DIFFERENCE_SUM,
    QUALITY_DIFFERENCE_COUNT, QUALITY_KL_SUM, QUALITY_KL_COUNT, QUALITY_CLASS_TOP1_ROWS,
    QUALITY_CLASS_TOP1_AGREEMENTS, QUALITY_SLICE_TOP1_ROWS, QUALITY_SLICE_TOP1_AGREEMENTS,
    QUALITY_REQUESTS_SAMPLED, QUALITY_REQUESTS_COMPARED,
)  # fmt: skip
