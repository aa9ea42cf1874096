"""One mirrored request: the candidate's answer against the serving engine's, output by
output. Pure (numpy only), the statistics from `kubeinfer.runtime.output_statistics`, the
same definitions as the build's accuracy report.

Outputs are compared by name. An answer whose outputs disagree in kind (an output missing
on one side, another shape or datatype, NaN or an infinity where the other side has a
number) is a mismatch: a disagreement whatever the thresholds, counted as such and never
a crash, with no difference or cosine figure. Otherwise the request yields its largest
element difference, its worst row's cosine over all outputs, and top-1 rows/agreements
over the outputs that have classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from kubeinfer.runtime.output_statistics import compare_arrays

# An output as (v2 datatype, array), keyed by name: what both sides' answers decode to.
Outputs = Mapping[str, tuple[str, np.ndarray]]


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


def compare_request(serving: Outputs, candidate: Outputs) -> RequestComparison:
    """The candidate's outputs against the serving engine's for one request."""
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
    return RequestComparison(
        max_abs_difference=max_diff,
        sum_abs_difference=sum_diff,
        elements=elements,
        min_cosine=min_cosine,
        top1_rows=rows,
        top1_agreements=agreements,
    )
