"""The quality verdict: has a reduced-precision engine drifted from its reference? Pure.

A function of the thresholds, the build's own accuracy report (the baseline), the
tallies of one sliding window of sampled live traffic (overall, per reference top-1
class, per slice) and the previous verdict: the same inputs always give the same verdict,
so it is table-tested without a server.

How it decides, in two sentences: a group (the whole traffic, one reference class, one
slice) with at least minSamples samples drifts when even the upper confidence bound of
its top-1 agreement is below its threshold: its floor (minTop1Agreement for the whole
traffic, minClassAgreement for a class or a slice), or, where the build itself measured
the group below that floor, the build baseline taken at its own lower bound; every bound
is one-sided and exact, at falseAlarmBudget divided by the number of tests made. A
drifting group recovers only when its lower bound is back at or above its threshold, so
a group whose agreement sits on its threshold does not flap.

Why each part:
- The floor is what the user accepts; the baseline only lowers the bar for a class the
  build already measured below its floor, since quantisation's expected disagreement is
  not drift. The baseline is itself an estimate on a few calibration rows per class, so
  it counts at its lower bound: that bound is the slack under the build's figure, and it
  shrinks as the calibration set grows. A class the report does not name, and every
  slice (which has no calibration rows of its own), is held to the overall baseline.
- A slice is held to the per-group floor, minClassAgreement, not to minTop1Agreement: it
  is a sub-population, and may by nature lean on the weaker classes.
- "The upper bound is below the threshold" is decided as the exact binomial test it is
  equivalent to: so few agreements (or fewer) would have less than the per-test
  probability if the group were at its threshold (`bounds` says why exact, not Wilson).
- Bonferroni, not Holm-Bonferroni, across the tests: the verdict asks whether any group
  drifted, and Holm's first step, the only one that answer depends on, is Bonferroni's
  test; Holm would only add groups to the list, at levels that depend on the other
  groups' figures, which the bounds in a message could then not be read against. It
  holds under any dependence between the tests (the classes and slices overlap, and
  each is part of the whole).
- The mean absolute difference is judged on the whole traffic only (a difference's scale
  is the model's, not a class's). When the tally carries its sum of squares it is judged
  like an agreement: too large when its lower bound is above maxMeanAbsoluteDifference,
  back when its upper bound is at or below it, and it counts as one more test. Without
  the sum of squares there is no spread to bound it with, so its point estimate decides
  both ways, as the shadow verdict does; a mean of per-sample averages over minSamples
  samples or more moves little from one evaluation to the next.
- A group in the previous verdict's drifting list that has too few samples now stays
  drifting: too few samples is no evidence that it recovered. What is read of the
  previous verdict is its `QualityMemory`, small enough for the status to keep.

The tallies themselves (`AgreementTally`, `WindowTallies`) are what the gather step
reads, so they live with the other readings, in `state.quality_readings`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.api.v1alpha1.enums import QualityGroupKind as GroupKind
from kubeinfer.operator.api.v1alpha1.enums import QualityState
from kubeinfer.operator.quality.bounds import (
    Bounds,
    at_least_probability,
    at_most_probability,
    exact_bounds,
    mean_bounds,
    one_sided_z,
)
from kubeinfer.operator.state.quality_readings import (
    OVERALL,
    AgreementTally,
    QualityGroup,
    WindowTallies,
)


@dataclass(frozen=True)
class BaselineAgreement:
    """A top-1 agreement from the build's accuracy report (calibration rows)."""

    top1_agreement: float
    samples: int | None = None
    """The calibration rows it was measured on; None takes the figure as exact."""


@dataclass(frozen=True)
class QualityBaseline:
    """The build's accuracy report: the overall agreement and the classes it names."""

    overall: BaselineAgreement
    by_class: Mapping[str, BaselineAgreement] = field(default_factory=dict)

    def for_group(self, group: QualityGroup) -> BaselineAgreement:
        """A class's own figure where the report has one; else, and for every slice, the
        overall figure."""
        if group.kind == GroupKind.CLASS:
            return self.by_class.get(group.name, self.overall)
        return self.overall


