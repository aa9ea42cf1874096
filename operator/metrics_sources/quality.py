"""`read_quality_tallies`: the quality watch's tallies over its sliding window, overall, per
reference top-1 class and per slice, from either metrics source.

Prometheus keeps the past, so it answers the window itself (`queries.GROWTH_IN_WINDOW_BY`
says how, and its error). The direct read sees only the pods' counters since each pod
started, so the window comes from the operator's memory: a `QualityHistory` of earlier
reads that the reconciler keeps between passes and passes back in. The window's count of
one pod's counter is its value now less its value in the latest snapshot at or before
the window's start (the base), with the same rules as the PromQL form, so both sources
give the same tallies for the same counts:

- a pod not in the base (new, or first ready since), or a counter the base lacks (a class
  first seen since), counts all its counts, since the pod started;
- a counter that went down between two kept snapshots (a restarted container) counts
  from zero: what it counted since the restart;
- a pod gone since (scaled down, replaced, not ready now) keeps what its last read
  showed, as Prometheus keeps a gone pod's samples.

Its error: the window starts at the base's time, which is before `now - window` by up to
the snapshots' spacing plus one pass interval; a pod's counts after its last read are
lost; a restart between two kept snapshots whose counter has climbed back above its old
value is not seen. The history keeps about `SNAPSHOTS_PER_WINDOW` snapshots, however
often the passes come, so its memory is bounded by the pods and groups, not by time.
Until the history spans the window (the operator just started, the watch just began, a
new reference engine), the tallies cover only what it spans: the reading's
`covered_seconds` says how much, and what the pods counted before the first read is not
in them.

A figure that makes no sense (NaN, negative, more agreements than rows) is set aside with
a sentence, as `scaling.checked_signals` does: the group is left out as if unread, and
the other groups still count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from itertools import pairwise

from kubeinfer.operator.api.v1alpha1.enums import QualityGroupKind as GroupKind
from kubeinfer.operator.metrics_sources import queries as q
from kubeinfer.operator.metrics_sources.queries import GroupedNamedQuery, Scope
from kubeinfer.operator.metrics_sources.source import MetricsSource, MetricsUnavailable
from kubeinfer.operator.state.quality_readings import (
    OVERALL,
    AgreementTally,
    CounterKey,
    QualityCounter,
    QualityGroup,
    QualityHistory,
    QualityReading,
    QualitySnapshot,
    RequestTally,
    WindowTallies,
)

QUALITY_ROLE = "quality"
"""The mirror series' `role` for the quality watch's reference (a shadow's is `shadow`)."""

SNAPSHOTS_PER_WINDOW = 30
"""How many snapshots a direct read's history keeps per window: the window's start is
found to within a thirtieth of the window, whatever the pass interval."""

COUNTERS: tuple[tuple[GroupedNamedQuery, GroupKind, QualityCounter], ...] = (
    (q.QUALITY_TOP1_ROWS, GroupKind.OVERALL, QualityCounter.ROWS),
    (q.QUALITY_TOP1_AGREEMENTS, GroupKind.OVERALL, QualityCounter.AGREEMENTS),
    (q.QUALITY_DIFFERENCE_SUM, GroupKind.OVERALL, QualityCounter.DIFFERENCE_SUM),
    (q.QUALITY_DIFFERENCE_COUNT, GroupKind.OVERALL, QualityCounter.DIFFERENCE_COUNT),
    (q.QUALITY_KL_SUM, GroupKind.OVERALL, QualityCounter.KL_SUM),
    (q.QUALITY_KL_COUNT, GroupKind.OVERALL, QualityCounter.KL_COUNT),
    (q.QUALITY_CLASS_TOP1_ROWS, GroupKind.CLASS, QualityCounter.ROWS),
    (q.QUALITY_CLASS_TOP1_AGREEMENTS, GroupKind.CLASS, QualityCounter.AGREEMENTS),
    (q.QUALITY_SLICE_TOP1_ROWS, GroupKind.SLICE, QualityCounter.ROWS),
    (q.QUALITY_SLICE_TOP1_AGREEMENTS, GroupKind.SLICE, QualityCounter.AGREEMENTS),
    (q.QUALITY_REQUESTS_SAMPLED, GroupKind.OVERALL, QualityCounter.REQUESTS_SAMPLED),
    (q.QUALITY_REQUESTS_COMPARED, GroupKind.OVERALL, QualityCounter.REQUESTS_COMPARED),
)
"""Each grouped query, and the group kind and counter its figures are."""

Counts = Mapping[CounterKey, float]
Answer = Mapping[tuple[str, ...], float]
"""A grouped query's figures, keyed by (pod,) or (pod, class or slice)."""


async def read_quality_tallies(
    source: MetricsSource,
    scope: Scope,
    reference_digest: str,
    window_seconds: int,
    now: datetime,
    history: QualityHistory,
) -> tuple[QualityReading, QualityHistory]:
    """The serving pods' tallies against the reference `reference_digest` over the last
    `window_seconds` at `now`, and the history to pass to the next call (the same one
    when the source could not answer; an empty one when the source keeps the past itself).
    Never raises for the source: a source that cannot answer gives a reading with `error`
    (its description and message)."""
    bound = [
        row.bind(
            scope, window_seconds=window_seconds, candidate_digest=reference_digest,
            role=QUALITY_ROLE,
        )
        for row, _, _ in COUNTERS
    ]  # fmt: skip
    try:
        answers = await source.evaluate_grouped(bound, now)
    except MetricsUnavailable as error:
        return QualityReading(error=f"{source.description}: {error}"), history
    if source.answers_windows:
        counts: Counts = summed_over_pods(by_pod(answers))
        covered = float(window_seconds)
        history = QualityHistory()
    else:
        snapshot = QualitySnapshot(now, by_pod(answers))
        history = remember(history, snapshot, window_seconds, reference_digest)
        counts, covered = window_counts(history, now, window_seconds)
    tallies, set_aside = checked_tallies(counts, source.description)
    return QualityReading(tallies, covered_seconds=covered, set_aside=set_aside), history


def by_pod(answers: Sequence[Answer]) -> dict[str, dict[CounterKey, float]]:
    """The grouped queries' answers (in `COUNTERS`' order) as each pod's counters. Pure."""
    pods: dict[str, dict[CounterKey, float]] = {}
    for (_, kind, counter), answer in zip(COUNTERS, answers, strict=True):
        for key, value in answer.items():
            pod, name = key[0], key[1] if len(key) > 1 else ""
            group = OVERALL if kind == GroupKind.OVERALL else QualityGroup(kind, name)
            pods.setdefault(pod, {})[(group, counter)] = value
    return pods


def summed_over_pods(pods: Mapping[str, Counts]) -> dict[CounterKey, float]:
    """Each counter summed over the pods. Pure."""
    sums: dict[CounterKey, float] = {}
    for counters in pods.values():
        for key, value in counters.items():
            sums[key] = sums.get(key, 0.0) + value
    return sums


# -- the direct read's window ---------------------------------------------------------------


def remember(
    history: QualityHistory, snapshot: QualitySnapshot, window_seconds: int, reference_digest: str
) -> QualityHistory:
    """`history` with `snapshot` (taken now) added, thinned and pruned. Pure.

    A history of another reference engine starts over (its series are others). Thinning:
    the newest snapshot is always kept; the one before it only when it is at least a
    spacing (the window over `SNAPSHOTS_PER_WINDOW`) after its own predecessor, so the
    kept ones stay that far apart. Pruning: snapshots before the base (the latest at or
    before the window's start) can never be a base again."""
    kept = history.snapshots if history.reference_digest == reference_digest else ()
    kept = tuple(s for s in kept if s.time < snapshot.time)  # a clock set back: start there
    spacing = timedelta(seconds=window_seconds / SNAPSHOTS_PER_WINDOW)
    if len(kept) >= 2 and kept[-1].time - kept[-2].time < spacing:
        kept = kept[:-1]
    kept = (*kept, snapshot)
    start = _base_index(kept, snapshot.time - timedelta(seconds=window_seconds))
    return QualityHistory(reference_digest, kept[start:])


def _base_index(snapshots: Sequence[QualitySnapshot], start: datetime) -> int:
    """The latest snapshot at or before `start`; the oldest when none is."""
    at_or_before = [i for i, s in enumerate(snapshots) if s.time <= start]
    return at_or_before[-1] if at_or_before else 0


def window_counts(
    history: QualityHistory, now: datetime, window_seconds: int
) -> tuple[dict[CounterKey, float], float]:
    """Each counter's count over the window ending at `now`, summed over the pods (the
    module's docstring gives the rules), and the seconds the window covers: from the base
    to `now`, less than the window while the history is younger. Pure."""
    if not history.snapshots:
        return {}, 0.0
    snapshots = history.snapshots
    snapshots = snapshots[_base_index(snapshots, now - timedelta(seconds=window_seconds)) :]
    base = snapshots[0]
    counts: dict[CounterKey, float] = {}
    pods = dict.fromkeys(pod for snapshot in snapshots for pod in snapshot.by_pod)
    for pod in pods:
        reads = [s.by_pod[pod] for s in snapshots if pod in s.by_pod]
        at_base = base.by_pod.get(pod)
        for key, latest in reads[-1].items():
            if at_base is None or _went_down(reads, key):
                count = latest  # since the pod (or the counter) started
            else:
                count = latest - at_base.get(key, 0.0)
            counts[key] = counts.get(key, 0.0) + count
    return counts, max(0.0, (now - base.time).total_seconds())


def _went_down(reads: Iterable[Counts], key: CounterKey) -> bool:
    values = [counters[key] for counters in reads if key in counters]
    return any(later < earlier for earlier, later in pairwise(values))


# -- judging the figures --------------------------------------------------------------------


def checked_tallies(counts: Counts, where: str) -> tuple[WindowTallies, tuple[str, ...]]:
    """The window's tallies from the counters' counts, every figure that makes no sense set
    aside with a sentence naming `where` it came from. Pure.

    A group's samples are its compared rows. The overall tally also carries the mean of
    each compared request's largest |difference| and its mean KL divergence, the
    runtime's per-request figures, scaled to the rows (the tally's sums over its samples
    give those means back). A group without rows in the window is left out."""
    notes: list[str] = []
    groups = sorted({group for group, _ in counts} | {OVERALL})
    tallies: dict[QualityGroup, AgreementTally] = {}
    for group in groups:
        rows = counts.get((group, QualityCounter.ROWS), 0.0)
        agreements = counts.get((group, QualityCounter.AGREEMENTS), 0.0)
        if not (_count(rows) and _count(agreements) and agreements <= rows):
            notes.append(
                f"{where} gave {group} {agreements:g} top-1 agreements out of {rows:g} rows "
                "in the window, which makes no sense: set aside"
            )
            continue
        if round(rows):
            tallies[group] = AgreementTally(round(rows), round(agreements))
    overall = tallies.get(OVERALL, AgreementTally(0, 0))
    if overall.samples:
        overall = _with_means(overall, counts, where, notes)
    return (
        WindowTallies(
            overall,
            {g.name: t for g, t in tallies.items() if g.kind == GroupKind.CLASS},
            {g.name: t for g, t in tallies.items() if g.kind == GroupKind.SLICE},
            _requests(counts, where, notes),
        ),
        tuple(notes),
    )


def _requests(counts: Counts, where: str, notes: list[str]) -> RequestTally | None:
    """The requests sampled for the reference in the window and how many of them were
    compared; None (with a sentence) when the figures make no sense."""
    if (OVERALL, QualityCounter.REQUESTS_SAMPLED) not in counts:
        return None  # no request sampled in the window (or a runtime that counts none)
    sampled = counts.get((OVERALL, QualityCounter.REQUESTS_SAMPLED), 0.0)
    compared = counts.get((OVERALL, QualityCounter.REQUESTS_COMPARED), 0.0)
    if not (_count(sampled) and _count(compared) and compared <= sampled):
        notes.append(
            f"{where} gave {compared:g} requests compared out of {sampled:g} sampled in the "
            "window, which makes no sense: set aside"
        )
        return None
    return RequestTally(round(sampled), round(compared))


def _count(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def _with_means(
    overall: AgreementTally, counts: Counts, where: str, notes: list[str]
) -> AgreementTally:
    """The overall tally with its difference and KL sums, or set aside (no samples) when
    its difference makes no sense: a mean difference of nothing would pass the verdict's
    ceiling, and with no samples the verdict keeps what it last said instead."""
    total, requests = (
        counts.get((OVERALL, QualityCounter.DIFFERENCE_SUM), 0.0),
        counts.get((OVERALL, QualityCounter.DIFFERENCE_COUNT), 0.0),
    )
    if not (_count(total) and _count(requests) and requests >= 1):
        notes.append(
            f"{where} gave a difference sum of {total:g} over {requests:g} requests beside "
            f"{overall.samples} compared rows in the window, which makes no sense: the overall "
            "tally set aside"
        )
        return AgreementTally(0, 0)
    kl_total, kl_requests = (
        counts.get((OVERALL, QualityCounter.KL_SUM), 0.0),
        counts.get((OVERALL, QualityCounter.KL_COUNT), 0.0),
    )
    kl_sum = None
    if not (_count(kl_total) and _count(kl_requests)):
        notes.append(
            f"{where} gave a KL divergence sum of {kl_total:g} over {kl_requests:g} requests "
            "in the window, which makes no sense: set aside"
        )
    elif kl_requests >= 1:
        kl_sum = kl_total / kl_requests * overall.samples
    return AgreementTally(
        overall.samples,
        overall.top1_agreements,
        absolute_difference_sum=total / requests * overall.samples,
        kl_divergence_sum=kl_sum,
    )
