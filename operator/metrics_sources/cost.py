"""`read_inferences`: the inferences each priced serving pod answered over the cost's
window (`kubeinfer_requests_total{code="200"}`, `kubeinfer.contract.cost`), from either
metrics source.

Prometheus keeps the past: each pod's counter's growth over the window, the form the
dashboard's panel uses (`contract.cost.GROWTH_IN_WINDOW_BY`), of the pods named (those the
operator priced: the regex names them, so a mixed fleet's pods count as the others). The
direct read sees each ready pod's count since it started, so the window comes from earlier
reads the controller keeps (`CostHistory.snapshots`), with the quality watch's rules
(`metrics_sources.quality`): a pod's count is its latest read less its read at the window's
base (the latest snapshot at or before the window's start), all of it where the base does
not have the pod or its count went down since (a restart); a pod gone keeps its last read.
Until the snapshots span the window, the counts cover less, and the reading says how much
(`covered_seconds`): the cost then covers the same seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import pairwise

from kubeinfer.contract import cost
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.metrics_sources import samples
from kubeinfer.operator.metrics_sources.promql import promql_string, re2_escape
from kubeinfer.operator.metrics_sources.queries import GroupedQuery, Scope
from kubeinfer.operator.metrics_sources.samples import PodSamples
from kubeinfer.operator.metrics_sources.source import MetricsSource, MetricsUnavailable
from kubeinfer.operator.state.cost_readings import CostReading, InferenceSnapshot

SNAPSHOTS_PER_WINDOW = 30
"""How many snapshots a direct read's history keeps per window (as the quality watch's)."""
ANSWERED = {"code": cost.ANSWERED_CODE}


def inferences_query(scope: Scope, pods: Sequence[str], window_seconds: int) -> GroupedQuery:
    """The answered requests of `pods` (in `scope`'s namespace) over the window, by pod."""
    regex = "|".join(re2_escape(pod) for pod in sorted(pods))
    selector = (
        f"{series.REQUESTS.total}{{namespace={promql_string(scope.namespace)},"
        f"pod=~{promql_string(regex)},code={promql_string(cost.ANSWERED_CODE)}}}"
    )
    promql = cost.growth_in_window(selector, window_seconds, (samples.POD_LABEL,))

    def reduce(pods_samples: Sequence[PodSamples]) -> dict[tuple[str, ...], float]:
        return samples.sum_by(pods_samples, series.REQUESTS.total, ANSWERED, (samples.POD_LABEL,))

    return GroupedQuery("inferences_answered", scope, (samples.POD_LABEL,), promql, reduce)


async def read_inferences(
    source: MetricsSource,
    scope: Scope,
    pods: Sequence[str],
    window_seconds: int,
    now: datetime,
    snapshots: tuple[InferenceSnapshot, ...],
) -> tuple[CostReading, tuple[InferenceSnapshot, ...]]:
    """The inferences `pods` answered over the last `window_seconds` at `now`, and the
    snapshots to keep for the next call (the same when the source could not answer; none
    when it keeps the past itself). Never raises for the source: a source that cannot
    answer gives a reading with `error`."""
    if not pods:
        return CostReading({}, float(window_seconds)), snapshots
    try:
        (answer,) = await source.evaluate_grouped(
            [inferences_query(scope, pods, window_seconds)], now
        )
    except MetricsUnavailable as error:
        return CostReading(error=f"{source.description}: {error}"), snapshots
    by_pod = {key[0]: value for key, value in answer.items()}
    if source.answers_windows:
        counts, covered, snapshots = by_pod, float(window_seconds), ()
    else:
        snapshots = remember(snapshots, InferenceSnapshot(now, by_pod), window_seconds)
        counts, covered = window_counts(snapshots, now, window_seconds)
    wanted = set(pods)
    counts = {pod: value for pod, value in counts.items() if pod in wanted}
    wrong = sorted(p for p, value in counts.items() if not (math.isfinite(value) and value >= 0))
    if wrong:
        said = ", ".join(f"{pod} {counts[pod]:g}" for pod in wrong)
        return CostReading(error=f"{source.description} gave answered requests {said}"), snapshots
    return CostReading(counts, covered), snapshots


def remember(
    kept: tuple[InferenceSnapshot, ...], snapshot: InferenceSnapshot, window_seconds: int
) -> tuple[InferenceSnapshot, ...]:
    """`kept` with `snapshot` (taken now) added, thinned to about `SNAPSHOTS_PER_WINDOW`
    per window and pruned of those that can no longer be a base. Pure."""
    kept = tuple(s for s in kept if s.time < snapshot.time)  # a clock set back: start there
    spacing = timedelta(seconds=window_seconds / SNAPSHOTS_PER_WINDOW)
    if len(kept) >= 2 and kept[-1].time - kept[-2].time < spacing:
        kept = kept[:-1]
    kept = (*kept, snapshot)
    return kept[_base_index(kept, snapshot.time - timedelta(seconds=window_seconds)) :]


def _base_index(snapshots: Sequence[InferenceSnapshot], start: datetime) -> int:
    at_or_before = [i for i, s in enumerate(snapshots) if s.time <= start]
    return at_or_before[-1] if at_or_before else 0


def window_counts(
    snapshots: Sequence[InferenceSnapshot], now: datetime, window_seconds: int
) -> tuple[dict[str, float], float]:
    """Each pod's count over the window ending at `now` (the module's docstring gives the
    rules), and the seconds that covers: from the base to `now`. Pure."""
    if not snapshots:
        return {}, 0.0
    snapshots = snapshots[_base_index(snapshots, now - timedelta(seconds=window_seconds)) :]
    base = snapshots[0].by_pod
    counts: dict[str, float] = {}
    for pod in dict.fromkeys(pod for snapshot in snapshots for pod in snapshot.by_pod):
        reads = [s.by_pod[pod] for s in snapshots if pod in s.by_pod]
        went_down = any(later < earlier for earlier, later in pairwise(reads))
        counts[pod] = reads[-1] if pod not in base or went_down else reads[-1] - base[pod]
    return counts, max(0.0, min(float(window_seconds), _seconds(snapshots[0].time, now)))


def _seconds(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds()
