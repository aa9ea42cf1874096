"""One mirrored request: the candidate's answer against the serving engine's, output by
output. Pure (numpy only), the statistics from `kubeinfer.runtime.output_statistics`, the
same definitions as the build's accuracy report.

Outputs are compared by name. An answer whose outputs disagree in kind (an output missing
on one side, another shape or datatype, NaN or an infinity where the other side has a
number) is a mismatch: a disagreement whatever the thresholds, counted as such and never
a crash, with no difference or cosine figure. Otherwise the request yields its largest
element difference, its worst row's cosine over all outputs, and top-1 rows/agreements
over the outputs that have classes.

One side is trusted: the serving engine's answer when judging a shadow candidate, the
candidate's (the reference's) when a quality watch judges the serving engine. Over the
outputs with classes, the trusted side's top-1 class of each row (every position of the
leading dimensions, as top-1 counts them) groups the rows into per-class tallies
(`class_tallies`, from `output_statistics.top1_by_reference_class`: the build's
definition), and `kl_divergence` is the mean over those rows of KL(trusted || other)
(`divergence`: probabilities or logits, decided per output). With `per_row`, the figures of
each batch row (dimension 0) too, for the quality watch's exemplars (`RowFigures`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from kubeinfer.runtime.output_statistics import (
    compare_arrays,
    has_classes,
    top1_by_reference_class,
)
from kubeinfer.runtime.shadow.divergence import kl_divergence_rows

# An output as (v2 datatype, array), keyed by name: what both sides' answers decode to.
Outputs = Mapping[str, tuple[str, np.ndarray]]

Trusted = Literal["serving", "candidate"]
"""Whose answer is right when they differ: the serving engine's (a shadow candidate is
judged), or the candidate's (a quality watch's reference judges the serving engine)."""


@dataclass(frozen=True, slots=True)
class RowFigures:
    """Per batch row (dimension 0 of every output) of one request."""

    disagreements: np.ndarray
    """Positions of the row whose top-1 disagreed, over the outputs with classes."""

    kl_divergence: np.ndarray | None
    """The row's mean KL(trusted || other) over those positions; None without classes."""

    max_abs_difference: np.ndarray
    """The row's largest element difference over every output."""

    reference_class: np.ndarray | None
    """The trusted side's top-1 class at the row's first disagreeing position (its first
    position when none disagreed), in the first output with classes; None without."""


@dataclass(frozen=True, slots=True)
class RequestComparison:
    """What one request's answers showed."""

    mismatch: str | None = None
    """Why the outputs disagree in kind (then no figure below is set), or None."""

    max_abs_difference: float = 0.0
    """Largest element difference over every output."""

    sum_abs_difference: float = 0.0
    """Sum of the element differences over every output."""

    elements: int = 0
    """Elements compared over every output."""

    min_cosine: float = 1.0
    """The worst row's cosine similarity over every output."""

    top1_rows: int = 0
    """Rows of outputs with classes (last axis of 2 or more)."""

    top1_agreements: int = 0
    """Of those, the rows whose argmax agreed."""

    class_tallies: tuple[tuple[int, int, int], ...] = ()
    """(trusted top-1 class, rows, agreements) per class present, by class; the rows add
    up to `top1_rows`."""

    kl_divergence: float | None = None
    """Mean over the top-1 rows of KL(trusted || other), in nats; None without classes."""

    rows: RowFigures | None = None
    """Per batch row figures, when asked for (`per_row`) and the request has rows."""


def _kind_mismatch(
    name: str, serving: tuple[str, np.ndarray], candidate: tuple[str, np.ndarray]
) -> str | None:
    (s_type, s_data), (c_type, c_data) = serving, candidate
    if s_type != c_type:
        return f"output {name!r}: datatype {c_type}, the serving model answers {s_type}"
    if s_data.shape != c_data.shape:
        return (
            f"output {name!r}: shape {list(c_data.shape)}, the serving model answers "
            f"{list(s_data.shape)}"
        )
    return None


