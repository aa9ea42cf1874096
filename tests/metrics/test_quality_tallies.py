"""The quality watch's window tallies, pure parts: the direct read's history (what it keeps,
and each pod's count over the window: a pod at the window's start, a new one, a restarted
one, one gone since, a class first seen since; a history younger than the window), the
grouping of the grouped queries' answers into overall, class and slice tallies, the
readings set aside with a sentence (more agreements than rows, NaN, negative, a
difference without requests), the PromQL and direct forms of one row, and
`read_quality_tallies` over a source that keeps the past, one that does not, and one
that cannot answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.api.v1alpha1.enums import QualityGroupKind as GroupKind
from kubeinfer.operator.metrics_sources import queries as q
from kubeinfer.operator.metrics_sources.quality import (
    SNAPSHOTS_PER_WINDOW,
    by_pod,
    checked_tallies,
    read_quality_tallies,
    remember,
    window_counts,
)
from kubeinfer.operator.metrics_sources.queries import GroupedQuery, Scope
from kubeinfer.operator.metrics_sources.samples import PodSamples
from kubeinfer.operator.metrics_sources.source import MetricsUnavailable
from kubeinfer.operator.state.quality_readings import (
    OVERALL,
    AgreementTally,
    QualityCounter,
    QualityGroup,
    QualityHistory,
    QualityReading,
    QualitySnapshot,
    RequestTally,
    WindowTallies,
)
from prometheus_client.samples import Sample

T0 = datetime(2025, 1, 1, tzinfo=UTC)
WINDOW = 600
DIGEST = "sha256:" + "a" * 64
ROWS, AGREE = QualityCounter.ROWS, QualityCounter.AGREEMENTS
CAT = QualityGroup(GroupKind.CLASS, "cat")
EU = QualityGroup(GroupKind.SLICE, "eu")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def snap(seconds: float, **pods: dict) -> QualitySnapshot:
    return QualitySnapshot(at(seconds), pods)


def rows(n: float, agreements: float = 0, group: QualityGroup = OVERALL) -> dict:
    return {(group, ROWS): n, (group, AGREE): agreements}


def history(*snapshots: QualitySnapshot) -> QualityHistory:
    return QualityHistory(DIGEST, snapshots)


# -- each pod's count over the window ------------------------------------------------------

# (what, snapshots oldest first (the last is now), expected counts, covered seconds)
WINDOW_CASES = [
    ("the first read counts nothing yet: the window starts there",
     [snap(0, a=rows(50, 40))], {}, 0.0),
    ("a pod at the window's start counts its growth since",
     [snap(0, a=rows(50, 40)), snap(600, a=rows(80, 60))], rows(30, 20), 600.0),
    ("the base is the latest snapshot at or before the window's start",
     [snap(0, a=rows(10, 10)), snap(100, a=rows(50, 40)), snap(700, a=rows(80, 60))],
     rows(30, 20), 600.0),
    ("a younger history covers what it spans, from its oldest snapshot",
     [snap(0, a=rows(50, 40)), snap(200, a=rows(60, 45))], rows(10, 5), 200.0),
    ("a pod new since the window's start counts all its counts",
     [snap(0, a=rows(50, 40)), snap(600, a=rows(80, 60), b=rows(7, 7))], rows(37, 27), 600.0),
    ("a restarted pod (its counter went down) counts from zero",
     [snap(0, a=rows(50, 40)), snap(300, a=rows(5, 5)), snap(600, a=rows(60, 50))],
     rows(60, 50), 600.0),
    ("a restart seen at the last read only counts what followed it",
     [snap(0, a=rows(50, 40)), snap(600, a=rows(3, 1))], rows(3, 1), 600.0),
    ("a pod gone since keeps what its last read showed",
     [snap(0, a=rows(50, 40), b=rows(10, 9)), snap(300, a=rows(60, 45), b=rows(16, 12)),
      snap(600, a=rows(70, 50))], rows(26, 13), 600.0),
    ("a pod gone before the window's start counts nothing",
     [snap(0, a=rows(50, 40), b=rows(10, 9)), snap(600, a=rows(70, 50))], rows(20, 10), 600.0),
    ("a class first seen since counts all its counts; one at the start its growth",
     [snap(0, a={**rows(50, 40), **rows(20, 20, CAT)}),
      snap(600, a={**rows(80, 60), **rows(25, 22, CAT), **rows(4, 1, EU)})],
     {**rows(30, 20), **rows(5, 2, CAT), **rows(4, 1, EU)}, 600.0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("snapshots", "expected", "covered"),
    [case[1:] for case in WINDOW_CASES],
    ids=[case[0] for case in WINDOW_CASES],
)
def test_window_counts(snapshots: list, expected: dict, covered: float) -> None:
    now = snapshots[-1].time
    counts, seconds = window_counts(history(*snapshots), now, WINDOW)
    assert {k: v for k, v in counts.items() if v} == {k: v for k, v in expected.items() if v}
    assert seconds == covered


def test_no_history_counts_nothing_and_covers_nothing() -> None:
    assert window_counts(QualityHistory(), T0, WINDOW) == ({}, 0.0)


def test_the_history_keeps_the_base_and_a_bounded_number_of_snapshots() -> None:
    kept = QualityHistory()
    for second in range(0, 3 * WINDOW + 1, 2):  # a pass every 2 s, three windows long
        kept = remember(kept, snap(second, a=rows(second, second)), WINDOW, DIGEST)
    times = [(s.time - T0).total_seconds() for s in kept.snapshots]
    assert times[-1] == 3 * WINDOW  # the newest is always kept
    assert times[0] <= 2 * WINDOW < times[1]  # the base, and nothing older
    assert len(times) <= SNAPSHOTS_PER_WINDOW + 2
    spacing = WINDOW / SNAPSHOTS_PER_WINDOW
    assert all(b - a >= spacing for a, b in pairwise(times[:-1]))
    counts, covered = window_counts(kept, at(3 * WINDOW), WINDOW)
    assert WINDOW <= covered <= WINDOW + spacing + 2
    assert counts[(OVERALL, ROWS)] == covered  # a row a second


def test_another_reference_engine_starts_the_history_over() -> None:
    old = history(snap(0, a=rows(500, 400)))
    new = remember(old, snap(60, a=rows(20, 20)), WINDOW, "sha256:" + "b" * 64)
    assert [s.time for s in new.snapshots] == [at(60)]
    assert window_counts(new, at(60), WINDOW) == ({(OVERALL, ROWS): 0, (OVERALL, AGREE): 0}, 0)


def test_a_clock_set_back_drops_the_snapshots_after_it() -> None:
    old = history(snap(0, a=rows(10, 10)), snap(100, a=rows(20, 20)))
    new = remember(old, snap(50, a=rows(15, 14)), WINDOW, DIGEST)
    assert [s.time for s in new.snapshots] == [at(0), at(50)]


# -- grouping and judging the figures -------------------------------------------------------


def answers(**figures: dict) -> list[dict]:
    """The grouped queries' answers in their order, by row name (missing ones empty)."""
    return [figures.get(row.name, {}) for row in q.QUALITY_QUERIES]


