"""The runtime pods' current samples, and the reductions the direct read applies to them.
Pure: parsing is `prometheus_client`'s own parser, the quantile Prometheus' estimator (the
one the runtime uses too, `kubeinfer.contract.metric_series.histogram_quantile`).

Each reduction is the direct read's form of one PromQL aggregation in
`kubeinfer.operator.metrics_sources.queries`: the same series (by name and exact labels), reduced
the same way over every pod, so the two sources answer the same question.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubeinfer.contract.metric_series import histogram_quantile
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

Matchers = Mapping[str, str]


@dataclass(frozen=True)
class PodSamples:
    """Every sample one pod's /metrics answered, in one scrape."""

    pod: str
    samples: tuple[Sample, ...]


def parse_exposition(pod: str, text: str) -> PodSamples:
    """Parses a Prometheus text exposition; raises ValueError on a malformed one."""
    return PodSamples(
        pod,
        tuple(
            sample for family in text_string_to_metric_families(text) for sample in family.samples
        ),
    )


def matching(pods: Iterable[PodSamples], name: str, matchers: Matchers) -> list[Sample]:
    """Samples of series `name` whose labels include every matcher (PromQL's `=`)."""
    return [
        sample
        for pod in pods
        for sample in pod.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in matchers.items())
    ]


def sum_of(pods: Sequence[PodSamples], name: str, matchers: Matchers) -> float | None:
    """PromQL `sum(...)`: None (an empty result) when no series matches."""
    found = matching(pods, name, matchers)
    return sum(sample.value for sample in found) if found else None


def max_of(pods: Sequence[PodSamples], name: str, matchers: Matchers) -> float | None:
    """PromQL `max(...)`: None when no series matches."""
    found = matching(pods, name, matchers)
    return max(sample.value for sample in found) if found else None


def quantile_of(
    pods: Sequence[PodSamples], q: float, histogram: str, matchers: Matchers
) -> float | None:
    """PromQL `histogram_quantile(q, sum by (le) (<histogram>_bucket{...}))`: each bucket
    summed over pods and series, then Prometheus' linear interpolation."""
    summed: dict[float, float] = {}
    for sample in matching(pods, f"{histogram}_bucket", matchers):
        bound = float(sample.labels["le"])
        summed[bound] = summed.get(bound, 0.0) + sample.value
    return histogram_quantile(q, list(summed.items())) if summed else None


def max_ratio_of(
    pods: Sequence[PodSamples], numerator: str, denominator: str, matchers: Matchers
) -> float | None:
    """PromQL `max(<numerator>{...} / <denominator>{...})`: the division pairs series of the
    same pod with the same labels (one-to-one matching); a zero denominator gives no ratio
    here, where Prometheus gives +Inf or NaN, neither of which is a usable reading."""
    ratios = []
    for pod in pods:
        totals = {
            frozenset(sample.labels.items()): sample.value
            for sample in matching([pod], denominator, matchers)
        }
        for sample in matching([pod], numerator, matchers):
            total = totals.get(frozenset(sample.labels.items()))
            if total:
                ratios.append(sample.value / total)
    return max(ratios) if ratios else None


def mean_per_pod_of(pods: Sequence[PodSamples], name: str, matchers: Matchers) -> float | None:
    """PromQL `avg(sum by (namespace, pod) (<name>{...}))`: per pod, the sum of its samples
    of series `name` (whatever other labels they carry); the mean over the pods that have
    one (a pod without the series is not in the `sum by` result, so not in the mean); None
    when none has."""
    totals = [
        sum(sample.value for sample in found)
        for pod in pods
        if (found := matching([pod], name, matchers))
    ]
    return sum(totals) / len(totals) if totals else None


POD_LABEL = "pod"
"""The label Prometheus' scrape attaches with the pod's name; in a direct read, the pod the
samples came from."""


def sum_by(
    pods: Sequence[PodSamples], name: str, matchers: Matchers, by: Sequence[str]
) -> dict[tuple[str, ...], float]:
    """PromQL `sum by (<by>) (<name>{...})`: one sum per combination of the `by` labels'
    values (a label a series lacks counts as "", as in PromQL); `pod` is the pod the
    samples came from, as Prometheus labels them. Empty when no series matches."""
    sums: dict[tuple[str, ...], float] = {}
    for pod in pods:
        for sample in matching([pod], name, matchers):
            key = tuple(
                pod.pod if label == POD_LABEL else sample.labels.get(label, "") for label in by
            )
            sums[key] = sums.get(key, 0.0) + sample.value
    return sums