class _ClassFigures:
    """Accumulates the class-based figures over a request's outputs with classes."""

    def __init__(self, batch_rows: int, per_row: bool) -> None:
        self.counts: dict[int, list[int]] = {}
        self.kl_sum, self.kl_rows = 0.0, 0
        self.per_row = per_row
        self.disagreements = np.zeros(batch_rows, dtype=np.int64)
        self.row_kl_sum = np.zeros(batch_rows)
        self.row_positions = 0
        self.reference_class: np.ndarray | None = None

    def add(self, trusted: np.ndarray, other: np.ndarray) -> None:
        by_class = top1_by_reference_class(trusted, other) or {}
        for label, (count, agreeing) in by_class.items():
            tally = self.counts.setdefault(label, [0, 0])
            tally[0] += count
            tally[1] += agreeing
        batch_rows = trusted.shape[0]
        kl = kl_divergence_rows(trusted, other).reshape(batch_rows, -1)
        self.kl_sum += float(kl.sum())
        self.kl_rows += kl.size
        if self.per_row:
            classes = trusted.argmax(axis=-1).reshape(batch_rows, -1)
            agreed = classes == other.argmax(axis=-1).reshape(batch_rows, -1)
            self.disagreements += (~agreed).sum(axis=1)
            self.row_kl_sum += kl.sum(axis=1)
            self.row_positions += kl.shape[1]
            if self.reference_class is None:
                first = np.where(agreed.all(axis=1), 0, (~agreed).argmax(axis=1))
                self.reference_class = classes[np.arange(batch_rows), first]

    def tallies(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((label, rows, agreed) for label, (rows, agreed) in sorted(self.counts.items()))


def _row_max_differences(serving: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    batch_rows = serving.shape[0]
    difference = np.abs(
        serving.reshape(batch_rows, -1).astype(np.float64)
        - candidate.reshape(batch_rows, -1).astype(np.float64)
    )
    return difference.max(axis=1) if difference.shape[1] else np.zeros(batch_rows)


def compare_request(
    serving: Outputs, candidate: Outputs, *, trusted: Trusted = "serving", per_row: bool = False
) -> RequestComparison:
    """The candidate's outputs against the serving engine's for one request; `trusted`
    says whose top-1 classes group the rows and whose distribution KL measures from;
    `per_row` adds each batch row's figures (when every output has the same rows)."""
    missing = sorted(set(serving) - set(candidate))
    if missing:
        return RequestComparison(mismatch=f"output {missing[0]!r} is missing from the answer")
    extra = sorted(set(candidate) - set(serving))
    if extra:
        return RequestComparison(
            mismatch=f"output {extra[0]!r} is not an output of the serving model"
        )
    max_diff = sum_diff = 0.0
    elements = rows = agreements = 0
    min_cosine = 1.0
    batch_rows = _common_batch_rows(serving) if per_row else None
    figures = _ClassFigures(batch_rows or 0, batch_rows is not None)
    row_max = np.zeros(batch_rows or 0)
    for name in sorted(serving):
        problem = _kind_mismatch(name, serving[name], candidate[name])
        if problem is not None:
            return RequestComparison(mismatch=problem)
        reference, answer = serving[name][1], candidate[name][1]
        if reference.ndim == 0:  # a scalar output: one row of one element
            reference, answer = reference.reshape(1), answer.reshape(1)
        if reference.shape[0] == 0:
            continue
        statistics = compare_arrays(reference, answer)
        if not statistics.finite:
            return RequestComparison(
                mismatch=f"output {name!r}: NaN or infinity where the other answer has a number"
            )
        max_diff = max(max_diff, statistics.max_abs_difference)
        sum_diff += statistics.sum_abs_difference
        elements += statistics.elements
        if statistics.cosines.size:
            min_cosine = min(min_cosine, float(statistics.cosines.min()))
        if statistics.top1 is not None:
            rows += int(statistics.top1.size)
            agreements += int(np.count_nonzero(statistics.top1))
        if has_classes(reference.shape):
            sides = (reference, answer) if trusted == "serving" else (answer, reference)
            figures.add(*sides)
        if batch_rows is not None:
            row_max = np.maximum(row_max, _row_max_differences(reference, answer))
    row_figures = None
    if batch_rows:
        positions = figures.row_positions
        row_figures = RowFigures(
            disagreements=figures.disagreements,
            kl_divergence=figures.row_kl_sum / positions if positions else None,
            max_abs_difference=row_max,
            reference_class=figures.reference_class,
        )
    return RequestComparison(
        max_abs_difference=max_diff,
        sum_abs_difference=sum_diff,
        elements=elements,
        min_cosine=min_cosine,
        top1_rows=rows,
        top1_agreements=agreements,
        class_tallies=figures.tallies(),
        kl_divergence=figures.kl_sum / figures.kl_rows if figures.kl_rows else None,
        rows=row_figures,
    )


def _common_batch_rows(outputs: Outputs) -> int | None:
    """The batch rows every output shares (dimension 0), or None when they do not."""
    sizes = {array.shape[0] if array.ndim else None for _, array in outputs.values()}
    if len(sizes) != 1:
        return None
    (size,) = sizes
    return size
