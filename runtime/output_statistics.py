"""How far one model's outputs are from another's, on the same inputs: the one definition of
the statistics both the build's accuracy report (`kubeinfer.runtime.building.accuracy`, int8 against
fp32) and the shadow comparison (`kubeinfer.runtime.shadow.comparison`, a candidate against
the serving engine on live requests) report, so that "max abs difference 0.03" or "top-1
agreement 0.98" means the same thing at build time and in a rollout.

Pure numpy, no I/O. Definitions, for a reference and a candidate array of the same shape
whose dimension 0 is the batch ("rows"):

- absolute difference: `|reference - candidate|` per element, in float64. Where both hold
  the same value (the same infinity) or both hold NaN the difference is 0; where only one
  is non-finite it is infinite, and `ArrayStatistics.finite` says so (a NaN the reference
  did not produce is a disagreement, not a number to average).
- cosine similarity per row along dimension 0, each row flattened. Cosine is scale free,
  so one threshold fits models whose outputs have different magnitudes. Two all-zero rows
  are identical (1); a zero row against a non-zero one shares nothing (0); a row whose
  cosine is undefined because of non-finite values is 1 when the two rows are equal and 0
  otherwise.
- top-1 agreement: where the last axis has 2 or more classes (and there is a batch
  dimension before it), the argmax over the last axis per row, rows being every position
  of the leading dimensions (`[batch, classes]`: one per sample; `[batch, tokens, vocab]`:
  one per token). Other shapes (a single score per row, a flat vector) have no top-1.
- top-1 agreement by class: the same rows grouped by the reference's top-1 class (its
  argmax over the last axis), each class with its rows and agreements
  (`top1_by_reference_class`), so a disagreement concentrated on a few classes is not
  averaged away.

Discrete outputs (`is_discrete`: labels, token ids, strings; integer, boolean and BYTES
tensors) have no distance between values: a label 3 is not "closer" to 4 than to 9. They
are compared by equality, each element being one prediction: every element is a top-1
position, agreeing when the two sides hold the same value, grouped by the reference's
value (`label_name`: an integer, or a string's UTF-8 text); a row's cosine is that of the
one-hot encodings of its elements, the share of its elements that are equal; and they add
no element to the absolute differences, which measure numbers only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def is_discrete(array: np.ndarray) -> bool:
    """True for an output compared by equality: integers, booleans, strings (BYTES)."""
    return array.dtype.kind in "biuOSU"


def label_name(value: object) -> int | str:
    """A discrete value as a class name: an integer, or a string's (bytes') text."""
    if isinstance(value, bytes | np.bytes_):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    return int(value)  # type: ignore[call-overload]


def has_classes(shape: tuple[int, ...]) -> bool:
    """True when an output of this shape gets a top-1 agreement: a batch dimension and a
    last axis of 2 or more classes."""
    return len(shape) >= 2 and shape[-1] >= 2


def top1_matches(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray | None:
    """Per row (every leading position), whether the argmax over the last axis agrees;
    None when the shape has no classes (`has_classes`). A discrete output: per element,
    whether the values are equal."""
    if is_discrete(reference):
        return np.asarray(reference == candidate, dtype=bool).ravel()
    if not has_classes(reference.shape):
        return None
    return (reference.argmax(axis=-1) == candidate.argmax(axis=-1)).ravel()


def top1_by_reference_class(
    reference: np.ndarray, candidate: np.ndarray
) -> dict[int | str, tuple[int, int]] | None:
    """Per reference top-1 class (the argmax of the reference's row over the last axis;
    a discrete output's value, `label_name`), the rows of that class and how many of them
    the candidate agrees with, as `{class: (rows, agreements)}`; only classes with a row
    appear, so the rows add up to the number of rows `top1_matches` compares. None when
    the shape has no classes."""
    if is_discrete(reference):
        if reference.shape != candidate.shape:
            raise ValueError(f"shapes differ: {reference.shape} and {candidate.shape}")
        classes, agrees = reference.ravel(), np.asarray(reference == candidate).ravel()
    elif has_classes(reference.shape):
        if reference.shape != candidate.shape:
            raise ValueError(f"shapes differ: {reference.shape} and {candidate.shape}")
        classes = reference.argmax(axis=-1).ravel()
        agrees = classes == candidate.argmax(axis=-1).ravel()
    else:
        return None
    present, index, rows = np.unique(classes, return_inverse=True, return_counts=True)
    agreements = np.bincount(index[agrees], minlength=present.size)
    return {
        label_name(label): (int(count), int(agreed))
        for label, count, agreed in zip(present, rows, agreements, strict=True)
    }


@dataclass(frozen=True, slots=True)
class ArrayStatistics:
    """One output compared: the candidate against the reference."""

    elements: int
    """Elements compared."""

    max_abs_difference: float
    """Largest absolute difference of one element (infinite when `finite` is false)."""

    sum_abs_difference: float
    """Sum of the absolute differences (the mean is this over `elements`)."""

    cosines: np.ndarray
    """Cosine similarity per row along dimension 0."""

    top1: np.ndarray | None
    """Per row of the leading dimensions, whether the argmax agrees; None without classes.
    A discrete output: per element, whether it is equal."""

    discrete: bool = False
    """Compared by equality (`is_discrete`): no element differences, one-hot cosines."""

    @property
    def finite(self) -> bool:
        """False when one array holds NaN or an infinity where the other does not."""
        return bool(np.isfinite(self.max_abs_difference))

    @property
    def mean_abs_difference(self) -> float:
        return self.sum_abs_difference / self.elements if self.elements else 0.0


def _non_finite_differences(ref: np.ndarray, cand: np.ndarray, diff: np.ndarray) -> np.ndarray:
    """The module's rule where the plain difference is not finite: equal values (the same
    infinity) and NaN against NaN differ by 0, anything else by infinity."""
    same = (ref == cand) | (np.isnan(ref) & np.isnan(cand))
    return np.where(same, 0.0, np.where(np.isfinite(diff), diff, np.inf))


def compare_arrays(reference: np.ndarray, candidate: np.ndarray) -> ArrayStatistics:
    """Every statistic of one output; both arrays have the same shape, with at least one row
    (callers check: the accuracy report raises, the shadow counts a mismatch).

    One pass of float64 temporaries shared by all statistics: the shadow calls this once
    per mirrored request, on the serving runtime's CPU."""
    if reference.shape != candidate.shape:
        raise ValueError(f"shapes differ: {reference.shape} and {candidate.shape}")
    if reference.ndim == 0 or reference.shape[0] == 0:
        raise ValueError(f"nothing to compare: shape {reference.shape}")
    if is_discrete(reference):
        return _compare_discrete(reference, candidate)
    rows = reference.shape[0]
    ref = reference.reshape(rows, -1).astype(np.float64)
    cand = candidate.reshape(rows, -1).astype(np.float64)
    with np.errstate(all="ignore"):
        diff = np.abs(ref - cand)
        if diff.size == 0:
            largest, row_equal = 0.0, np.ones(rows, dtype=bool)
        else:
            largest = float(diff.max())  # NaN or inf here when any element is not finite
            if not np.isfinite(largest):
                diff = _non_finite_differences(ref, cand, diff)
                largest = float(diff.max())
            row_equal = diff.max(axis=1) == 0
        norms = np.sqrt(np.einsum("ij,ij->i", ref, ref)) * np.sqrt(
            np.einsum("ij,ij->i", cand, cand)
        )
        cosines = np.einsum("ij,ij->i", ref, cand) / np.where(norms == 0, 1.0, norms)
    # Rounding can leave |cos| a hair off 1 for (anti-)parallel rows; identical rows (two
    # all-zero ones included) are 1 exactly; a zero row against another, or a row whose
    # cosine is undefined for non-finite values, shares nothing.
    cosines = np.clip(cosines, -1.0, 1.0)
    cosines[(norms == 0) | ~np.isfinite(cosines)] = 0.0
    cosines[row_equal] = 1.0
    return ArrayStatistics(
        elements=int(diff.size),
        max_abs_difference=largest,
        sum_abs_difference=float(diff.sum()),
        cosines=cosines,
        top1=top1_matches(reference, candidate),
    )


def _compare_discrete(reference: np.ndarray, candidate: np.ndarray) -> ArrayStatistics:
    """A discrete output (see the module): equality per element, one-hot cosines."""
    rows = reference.shape[0]
    equal = np.asarray(reference == candidate, dtype=bool).reshape(rows, -1)
    cosines = equal.mean(axis=1) if equal.shape[1] else np.ones(rows)
    return ArrayStatistics(
        elements=0,
        max_abs_difference=0.0,
        sum_abs_difference=0.0,
        cosines=cosines.astype(np.float64),
        top1=equal.ravel(),
        discrete=True,
    )