@dataclass(frozen=True)
class QualityThresholds:
    """The quality watch's settings, in the units their API fields will have."""

    min_samples: int
    """A group is tested only from this many samples in the window (minSamples)."""
    min_top1_agreement: float
    """Absolute floor for the whole traffic's agreement (minTop1Agreement)."""
    min_class_agreement: float
    """Absolute floor for each reference class's and each slice's (minClassAgreement)."""
    max_mean_absolute_difference: float
    """Ceiling for the whole traffic's mean |difference| (maxMeanAbsoluteDifference)."""
    false_alarm_budget: float = 0.01
    """The chance that one evaluation of traffic that has not drifted raises an alarm,
    shared across every test it makes (family-wise)."""

    def __post_init__(self) -> None:
        if self.min_samples < 1:
            raise ValueError(f"minSamples is at least 1, not {self.min_samples}")
        if not 0.0 < self.false_alarm_budget < 1.0:
            raise ValueError(f"a false-alarm budget lies in (0, 1), not {self.false_alarm_budget}")

    def floor(self, group: QualityGroup) -> float:
        if group.kind == GroupKind.OVERALL:
            return self.min_top1_agreement
        return self.min_class_agreement

    def floor_name(self, group: QualityGroup) -> str:
        return "minTop1Agreement" if group.kind == GroupKind.OVERALL else "minClassAgreement"


@dataclass(frozen=True)
class GroupJudgement:
    """One group's figures and whether it drifts."""

    group: QualityGroup
    samples: int
    top1_agreements: int
    per_test_false_alarm: float
    floor: float
    baseline: float
    baseline_lower_bound: float
    threshold: float
    tested: bool
    drifting: bool

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_agreements / self.samples if self.samples else None

    @property
    def bounds(self) -> Bounds | None:
        """The exact one-sided bounds at the per-test level; None without samples."""
        if not self.samples:
            return None
        return exact_bounds(self.top1_agreements, self.samples, self.per_test_false_alarm)

    @property
    def chance_at_threshold(self) -> float:
        """How likely so few agreements (or fewer) are if the group were at its threshold:
        the smaller, the surer it is below."""
        return at_most_probability(self.top1_agreements, self.samples, self.threshold)

    def describe(self, floor_name: str) -> str:
        agreement, bounds = self.top1_agreement, self.bounds
        if agreement is None or bounds is None:
            figures = "no samples in the window"
        else:
            figures = (
                f"top-1 agreement {agreement:.4f} on {self.samples} samples "
                f"(bounds {bounds.lower:.4f}..{bounds.upper:.4f})"
            )
        if self.baseline >= self.floor:
            bar = f"{floor_name} {self.floor:g}; build baseline {self.baseline:.4f}"
        else:
            bar = f"the lower of {floor_name} {self.floor:g} and build baseline {self.baseline:.4f}"
            if self.baseline_lower_bound < self.baseline:
                bar += f", {self.baseline_lower_bound:.4f} at its lower bound"
        return f"{self.group}: {figures}, threshold {self.threshold:.4f} ({bar})"


@dataclass(frozen=True)
class QualityVerdict:
    """Healthy, Drifting or InsufficientSamples, with the figures that led to it."""

    state: QualityState
    reason: Reason
    message: str
    drifting: tuple[GroupJudgement, ...] = ()
    overall: GroupJudgement | None = None
    worst_class: GroupJudgement | None = None
    worst_slice: GroupJudgement | None = None
    mean_absolute_difference_too_large: bool = False
    tests: int = 0
    per_test_false_alarm: float = 0.0

    @property
    def memory(self) -> QualityMemory:
        """What the next evaluation must know of this one."""
        return QualityMemory(
            frozenset(j.group for j in self.drifting), self.mean_absolute_difference_too_large
        )


@dataclass(frozen=True)
class QualityMemory:
    """What one verdict hands to the next (its hysteresis): the groups found drifting, and
    whether the mean difference was too large. Small enough for the status to keep."""

    drifting: frozenset[QualityGroup] = frozenset()
    difference_too_large: bool = False


