"""The running aggregates of one mirror target, and the mirror metrics that export them.

`ShadowMetrics` holds the metric families (names and meanings: the series in
`kubeinfer.contract.metric_series`), registered once in the app's registry. `RunningAggregates`
is one candidate's tally: every outcome, comparison and latency is recorded in it and, at
the same time, in that candidate's series of the families, so `GET /v2/shadow` (its
`status()`) and `/metrics` say the same thing. When the candidate goes (another target,
or none), `close()` removes its series: a new candidate starts from zero and never
inherits another's figures. Every series carries the target's `role` (`MIRROR_ROLES`):
`shadow` for a candidate, `quality` for a quality watch's reference
(`kubeinfer.runtime.shadow.quality`, which adds slices and exemplars), so both can run at
once, even against the same engine, without mixing.

Besides the /v2/shadow figures, each compared request's top-1 rows are tallied by the
trusted side's class (`kubeinfer_shadow_class_top1_*`, label `reference_class`; the first
`MAX_CLASS_LABELS` classes seen by name, later ones as `other`, so a vocabulary-sized
output cannot grow the series without bound) and its mean KL divergence is observed
(`kubeinfer_shadow_kl_divergence`).

The /v2/shadow figures are defined over what the metrics carry: `meanAbsDifference` and
`meanCosineSimilarity` are the means of the per-request values the two histograms observe
(their `_sum / _count`), `maxAbsDifference` is the gauge, and the p99s come from the
duration histograms' buckets through `histogram_quantile`, as Prometheus would compute
them. `minCosineSimilarity` (the worst row seen) is the one figure kept here only.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

from kubeinfer.contract import metric_series as series
from kubeinfer.contract.metric_series import OTHER_SLICE, SHADOW_LATENCY_BUCKETS, histogram_quantile
from kubeinfer.contract.metric_series import SHADOW_OUTCOMES as OUTCOMES
from kubeinfer.contract.runtime_config import MirrorTarget
from kubeinfer.runtime.exported_series import family
from kubeinfer.runtime.shadow.comparison import Outputs, RequestComparison, Trusted
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MAX_CLASS_LABELS = 1024
"""Distinct `reference_class` values tallied by name per target; later ones count as
`other` (`OTHER_SLICE`'s word)."""

OUTCOME_KEYS = {
    # outcome label -> the key /v2/shadow and /v2/quality count it under
    "compared": "compared",
    "dropped": "dropped",
    "candidate_error": "candidateError",
    "timeout": "timeout",
}


class ShadowMetrics:
    """The shadow metric families of one app; series are added per candidate."""

    def __init__(
        self,
        registry: CollectorRegistry,
        make: Callable[[series.Series, CollectorRegistry], Any] = family,
    ) -> None:
        """`make` makes each family (a prometheus_client one in `registry` by default; the
        Rust data plane's are its server's, `kubeinfer.runtime.rust_mirroring`)."""
        r = registry
        self.requests = make(series.SHADOW_REQUESTS, r)
        self.mismatches = make(series.SHADOW_MISMATCHES, r)
        self.max_abs_difference = make(series.SHADOW_MAX_ABS_DIFFERENCE, r)
        self.abs_difference = make(series.SHADOW_ABS_DIFFERENCE, r)
        self.cosine_similarity = make(series.SHADOW_COSINE_SIMILARITY, r)
        self.top1_rows = make(series.SHADOW_TOP1_ROWS, r)
        self.top1_agreements = make(series.SHADOW_TOP1_AGREEMENTS, r)
        self.serving_duration = make(series.SHADOW_SERVING_DURATION, r)
        self.candidate_duration = make(series.SHADOW_CANDIDATE_DURATION, r)
        self.class_rows = make(series.SHADOW_CLASS_TOP1_ROWS, r)
        self.class_agreements = make(series.SHADOW_CLASS_TOP1_AGREEMENTS, r)
        self.slice_rows = make(series.SHADOW_SLICE_TOP1_ROWS, r)
        self.slice_agreements = make(series.SHADOW_SLICE_TOP1_AGREEMENTS, r)
        self.kl_divergence = make(series.SHADOW_KL_DIVERGENCE, r)

    def remove(
        self, values: tuple[str, ...], classes: Iterable[str] = (), slices: Iterable[str] = ()
    ) -> None:
        """Removes every series of one target (`values` in `SHADOW_LABELS` order), its
        `classes` and `slices` included."""
        for outcome in OUTCOMES:
            _remove(self.requests, (*values, outcome))
        for metric in (
            self.mismatches, self.max_abs_difference, self.abs_difference,
            self.cosine_similarity, self.top1_rows, self.top1_agreements,
            self.serving_duration, self.candidate_duration, self.kl_divergence,
        ):  # fmt: skip
            _remove(metric, values)
        for label in classes:
            _remove(self.class_rows, (*values, label))
            _remove(self.class_agreements, (*values, label))
        for label in slices:
            _remove(self.slice_rows, (*values, label))
            _remove(self.slice_agreements, (*values, label))


def _remove(family: Counter | Gauge | Histogram, values: tuple[str, ...]) -> None:
    try:
        family.remove(*values)
    except KeyError:  # never created (the gauge before the first comparison)
        pass


class _LatencyBuckets:
    """Counts per `SHADOW_LATENCY_BUCKETS` bucket (the histogram's, kept here too so the
    p99 needs no scrape), with Prometheus' `le` rule: a value lands in the first bucket
    whose bound is at least the value."""

    def __init__(self) -> None:
        self._counts = [0] * (len(SHADOW_LATENCY_BUCKETS) + 1)

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(SHADOW_LATENCY_BUCKETS, seconds)] += 1

    def quantile(self, q: float) -> float | None:
        cumulative, total = [], 0
        for bound, count in zip((*SHADOW_LATENCY_BUCKETS, float("inf")), self._counts, strict=True):
            total += count
            cumulative.append((bound, float(total)))
        return histogram_quantile(q, cumulative)