def test_answers_become_each_pods_counters_by_group() -> None:
    pods = by_pod(answers(
        quality_top1_rows={("a",): 10.0, ("b",): 4.0},
        quality_class_top1_rows={("a", "cat"): 6.0},
        quality_slice_top1_agreements={("b", "eu"): 3.0},
    ))  # fmt: skip
    assert pods == {
        "a": {(OVERALL, ROWS): 10.0, (CAT, ROWS): 6.0},
        "b": {(OVERALL, ROWS): 4.0, (EU, AGREE): 3.0},
    }


def overall_counts(rows_: float, agreements: float, diff: tuple = (1.0, 4.0)) -> dict:
    return {
        **rows(rows_, agreements),
        (OVERALL, QualityCounter.DIFFERENCE_SUM): diff[0],
        (OVERALL, QualityCounter.DIFFERENCE_COUNT): diff[1],
    }


NAN = math.nan
SAMPLED, COMPARED = QualityCounter.REQUESTS_SAMPLED, QualityCounter.REQUESTS_COMPARED
# (what, counts, expected tallies, the start of each sentence set aside)
CHECK_CASES = [
    ("an empty window: no samples, no groups",
     {}, WindowTallies(AgreementTally(0, 0)), []),
    ("classes and slices with rows are tallied; one without rows is left out",
     {**overall_counts(10, 8), **rows(6, 5, CAT), **rows(4, 3, EU),
      **rows(0, 0, QualityGroup(GroupKind.CLASS, "dog"))},
     WindowTallies(AgreementTally(10, 8, 2.5), {"cat": AgreementTally(6, 5)},
                   {"eu": AgreementTally(4, 3)}), []),
    ("more agreements than rows sets the class aside, the rest count",
     {**overall_counts(10, 8), **rows(6, 7, CAT), **rows(4, 3, EU)},
     WindowTallies(AgreementTally(10, 8, 2.5), {}, {"eu": AgreementTally(4, 3)}),
     ["P gave class 'cat' 7 top-1 agreements out of 6 rows"]),
    ("a NaN slice is set aside",
     {**overall_counts(10, 8), **rows(NAN, 3, EU)},
     WindowTallies(AgreementTally(10, 8, 2.5)),
     ["P gave slice 'eu' 3 top-1 agreements out of nan"]),
    ("a negative overall count leaves an empty overall tally",
     {**overall_counts(-2, 0), **rows(6, 5, CAT)},
     WindowTallies(AgreementTally(0, 0), {"cat": AgreementTally(6, 5)}),
     ["P gave overall 0 top-1 agreements out of -2 rows"]),
    ("rows without any difference observed set the overall tally aside",
     {**overall_counts(10, 8, (0.0, 0.0))}, WindowTallies(AgreementTally(0, 0)),
     ["P gave a difference sum of 0 over 0 requests beside 10 compared rows"]),
    ("the requests sampled and compared are tallied",
     {**overall_counts(10, 8), (OVERALL, SAMPLED): 40.0, (OVERALL, COMPARED): 30.0},
     WindowTallies(AgreementTally(10, 8, 2.5), requests=RequestTally(40, 30)), []),
    ("more requests compared than sampled are set aside, the rest count",
     {**overall_counts(10, 8), (OVERALL, SAMPLED): 4.0, (OVERALL, COMPARED): 30.0},
     WindowTallies(AgreementTally(10, 8, 2.5)),
     ["P gave 30 requests compared out of 4 sampled"]),
    ("a negative difference sets the overall tally aside",
     {**overall_counts(10, 8, (-1.0, 4.0))}, WindowTallies(AgreementTally(0, 0)),
     ["P gave a difference sum of -1 over 4 requests"]),
    ("KL divergence is the per-request mean scaled to the rows",
     {**overall_counts(10, 8), (OVERALL, QualityCounter.KL_SUM): 0.2,
      (OVERALL, QualityCounter.KL_COUNT): 4.0},
     WindowTallies(AgreementTally(10, 8, 2.5, kl_divergence_sum=0.5)), []),
    ("a NaN KL divergence is set aside alone",
     {**overall_counts(10, 8), (OVERALL, QualityCounter.KL_SUM): NAN,
      (OVERALL, QualityCounter.KL_COUNT): 4.0},
     WindowTallies(AgreementTally(10, 8, 2.5)), ["P gave a KL divergence sum of nan"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("counts", "expected", "notes"),
    [case[1:] for case in CHECK_CASES],
    ids=[case[0] for case in CHECK_CASES],
)
def test_checked_tallies(counts: dict, expected: WindowTallies, notes: list[str]) -> None:
    tallies, set_aside = checked_tallies(counts, "P")
    assert tallies == expected
    assert len(set_aside) == len(notes)
    for sentence, start in zip(set_aside, notes, strict=True):
        assert sentence.startswith(start), sentence
        assert sentence.endswith("set aside")


def test_the_difference_mean_is_the_runtimes_per_request_mean() -> None:
    tallies, _ = checked_tallies(overall_counts(30, 29, (0.6, 3.0)), "P")
    assert tallies.overall.mean_absolute_difference == pytest.approx(0.2)


# -- the two forms of one row ------------------------------------------------------------

SCOPE = Scope("ns", "clf")


def test_a_rows_promql_is_the_growth_in_the_window_by_pod_and_group() -> None:
    query = q.QUALITY_CLASS_TOP1_ROWS.bind(
        SCOPE, window_seconds=300, candidate_digest=DIGEST, role="quality"
    )
    series = (
        f'kubeinfer_shadow_class_top1_rows_total{{namespace="ns",pod=~"{SCOPE.pod_regex}",'
        f'candidate_digest="{DIGEST}",role="quality"}}'
    )
    assert query.by == ("pod", "reference_class")
    assert query.promql == (
        f"sum by (pod, reference_class) ((last_over_time({series}[300s]) - "
        f"last_over_time({series}[60s] offset 300s) unless resets({series}[360s]) > 0) "
        f"or last_over_time({series}[300s]))"
    )


def test_a_rows_direct_form_is_the_current_value_by_pod_and_group() -> None:
    query = q.QUALITY_CLASS_TOP1_ROWS.bind(
        SCOPE, window_seconds=300, candidate_digest=DIGEST, role="quality"
    )
    name = "kubeinfer_shadow_class_top1_rows_total"
    mine = {"candidate_digest": DIGEST, "role": "quality"}

    def sample(value: float, cls: str, **labels: str) -> Sample:
        return Sample(name, {**mine, "reference_class": cls, **labels}, value)

    pods = [
        PodSamples("p1", (sample(3, "cat"), sample(2, "cat", serving_version="2"),
                          sample(9, "dog", role="shadow"))),
        PodSamples("p2", (sample(4, "dog"),)),
    ]  # fmt: skip
    assert query.reduce(pods) == {("p1", "cat"): 5.0, ("p2", "dog"): 4.0}


def test_a_window_under_a_second_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 second"):
        q.QUALITY_TOP1_ROWS.bind(SCOPE, window_seconds=0, candidate_digest=DIGEST, role="quality")


# -- read_quality_tallies over fake sources ---------------------------------------------------


@dataclass
class FakeSource:
    """Answers the grouped queries by name; remembers the queries it was asked."""

    answers_windows: bool
    figures: dict = field(default_factory=dict)
    failure: str = ""
    asked: list = field(default_factory=list)
    description: str = "fake"

    async def evaluate_grouped(self, queries: Sequence[GroupedQuery], now: datetime) -> tuple:
        self.asked = list(queries)
        if self.failure:
            raise MetricsUnavailable(self.failure)
        return tuple(dict(self.figures.get(query.name, {})) for query in queries)


async def test_a_source_that_keeps_the_past_answers_the_window_summed_over_pods() -> None:
    source = FakeSource(True, {
        "quality_top1_rows": {("a",): 10.0, ("b",): 5.0},
        "quality_top1_agreements": {("a",): 9.0, ("b",): 5.0},
        "quality_abs_difference_sum": {("a",): 1.0},
        "quality_abs_difference_count": {("a",): 5.0, ("b",): 5.0},
        "quality_class_top1_rows": {("a", "cat"): 3.0, ("b", "cat"): 2.0},
        "quality_class_top1_agreements": {("a", "cat"): 1.0, ("b", "cat"): 2.0},
    })  # fmt: skip
    old = history(snap(0, a=rows(1, 1)))
    reading, kept = await read_quality_tallies(source, SCOPE, DIGEST, WINDOW, at(700), old)
    assert reading == QualityReading(
        WindowTallies(AgreementTally(15, 14, 1.5), {"cat": AgreementTally(5, 3)}),
        covered_seconds=WINDOW,
    )
    assert kept == QualityHistory()  # no use for it; a switch back starts afresh
    assert all(f"[{WINDOW}s]" in query.promql for query in source.asked)
    assert all(
        'role="quality"' in query.promql and DIGEST in query.promql for query in source.asked
    )


async def test_a_source_of_the_present_is_differenced_against_the_history() -> None:
    source = FakeSource(False, {
        "quality_top1_rows": {("a",): 80.0},
        "quality_top1_agreements": {("a",): 60.0},
        "quality_abs_difference_sum": {("a",): 3.0},
        "quality_abs_difference_count": {("a",): 15.0},
    })  # fmt: skip
    old = history(snap(0, a={**rows(50, 40), (OVERALL, QualityCounter.DIFFERENCE_SUM): 1.0,
                             (OVERALL, QualityCounter.DIFFERENCE_COUNT): 5.0}))  # fmt: skip
    reading, kept = await read_quality_tallies(source, SCOPE, DIGEST, WINDOW, at(600), old)
    assert reading == QualityReading(
        WindowTallies(AgreementTally(30, 20, 30 * 0.2)), covered_seconds=600.0
    )
    assert [s.time for s in kept.snapshots] == [at(0), at(600)]


async def test_a_source_that_cannot_answer_gives_its_reason_and_keeps_the_history() -> None:
    old = history(snap(0, a=rows(50, 40)))
    source = FakeSource(False, failure="pod a did not answer")
    reading, kept = await read_quality_tallies(source, SCOPE, DIGEST, WINDOW, at(60), old)
    assert reading == QualityReading(error="fake: pod a did not answer")
    assert kept is old


def test_the_compared_requests_are_the_mirror_requests_of_that_outcome_only() -> None:
    query = q.QUALITY_REQUESTS_COMPARED.bind(
        SCOPE, window_seconds=300, candidate_digest=DIGEST, role="quality"
    )
    assert 'role="quality",outcome="compared"}' in query.promql
    name = series.SHADOW_REQUESTS.total
    mine = {"candidate_digest": DIGEST, "role": "quality"}
    pods = [
        PodSamples("p1", (Sample(name, {**mine, "outcome": "compared"}, 7.0),
                          Sample(name, {**mine, "outcome": "dropped"}, 3.0))),
    ]  # fmt: skip
    assert query.reduce(pods) == {("p1",): 7.0}
    sampled = q.QUALITY_REQUESTS_SAMPLED.bind(
        SCOPE, window_seconds=300, candidate_digest=DIGEST, role="quality"
    )
    assert sampled.reduce(pods) == {("p1",): 10.0}
    assert RequestTally(10, 7).effective_percent(5) == 3.5
    assert RequestTally(0, 0).effective_percent(5) is None