def judge_quality(
    thresholds: QualityThresholds,
    baseline: QualityBaseline,
    window: WindowTallies,
    previous: QualityMemory | None = None,
) -> QualityVerdict:
    """The verdict on one window of tallies; `previous` is what the last verdict given on
    this engine left (`QualityVerdict.memory`; None on its first evaluation)."""
    was_drifting = set(previous.drifting) if previous else set()
    difference_was_too_large = bool(previous and previous.difference_too_large)
    groups = _groups(window, was_drifting)
    tested = [g for g in groups if _samples(window, g) >= thresholds.min_samples]
    difference_tested = (
        OVERALL in tested and window.overall.absolute_difference_square_sum is not None
    )
    tests = len(tested) + int(difference_tested)
    per_test = thresholds.false_alarm_budget / max(1, tests)
    judgements = [
        _judge_group(g, thresholds, baseline, window, per_test, g in was_drifting) for g in groups
    ]
    too_large = _difference_too_large(
        thresholds, window.overall, one_sided_z(per_test), difference_was_too_large
    )
    drifting = tuple(j for j in judgements if j.drifting)
    by_group = {j.group: j for j in judgements}
    verdict = QualityVerdict(
        state=QualityState.HEALTHY,
        reason=Reason.QUALITY_HEALTHY,
        message="",
        drifting=drifting,
        overall=by_group.get(OVERALL),
        worst_class=_worst(judgements, GroupKind.CLASS),
        worst_slice=_worst(judgements, GroupKind.SLICE),
        mean_absolute_difference_too_large=too_large,
        tests=tests,
        per_test_false_alarm=per_test,
    )
    return _with_outcome(verdict, thresholds, window, judgements)


def _groups(window: WindowTallies, was_drifting: Iterable[QualityGroup]) -> list[QualityGroup]:
    """Every group with samples, and every group drifting before (even without samples),
    in a stable order: overall, then classes, then slices, each by name."""
    present = {OVERALL}
    present.update(QualityGroup(GroupKind.CLASS, name) for name in window.by_class)
    present.update(QualityGroup(GroupKind.SLICE, name) for name in window.by_slice)
    present.update(was_drifting)
    order = {GroupKind.OVERALL: 0, GroupKind.CLASS: 1, GroupKind.SLICE: 2}
    return sorted(present, key=lambda g: (order[g.kind], g.name))


def _samples(window: WindowTallies, group: QualityGroup) -> int:
    tally = window.tally(group)
    return tally.samples if tally else 0


def _judge_group(
    group: QualityGroup,
    thresholds: QualityThresholds,
    baseline: QualityBaseline,
    window: WindowTallies,
    per_test_false_alarm: float,
    was_drifting: bool,
) -> GroupJudgement:
    reference = baseline.for_group(group)
    baseline_lower = reference.top1_agreement
    if reference.samples:
        reference_agreements = round(reference.top1_agreement * reference.samples)
        measured = exact_bounds(reference_agreements, reference.samples, per_test_false_alarm)
        baseline_lower = min(baseline_lower, measured.lower)
    floor = thresholds.floor(group)
    # The baseline only lowers the bar for a group the build itself measured below its
    # floor: a build at or above it leaves the floor as the bar, however few its rows
    # (the lower bound of a perfect build on a dozen rows would otherwise undo the floor).
    threshold = floor if reference.top1_agreement >= floor else min(floor, baseline_lower)
    tally = window.tally(group) or AgreementTally(0, 0)
    agreements, samples = tally.top1_agreements, tally.samples
    tested = samples >= thresholds.min_samples
    if not tested:
        drifting = was_drifting  # too few samples is no evidence either way
    elif was_drifting:
        # Back only when confidently back: the lower bound at or above the threshold.
        drifting = at_least_probability(agreements, samples, threshold) > per_test_false_alarm
    else:
        # The upper bound below the threshold.
        drifting = at_most_probability(agreements, samples, threshold) < per_test_false_alarm
    return GroupJudgement(
        group=group,
        samples=samples,
        top1_agreements=agreements,
        per_test_false_alarm=per_test_false_alarm,
        floor=floor,
        baseline=reference.top1_agreement,
        baseline_lower_bound=baseline_lower,
        threshold=threshold,
        tested=tested,
        drifting=drifting,
    )