class _Tally:
    """Top-1 rows and agreements of one class or slice, in memory and in its two series."""

    __slots__ = ("_agreements_series", "_rows_series", "agreements", "rows")

    def __init__(self, rows_series: Counter, agreements_series: Counter) -> None:
        self.rows = self.agreements = 0
        self._rows_series, self._agreements_series = rows_series, agreements_series

    def add(self, rows: int, agreements: int) -> None:
        self.rows += rows
        self.agreements += agreements
        self._rows_series.inc(rows)
        self._agreements_series.inc(agreements)

    def status(self) -> dict[str, Any]:
        agreement = self.agreements / self.rows if self.rows else None
        return {"rows": self.rows, "agreements": self.agreements, "agreement": agreement}


class RunningAggregates:
    """One target's figures since it was read (see the module)."""

    trusted: Trusted = "serving"
    """Whose answer the comparison trusts: the serving engine's, judging a candidate."""
    per_row: bool = False
    """Whether the comparison computes per row figures (the quality watch's exemplars)."""

    def __init__(
        self,
        target: MirrorTarget,
        model: str,
        serving_version: str,
        metrics: ShadowMetrics,
        role: str = "shadow",
    ) -> None:
        self.target = target
        self.serving_version = serving_version
        self.role = role
        self._metrics = metrics
        self._values = (
            model, serving_version, target.candidate_version, target.candidate_digest, role,
        )  # fmt: skip
        v = self._values
        self._outcome_series = {o: metrics.requests.labels(*v, o) for o in OUTCOMES}
        self._mismatch_series = metrics.mismatches.labels(*v)
        self._difference_series = metrics.abs_difference.labels(*v)
        self._cosine_series = metrics.cosine_similarity.labels(*v)
        self._rows_series = metrics.top1_rows.labels(*v)
        self._agreements_series = metrics.top1_agreements.labels(*v)
        self._serving_series = metrics.serving_duration.labels(*v)
        self._candidate_series = metrics.candidate_duration.labels(*v)
        self._kl_series = metrics.kl_divergence.labels(*v)
        self._closed = False
        self.answered = 0
        """Requests answered 200 offered while this target was mirrored to (sampled or not)."""
        self.classes: dict[str, _Tally] = {}
        self.slices: dict[str, _Tally] = {}
        self._sum_kl = 0.0
        self._kl_requests = 0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.mismatches = 0
        self.max_abs_difference: float | None = None
        self._sum_difference = 0.0
        self._min_cosine: float | None = None
        self._sum_cosine = 0.0
        self._valued = 0  # compared requests that were not mismatches
        self.top1_rows = 0
        self.top1_agreements = 0
        self._serving = _LatencyBuckets()
        self._candidate = _LatencyBuckets()

    @property
    def labels(self) -> tuple[str, ...]:
        return self._values

    def record_outcome(self, outcome: str) -> None:
        """A sampled request that was not compared: `dropped`, `candidate_error`, `timeout`."""
        if self._closed:
            return
        self.outcomes[outcome] += 1
        self._outcome_series[outcome].inc()

    def record_comparison(
        self,
        comparison: RequestComparison,
        serving_seconds: float,
        candidate_seconds: float,
        *,
        slice_value: str | None = None,
        inputs: Outputs | None = None,
    ) -> None:
        """A compared request: its comparison and both sides' server times (`slice_value`,
        the raw slice header, and `inputs` serve the quality watch's subclass)."""
        if self._closed:
            return
        self.outcomes["compared"] += 1
        self._outcome_series["compared"].inc()
        self._serving.observe(serving_seconds)
        self._serving_series.observe(serving_seconds)
        self._candidate.observe(candidate_seconds)
        self._candidate_series.observe(candidate_seconds)
        if comparison.mismatch is not None:
            self.mismatches += 1
            self._mismatch_series.inc()
            return
        self._valued += 1
        difference = comparison.max_abs_difference
        self._sum_difference += difference
        self._difference_series.observe(difference)
        if self.max_abs_difference is None or difference > self.max_abs_difference:
            self.max_abs_difference = difference
            self._metrics.max_abs_difference.labels(*self._values).set(difference)
        cosine = comparison.min_cosine
        self._sum_cosine += cosine
        self._cosine_series.observe(cosine)
        if self._min_cosine is None or cosine < self._min_cosine:
            self._min_cosine = cosine
        if comparison.top1_rows:
            self.top1_rows += comparison.top1_rows
            self.top1_agreements += comparison.top1_agreements
            self._rows_series.inc(comparison.top1_rows)
            self._agreements_series.inc(comparison.top1_agreements)
        for label, rows, agreements in comparison.class_tallies:
            self._class_tally(label).add(rows, agreements)
        if comparison.kl_divergence is not None:
            self._sum_kl += comparison.kl_divergence
            self._kl_requests += 1
            self._kl_series.observe(comparison.kl_divergence)

    @property
    def mean_kl_divergence(self) -> float | None:
        return self._sum_kl / self._kl_requests if self._kl_requests else None

    def _class_tally(self, label: int | str) -> _Tally:
        name = str(label)
        tally = self.classes.get(name)
        if tally is None:
            if len(self.classes) >= MAX_CLASS_LABELS and name not in self.classes:
                name = OTHER_SLICE
                tally = self.classes.get(name)
            if tally is None:
                m, v = self._metrics, self._values
                tally = _Tally(m.class_rows.labels(*v, name), m.class_agreements.labels(*v, name))
                self.classes[name] = tally
        return tally

    def slice_tally(self, name: str) -> _Tally:
        """The tally of one (already bounded) slice name, made on first use."""
        tally = self.slices.get(name)
        if tally is None:
            m, v = self._metrics, self._values
            tally = _Tally(m.slice_rows.labels(*v, name), m.slice_agreements.labels(*v, name))
            self.slices[name] = tally
        return tally

    def close(self) -> None:
        """Removes this candidate's series; later records are ignored."""
        if not self._closed:
            self._closed = True
            self._metrics.remove(self._values, self.classes, self.slices)

    def status(self) -> dict[str, Any]:
        """The `GET /v2/shadow` body for this candidate (null where there is no data)."""
        valued = self._valued
        target = self.target
        return {
            "active": True,
            "servingVersion": self.serving_version,
            "candidate": {
                "url": target.url,
                "modelName": target.model_name,
                "version": target.candidate_version,
                "digest": target.candidate_digest,
            },
            "trafficPercent": target.traffic_percent,
            "requests": {OUTCOME_KEYS[o]: n for o, n in self.outcomes.items()},
            "mismatches": self.mismatches,
            "maxAbsDifference": self.max_abs_difference,
            "meanAbsDifference": self._sum_difference / valued if valued else None,
            "minCosineSimilarity": self._min_cosine,
            "meanCosineSimilarity": self._sum_cosine / valued if valued else None,
            "top1": {
                "rows": self.top1_rows,
                "agreements": self.top1_agreements,
                "agreement": self.top1_agreements / self.top1_rows if self.top1_rows else None,
            },
            "latency": {
                "servingP99Seconds": self._serving.quantile(0.99),
                "candidateP99Seconds": self._candidate.quantile(0.99),
            },
        }


def inactive_status(serving_version: str) -> dict[str, Any]:
    """The `GET /v2/shadow` body while nothing is mirrored."""
    return {
        "active": False,
        "servingVersion": serving_version,
        "candidate": None,
        "trafficPercent": None,
        "requests": dict.fromkeys(OUTCOME_KEYS.values(), 0),
        "mismatches": 0,
        "maxAbsDifference": None,
        "meanAbsDifference": None,
        "minCosineSimilarity": None,
        "meanCosineSimilarity": None,
        "top1": {"rows": 0, "agreements": 0, "agreement": None},
        "latency": {"servingP99Seconds": None, "candidateP99Seconds": None},
    }
