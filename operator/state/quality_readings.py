"""What the gather step reads for the quality watch: the serving pods' tallies of their
comparisons with the reference over the watch's sliding window, overall, per reference
top-1 class and per slice (`quality.verdict` judges them), or why none could be read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from kubeinfer.operator.api.v1alpha1.enums import QualityGroupKind as GroupKind


@dataclass(frozen=True, order=True)
class QualityGroup:
    """What a tally counts: the whole traffic, one reference top-1 class, or one slice."""

    kind: GroupKind
    name: str

    def __str__(self) -> str:
        return "overall" if self.kind == GroupKind.OVERALL else f"{self.kind} '{self.name}'"


OVERALL = QualityGroup(GroupKind.OVERALL, "")


@dataclass(frozen=True)
class AgreementTally:
    """One group's counts over the window. Sums rather than means, so tallies from
    several pods and scrapes add up."""

    samples: int
    top1_agreements: int
    absolute_difference_sum: float = 0.0
    """Sum over the samples of their compared request's largest |candidate - reference|
    (the runtime's per-request figure, scaled to the rows)."""
    absolute_difference_square_sum: float | None = None
    """Sum of the squares of the same per-sample values; None when not collected."""
    kl_divergence_sum: float | None = None
    """Sum over the samples of KL(reference || candidate); None when not collected."""

    def __post_init__(self) -> None:
        if self.samples < 0 or not 0 <= self.top1_agreements <= self.samples:
            raise ValueError(
                f"{self.top1_agreements} agreements out of {self.samples} samples is no tally"
            )

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_agreements / self.samples if self.samples else None

    @property
    def mean_absolute_difference(self) -> float | None:
        return self.absolute_difference_sum / self.samples if self.samples else None

    @property
    def mean_kl_divergence(self) -> float | None:
        if not self.samples or self.kl_divergence_sum is None:
            return None
        return self.kl_divergence_sum / self.samples


@dataclass(frozen=True)
class RequestTally:
    """The requests the serving pods sampled for the reference over the window, and how
    many of them were compared (the rest were dropped by a full queue, failed or late)."""

    sampled: int
    compared: int

    def effective_percent(self, sample_percent: int) -> float | None:
        """The share of answered requests compared, in percent: sampling takes exactly
        `sample_percent` of every hundred, so it is that share scaled by the compared
        part of the sampled."""
        return sample_percent * self.compared / self.sampled if self.sampled else None


@dataclass(frozen=True)
class WindowTallies:
    """The last windowSeconds of sampled traffic. Class keys are the reference's top-1
    class; slice keys are the slice header's values (with `other` for the rest)."""

    overall: AgreementTally
    by_class: Mapping[str, AgreementTally] = field(default_factory=dict)
    by_slice: Mapping[str, AgreementTally] = field(default_factory=dict)
    requests: RequestTally | None = None
    """The requests sampled and compared; None where not read."""

    def tally(self, group: QualityGroup) -> AgreementTally | None:
        if group.kind == GroupKind.OVERALL:
            return self.overall
        groups = self.by_class if group.kind == GroupKind.CLASS else self.by_slice
        return groups.get(group.name)


@dataclass(frozen=True)
class QualityReading:
    """One pass's read of the watch's window: the tallies, or `error` saying why there are
    none (the source could not answer). `covered_seconds` is how much of the window the
    tallies span (less than the window while the history of a direct read is young)."""

    window: WindowTallies | None = None
    error: str = ""
    covered_seconds: float | None = None
    set_aside: tuple[str, ...] = ()
    """Readings that made no sense (agreements above rows, a negative or NaN count), each
    said in a sentence: the group is left out of the tallies as if unread, the others
    still count (a bad overall reading leaves an empty overall tally)."""


class QualityCounter(StrEnum):
    """One of a group's cumulative counters, as the serving pods export them."""

    ROWS = "rows"
    AGREEMENTS = "agreements"
    DIFFERENCE_SUM = "difference_sum"
    """The per-request largest |difference| histogram's `_sum` (overall only)."""
    DIFFERENCE_COUNT = "difference_count"
    KL_SUM = "kl_sum"
    """The per-request KL divergence histogram's `_sum` (overall only)."""
    KL_COUNT = "kl_count"
    REQUESTS_SAMPLED = "requests_sampled"
    """Answered requests sampled for the reference, whatever became of them (overall only)."""
    REQUESTS_COMPARED = "requests_compared"


CounterKey = tuple[QualityGroup, QualityCounter]


@dataclass(frozen=True)
class QualitySnapshot:
    """One direct read of the serving pods' cumulative counters (since each pod started),
    and when it was taken."""

    time: datetime
    by_pod: Mapping[str, Mapping[CounterKey, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class QualityHistory:
    """What a direct read's sliding window looks back on: the reconciler keeps it between
    passes, one per object, in memory (as the autoscaler's `ScalingHistory`); a restarted
    operator starts with an empty one, and its window fills again. Snapshots are oldest
    first, thinned to a few per window (`metrics.quality` says how), and belong to one
    reference engine: its digest, since another reference's series start from zero."""

    reference_digest: str = ""
    snapshots: tuple[QualitySnapshot, ...] = ()


@dataclass(frozen=True)
class BuildAgreement:
    """The build's own top-1 agreement with fp32 on its validation rows (its accuracy
    report, through the build Job's termination message): overall and per reference
    top-1 class, as (rows, agreements). The quality watch's baseline: the disagreement
    quantisation already showed at build time is not drift. A class the build did not
    report (the message is bounded) falls back to the overall figure."""

    rows: int
    agreements: int
    by_class: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """The compact JSON form, as the build writes it (`byClass`: class -> [rows,
        agreements])."""
        return {
            "rows": self.rows,
            "agreements": self.agreements,
            "byClass": {name: list(tally) for name, tally in sorted(self.by_class.items())},
        }


def _tally(value: Any) -> tuple[int, int] | None:
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    rows, agreements = value
    if type(rows) is not int or type(agreements) is not int or not 0 <= agreements <= rows:
        return None
    return rows, agreements


def parse_build_agreement(document: Any) -> BuildAgreement | None:
    """A `BuildAgreement` from its JSON form, or None when there is none or it makes no
    sense (agreements above rows, a negative count); a class entry that makes no sense is
    left out, so the class falls back to the overall figure."""
    if not isinstance(document, dict):
        return None
    overall = _tally([document.get("rows"), document.get("agreements")])
    if overall is None or overall[0] == 0:
        return None
    classes = document.get("byClass")
    by_class = {
        str(name): tally
        for name, value in (classes.items() if isinstance(classes, dict) else ())
        if (tally := _tally(value)) is not None and tally[0] > 0
    }
    return BuildAgreement(overall[0], overall[1], by_class)