def _difference_too_large(
    thresholds: QualityThresholds, overall: AgreementTally, z: float, was_too_large: bool
) -> bool:
    mean = overall.mean_absolute_difference
    if mean is None or overall.samples < thresholds.min_samples:
        return was_too_large
    limit = thresholds.max_mean_absolute_difference
    if overall.absolute_difference_square_sum is None:
        return mean > limit
    bounds = mean_bounds(
        overall.absolute_difference_sum,
        overall.absolute_difference_square_sum,
        overall.samples,
        z,
    )
    return bounds.upper > limit if was_too_large else bounds.lower > limit


def _worst(judgements: Iterable[GroupJudgement], kind: GroupKind) -> GroupJudgement | None:
    """The tested group of this kind surest to be below its threshold."""
    candidates = [j for j in judgements if j.group.kind == kind and j.tested]
    return min(candidates, key=lambda j: (j.chance_at_threshold, j.group.name), default=None)


def _with_outcome(
    verdict: QualityVerdict,
    thresholds: QualityThresholds,
    window: WindowTallies,
    judgements: list[GroupJudgement],
) -> QualityVerdict:
    """The state, reason and message that the judgements add up to."""

    def tested(kind: GroupKind) -> int:
        return sum(1 for j in judgements if j.group.kind == kind and j.tested)

    level = (
        f"{verdict.tests} tests at a false-alarm budget of {thresholds.false_alarm_budget:g} "
        f"({verdict.per_test_false_alarm:.3g} each); {tested(GroupKind.CLASS)} of "
        f"{len(window.by_class)} classes and {tested(GroupKind.SLICE)} of "
        f"{len(window.by_slice)} slices had minSamples {thresholds.min_samples}"
    )
    difference = _difference_figures(thresholds, window.overall)
    if verdict.drifting:
        parts = [j.describe(thresholds.floor_name(j.group)) for j in verdict.drifting]
        if verdict.mean_absolute_difference_too_large:
            parts.append(difference)
        state, reason = QualityState.DRIFTING, Reason.QUALITY_DRIFT
        message = f"Top-1 agreement drifted: {'; '.join(parts)}. {level}."
    elif verdict.mean_absolute_difference_too_large:
        state, reason = QualityState.DRIFTING, Reason.MEAN_ABSOLUTE_DIFFERENCE_TOO_LARGE
        message = f"The mean absolute difference drifted: {difference}. {level}."
    elif verdict.tests == 0:
        state, reason = QualityState.INSUFFICIENT_SAMPLES, Reason.INSUFFICIENT_SAMPLES
        message = (
            f"{window.overall.samples} of minSamples {thresholds.min_samples} samples in "
            "the window; nothing is judged yet."
        )
    else:
        named = [
            f"{title}{j.describe(thresholds.floor_name(j.group))}"
            for title, j in (
                ("", verdict.overall),
                ("worst ", verdict.worst_class),
                ("worst ", verdict.worst_slice),
            )
            if j is not None
        ]
        state, reason = QualityState.HEALTHY, Reason.QUALITY_HEALTHY
        message = f"No drift: {'; '.join([*named, difference])}. {level}."
    return replace(verdict, state=state, reason=reason, message=message)


def _difference_figures(thresholds: QualityThresholds, overall: AgreementTally) -> str:
    mean = overall.mean_absolute_difference
    figures = "no samples" if mean is None else f"{mean:.4g}"
    text = (
        f"mean |diff| {figures} against maxMeanAbsoluteDifference "
        f"{thresholds.max_mean_absolute_difference:g}"
    )
    kl = overall.mean_kl_divergence
    return text if kl is None else f"{text}, mean KL divergence {kl:.4g}"
