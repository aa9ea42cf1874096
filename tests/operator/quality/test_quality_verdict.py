"""The quality verdict as a table: thresholds, the build's baseline, one window's tallies
(overall, per reference class, per slice) and the previous verdict in; Healthy, Drifting
or InsufficientSamples with the groups that drifted out. Then what the table cannot show
row by row: hysteresis across successive windows, the correction across many groups (a
seeded Monte-Carlo count of false alarms), the messages' figures, and properties that
hold whatever the tallies (no group drifts on fewer than minSamples; the previous verdict
can only hold a drift, never start one)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.api.v1alpha1.enums import QualityGroupKind as GroupKind
from kubeinfer.operator.api.v1alpha1.enums import QualityState
from kubeinfer.operator.quality.verdict import (
    BaselineAgreement,
    QualityBaseline,
    QualityThresholds,
    QualityVerdict,
    judge_quality,
)
from kubeinfer.operator.state.quality_readings import (
    OVERALL,
    AgreementTally,
    QualityGroup,
    WindowTallies,
)

THRESHOLDS = QualityThresholds(
    min_samples=100,
    min_top1_agreement=0.95,
    min_class_agreement=0.93,
    max_mean_absolute_difference=0.05,
    false_alarm_budget=0.01,
)
BASELINE = QualityBaseline(
    overall=BaselineAgreement(0.97),
    by_class={
        "cat": BaselineAgreement(0.97),
        "dog": BaselineAgreement(0.96),
        # Quantisation costs this class more than the floor allows: the build measured it.
        "rare": BaselineAgreement(0.90),
    },
)
HEALTHY, DRIFTING, INSUFFICIENT = (
    QualityState.HEALTHY,
    QualityState.DRIFTING,
    QualityState.INSUFFICIENT_SAMPLES,
)


def tally(samples: int, agreement: float, mean_abs_difference: float = 0.01) -> AgreementTally:
    return AgreementTally(samples, round(samples * agreement), mean_abs_difference * samples)


def window(
    overall: AgreementTally | None = None,
    classes: dict[str, AgreementTally] | None = None,
    slices: dict[str, AgreementTally] | None = None,
) -> WindowTallies:
    return WindowTallies(
        overall=overall or tally(5000, 0.97),
        by_class=classes if classes is not None else {"cat": tally(2000, 0.97)},
        by_slice=slices if slices is not None else {"other": tally(5000, 0.97)},
    )


def cls(name: str) -> QualityGroup:
    return QualityGroup(GroupKind.CLASS, name)


def sl(name: str) -> QualityGroup:
    return QualityGroup(GroupKind.SLICE, name)


def drifting(verdict: QualityVerdict) -> set[QualityGroup]:
    return {judgement.group for judgement in verdict.drifting}


@pytest.mark.parametrize(
    ("tallies", "state", "reason", "drifted"),
    [
        # In-distribution traffic: every group at its baseline.
        (
            window(
                classes={"cat": tally(2000, 0.97), "dog": tally(1500, 0.96)},
                slices={"acme": tally(1000, 0.97), "other": tally(4000, 0.97)},
            ),
            HEALTHY,
            Reason.QUALITY_HEALTHY,
            set(),
        ),
        # A handful of samples never alarms, however bad they look.
        (
            window(tally(50, 0.2), {"cat": tally(50, 0.2)}, {}),
            INSUFFICIENT,
            Reason.INSUFFICIENT_SAMPLES,
            set(),
        ),
        (window(classes={"cat": tally(99, 0.0)}), HEALTHY, Reason.QUALITY_HEALTHY, set()),
        (window(slices={"acme": tally(99, 0.0)}), HEALTHY, Reason.QUALITY_HEALTHY, set()),
        # One class drifts while the overall agreement holds above minTop1Agreement: the
        # aggregate hides it, the class is caught and named.
        (
            window(tally(5000, 0.96), {"cat": tally(4500, 0.975), "dog": tally(500, 0.80)}),
            DRIFTING,
            Reason.QUALITY_DRIFT,
            {cls("dog")},
        ),
        # A slice is held to minClassAgreement, not to the whole traffic's floor.
        (
            window(slices={"acme": tally(3000, 0.935), "other": tally(2000, 0.99)}),
            HEALTHY,
            Reason.QUALITY_HEALTHY,
            set(),
        ),
        # One slice drifts: named.
        (
            window(slices={"acme": tally(600, 0.85), "other": tally(4400, 0.985)}),
            DRIFTING,
            Reason.QUALITY_DRIFT,
            {sl("acme")},
        ),
        # The whole traffic drifts: overall, and each class, named.
        (
            window(tally(5000, 0.90), {"cat": tally(5000, 0.90)}, {"other": tally(5000, 0.90)}),
            DRIFTING,
            Reason.QUALITY_DRIFT,
            {OVERALL, cls("cat"), sl("other")},
        ),
        # A class whose build baseline is below the floor is held to its baseline: at it,
        # it is quantisation's expected disagreement, not drift; well below, it drifts.
        (window(classes={"rare": tally(2000, 0.90)}), HEALTHY, Reason.QUALITY_HEALTHY, set()),
        (
            window(classes={"rare": tally(2000, 0.80)}),
            DRIFTING,
            Reason.QUALITY_DRIFT,
            {cls("rare")},
        ),
        # Just below the floor, but not significantly so: no alarm.
        (window(classes={"dog": tally(300, 0.92)}), HEALTHY, Reason.QUALITY_HEALTHY, set()),
        # A class the report does not name is held to the overall baseline (and floor).
        (window(classes={"new": tally(1000, 0.94)}), HEALTHY, Reason.QUALITY_HEALTHY, set()),
        (window(classes={"new": tally(1000, 0.85)}), DRIFTING, Reason.QUALITY_DRIFT, {cls("new")}),
        # The mean absolute difference, on its point estimate without a sum of squares:
        # at the limit passes, above fails.
        (window(tally(5000, 0.97, 0.05)), HEALTHY, Reason.QUALITY_HEALTHY, set()),
        (
            window(tally(5000, 0.97, 0.051)),
            DRIFTING,
            Reason.MEAN_ABSOLUTE_DIFFERENCE_TOO_LARGE,
            set(),
        ),
        # Too few samples to judge the mean either.
        (window(tally(99, 0.97, 0.5), {}, {}), INSUFFICIENT, Reason.INSUFFICIENT_SAMPLES, set()),
    ],
)
def test_the_verdict_table(tallies, state, reason, drifted):
    verdict = judge_quality(THRESHOLDS, BASELINE, tallies)
    outcome = (verdict.state, verdict.reason, drifting(verdict))
    assert outcome == (state, reason, drifted), verdict.message


def test_a_baseline_on_few_calibration_rows_counts_at_its_lower_bound():
    # The build measured the class at 0.90 on 200 calibration rows; live traffic agrees
    # 0.87 on 2000 samples. Against the figure taken as exact that is drift; against
    # what 200 rows can tell (their lower bound), it is not.
    live = window(classes={"rare": tally(2000, 0.87)})
    exact = judge_quality(THRESHOLDS, BASELINE, live)
    measured = QualityBaseline(BASELINE.overall, {"rare": BaselineAgreement(0.90, samples=200)})
    slack = judge_quality(THRESHOLDS, measured, live)
    assert drifting(exact) == {cls("rare")}
    assert slack.state == HEALTHY, slack.message
    assert slack.worst_class is not None
    assert slack.worst_class.threshold < 0.87 < slack.worst_class.baseline


def test_the_floor_holds_when_the_baseline_is_above_it():
    # The baseline lowers the bar, never raises it: a class built at 0.99 may fall to
    # minClassAgreement without alarm (the floor is what the user accepts).
    baseline = QualityBaseline(BASELINE.overall, {"cat": BaselineAgreement(0.99)})
    verdict = judge_quality(THRESHOLDS, baseline, window(classes={"cat": tally(3000, 0.94)}))
    assert verdict.state == HEALTHY, verdict.message
    assert verdict.worst_class is not None and verdict.worst_class.threshold == 0.93


def test_a_drifting_group_recovers_only_when_confidently_back():
    # Successive windows of one class around its threshold (0.93): it trips well below,
    # stays drifting at the threshold and just above it (where a verdict without memory
    # would call it healthy), holds on too few samples, and recovers only well above.
    sequence = [
        (tally(1000, 0.90), DRIFTING),
        (tally(1000, 0.93), DRIFTING),
        (tally(1000, 0.94), DRIFTING),
        (tally(40, 1.0), DRIFTING),
        (tally(1000, 0.97), HEALTHY),
        (tally(1000, 0.93), HEALTHY),
        (tally(1000, 0.92), HEALTHY),
    ]
    previous = None
    for class_tally, expected in sequence:
        tallies = window(classes={"dog": class_tally})
        verdict = judge_quality(THRESHOLDS, BASELINE, tallies, previous and previous.memory)
        assert verdict.state == expected, (class_tally, verdict.message)
        previous = verdict
    memoryless = judge_quality(THRESHOLDS, BASELINE, window(classes={"dog": tally(1000, 0.94)}))
    assert memoryless.state == HEALTHY


def test_a_drifting_group_without_samples_stays_drifting_and_is_named():
    before = judge_quality(THRESHOLDS, BASELINE, window(classes={"dog": tally(500, 0.5)}))
    after = judge_quality(THRESHOLDS, BASELINE, window(classes={}), before.memory)
    assert drifting(after) == {cls("dog")}
    assert "class 'dog': no samples in the window" in after.message


def test_the_mean_difference_with_its_spread_does_not_flap():
    # With the sum of squares the mean is judged by its bounds: a mean at the limit trips
    # nothing, a mean confidently above trips, and it is back only when confidently below.
    def mean_tally(mean: float, spread: float = 0.01, samples: int = 5000) -> AgreementTally:
        square_sum = samples * (mean * mean + spread * spread)
        return AgreementTally(samples, round(samples * 0.97), mean * samples, square_sum)

    sequence = [
        (mean_tally(0.050), HEALTHY),
        (mean_tally(0.052), DRIFTING),
        (mean_tally(0.050), DRIFTING),
        (mean_tally(0.049), HEALTHY),
    ]
    previous = None
    for overall, expected in sequence:
        verdict = judge_quality(THRESHOLDS, BASELINE, window(overall), previous and previous.memory)
        assert verdict.state == expected, verdict.message
        if expected == DRIFTING:
            assert verdict.reason == Reason.MEAN_ABSOLUTE_DIFFERENCE_TOO_LARGE
        previous = verdict
    # The bounded mean is one more test in the correction.
    assert verdict.tests == 4


def test_the_correction_spends_the_budget_across_the_groups_tested():
    # The same class on the same samples: confidently below its floor among 3 tests, not
    # among 52 (49 more healthy classes share the false-alarm budget).
    few = window(classes={"dog": tally(300, 0.88)})
    many_classes = {"dog": tally(300, 0.88)} | {f"c{i}": tally(100, 0.97) for i in range(49)}
    many = window(classes=many_classes)
    alone, crowded = (judge_quality(THRESHOLDS, BASELINE, w) for w in (few, many))
    assert (alone.tests, crowded.tests) == (3, 52)
    assert drifting(alone) == {cls("dog")}
    assert crowded.state == HEALTHY, crowded.message
    assert crowded.per_test_false_alarm == pytest.approx(0.01 / 52)


def test_false_alarms_stay_within_the_budget_where_every_group_sits_on_its_threshold():
    # The worst case for false alarms: 40 classes and 4 slices whose true agreement is
    # exactly their threshold (floors above every baseline). Uncorrected (each of the 45
    # tests at the budget) many windows alarm; corrected, about the budget or fewer.
    rng = np.random.default_rng(7)
    corrected = QualityThresholds(
        min_samples=100,
        min_top1_agreement=1.0,
        min_class_agreement=1.0,
        max_mean_absolute_difference=1.0,
        false_alarm_budget=0.01,
    )
    uncorrected = replace(corrected, false_alarm_budget=0.01 * 45)
    baseline = QualityBaseline(BaselineAgreement(0.95))
    windows = 400
    alarms = {corrected: 0, uncorrected: 0}
    for _ in range(windows):
        samples = rng.multinomial(8000, [1 / 44] * 44)
        agreements = rng.binomial(samples, 0.95)
        tallies = [AgreementTally(int(n), int(k)) for n, k in zip(samples, agreements, strict=True)]
        tallies_window = WindowTallies(
            AgreementTally(int(samples.sum()), int(agreements.sum())),
            {f"c{i}": t for i, t in enumerate(tallies[:40])},
            {f"s{i}": t for i, t in enumerate(tallies[40:])},
        )
        for thresholds in alarms:
            verdict = judge_quality(thresholds, baseline, tallies_window)
            assert verdict.tests == 45
            alarms[thresholds] += verdict.state == DRIFTING
    assert alarms[corrected] / windows <= 0.02
    assert alarms[uncorrected] >= 10 * max(1, alarms[corrected])


@pytest.mark.parametrize(
    ("tallies", "fragments"),
    [
        # A drift names the group, its figures, the threshold and the CRD fields it came
        # from, and the level of the tests, so `kubectl describe` says why.
        (
            window(tally(5000, 0.96), {"cat": tally(4500, 0.975), "dog": tally(500, 0.80)}),
            [
                "class 'dog': top-1 agreement 0.8000 on 500 samples",
                "threshold 0.9300",
                "minClassAgreement 0.93",
                "build baseline 0.9600",
                "4 tests at a false-alarm budget of 0.01 (0.0025 each)",
                "2 of 2 classes and 1 of 1 slices had minSamples 100",
            ],
        ),
        # Healthy: the overall figures, the worst class and slice, the mean difference.
        (
            window(
                classes={"cat": tally(2000, 0.97), "dog": tally(1500, 0.95)},
                slices={"acme": tally(1000, 0.96), "other": tally(4000, 0.973)},
            ),
            [
                "No drift: overall: top-1 agreement 0.9700 on 5000 samples",
                "minTop1Agreement 0.95",
                "worst class 'dog'",
                "worst slice 'acme'",
                "mean |diff| 0.01 against maxMeanAbsoluteDifference 0.05",
            ],
        ),
        (window(tally(5000, 0.97, 0.08)), ["mean |diff| 0.08", "maxMeanAbsoluteDifference"]),
        (window(tally(40, 0.97), {}, {}), ["40 of minSamples 100 samples"]),
    ],
)
def test_the_message_names_the_figures_and_the_fields(tallies, fragments):
    message = judge_quality(THRESHOLDS, BASELINE, tallies).message
    for fragment in fragments:
        assert fragment in message, message


def test_a_baseline_at_its_lower_bound_is_shown_as_such():
    measured = QualityBaseline(BASELINE.overall, {"rare": BaselineAgreement(0.90, samples=200)})
    verdict = judge_quality(THRESHOLDS, measured, window(classes={"rare": tally(2000, 0.60)}))
    assert "build baseline 0.9000, 0.8" in verdict.message
    assert "at its lower bound" in verdict.message


def test_the_worst_class_and_slice_carry_their_figures():
    tallies = window(
        classes={"cat": tally(2000, 0.97), "dog": tally(400, 0.94)},
        slices={"acme": tally(300, 0.95), "other": tally(4700, 0.97)},
    )
    verdict = judge_quality(THRESHOLDS, BASELINE, tallies)
    assert verdict.worst_class is not None and verdict.worst_slice is not None
    assert (verdict.worst_class.group, verdict.worst_class.samples) == (cls("dog"), 400)
    assert verdict.worst_class.top1_agreement == pytest.approx(0.94)
    assert verdict.worst_class.bounds is not None
    assert verdict.worst_class.bounds.lower < 0.94 < verdict.worst_class.bounds.upper
    assert (verdict.worst_class.baseline, verdict.worst_class.threshold) == (0.96, 0.93)
    assert verdict.worst_slice.group == sl("acme")
    assert verdict.overall is not None and verdict.overall.threshold == 0.95


def test_a_kl_divergence_when_collected_is_reported():
    overall = AgreementTally(5000, 4850, 50.0, kl_divergence_sum=12.5)
    assert (
        "mean KL divergence 0.0025" in judge_quality(THRESHOLDS, BASELINE, window(overall)).message
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: AgreementTally(10, 11),
        lambda: AgreementTally(-1, 0),
        lambda: QualityThresholds(0, 0.9, 0.9, 0.1),
        lambda: QualityThresholds(10, 0.9, 0.9, 0.1, false_alarm_budget=0.0),
        lambda: QualityThresholds(10, 0.9, 0.9, 0.1, false_alarm_budget=1.0),
    ],
)
def test_impossible_inputs_are_refused(make):
    with pytest.raises(ValueError):
        make()


tally_strategy = st.builds(
    lambda samples, share: AgreementTally(samples, round(samples * share)),
    st.integers(0, 400),
    st.floats(0, 1),
)
window_strategy = st.builds(
    WindowTallies,
    overall=tally_strategy,
    by_class=st.dictionaries(st.sampled_from(["cat", "dog", "rare", "new"]), tally_strategy),
    by_slice=st.dictionaries(st.sampled_from(["acme", "other"]), tally_strategy),
)


@given(tallies=window_strategy, before=window_strategy)
def test_no_group_drifts_on_too_few_samples_and_memory_only_holds_a_drift(tallies, before):
    fresh = judge_quality(THRESHOLDS, BASELINE, tallies)
    for judgement in fresh.drifting:
        assert judgement.samples >= THRESHOLDS.min_samples
        assert judgement.bounds is not None
        assert judgement.bounds.upper < judgement.threshold + 1e-9
    every_tally = [tallies.overall, *tallies.by_class.values(), *tallies.by_slice.values()]
    if all(t.samples < THRESHOLDS.min_samples for t in every_tally):
        assert fresh.state == INSUFFICIENT
    previous = judge_quality(THRESHOLDS, BASELINE, before)
    remembered = judge_quality(THRESHOLDS, BASELINE, tallies, previous and previous.memory)
    assert drifting(fresh) <= drifting(remembered) <= drifting(fresh) | drifting(previous)
    assert (remembered.state == DRIFTING) >= (fresh.state == DRIFTING)


def test_a_class_the_report_does_not_name_is_held_to_the_overall_baseline():
    # The build measured the whole traffic below the class floor: a class it does not
    # name falls back to that figure, not to the floor.
    low = QualityBaseline(BaselineAgreement(0.90))
    verdict = judge_quality(THRESHOLDS, low, window(tally(5000, 0.96), {"new": tally(2000, 0.90)}))
    assert verdict.state == HEALTHY, verdict.message
    assert verdict.worst_class is not None and verdict.worst_class.threshold == 0.90


def test_a_build_at_or_above_its_floor_on_few_rows_leaves_the_floor_as_the_bar():
    # A perfect build on 13 validation rows: its lower bound is far below the floor, yet
    # the build showed no disagreement to excuse. Live traffic at 0.60 drifts.
    few_rows = QualityBaseline(overall=BaselineAgreement(1.0, samples=13))
    verdict = judge_quality(THRESHOLDS, few_rows, window(tally(5000, 0.60)))
    assert verdict.state == QualityState.DRIFTING
    assert verdict.overall is not None and verdict.overall.threshold == 0.95
