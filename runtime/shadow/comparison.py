"""One mirrored request: the candidate's answer against the serving engine's, output by
output. Pure (numpy only), the statistics from `kubeinfer.runtime.output_statistics`, the
same definitions as the build's accuracy report.

Outputs are compared by name. An answer whose outputs disagree in kind (an output missing
on one side, another shape or datatype, NaN or an infinity where the other side has a
number) is a mismatch: a disagreement whatever the thresholds, counted as such and never
a crash, with no difference or cosine figure. Otherwise the request yields its largest
element difference, its worst row's cosine over all outputs, and top-1 rows/agreements
over the outputs that have classes. Discrete outputs (labels, token ids, strings) are
compared by equality (`output_statistics.is_discrete`): each element is a top-1 position
of its own, tallied under the trusted side's value as its class (`label_name`), with no
element difference and no KL divergence.

One side is trusted: the serving engine's answer when judging a shadow candidate, the
candidate's (the reference's) when a quality watch judges the serving engine. Over the
outputs with classes, the trusted side's top-1 class of each row (every position of the
leading dimensions, as top-1 counts them) groups the rows into per-class tallies
(`class_tallies`, `output_statistics.top1_by_reference_class`'s grouping), and
`kl_divergence` is the mean over those rows of KL(trusted || other) (`divergence`:
probabilities or logits, decided per output). With `per_row`, the figures of each batch
row (dimension 0) too, for the quality watch's exemplars (`RowFigures`).

`compare_requests` compares several requests the candidate answered as one (a quality
watch sends its samples together, their rows stacked): each request gets the figures it
would get alone, computed in one numpy pass over the stacked rows and then reduced per
request, since on small outputs the cost is in the number of numpy calls, not in their
size. Where it reads KL's outputs as probabilities or logits, it decides once for the
stacked rows; a non-finite value sends the requests back to be compared one by one, so
that it is a mismatch of its own request only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from kubeinfer.runtime.output_statistics import (
    ArrayStatistics,
    compare_arrays,
    has_classes,
    is_discrete,
    label_name,
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
    position when none disagreed), in the first output with classes; None without. For
    a discrete output, its value's `label_name` (an object array)."""


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

    class_tallies: tuple[tuple[int | str, int, int], ...] = ()
    """(trusted top-1 class, rows, agreements) per class present, by class; the rows add
    up to `top1_rows`. A discrete output's classes are its values (`label_name`)."""

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


def request_rows(outputs: Outputs) -> int | None:
    """The batch rows every tensor of `outputs` shares (dimension 0), or None when they
    do not (or one has no dimension 0)."""
    sizes = {array.shape[0] if array.ndim else None for _, array in outputs.values()}
    if len(sizes) != 1:
        return None
    (size,) = sizes
    return size


class _Figures:
    """Each request's figures, accumulated output by output over the stacked arrays: each
    batch row's figures first (one numpy pass for all requests), then reduced over each
    request's rows (`rows`: how many each has, in order; None: one request, whose figures
    come straight from `compare_arrays`). `batch_rows`: keep per batch row figures too."""

    def __init__(self, count: int, rows: list[int] | None, batch_rows: int | None) -> None:
        self.count = count
        self.rows = None if rows is None else np.array(rows, dtype=np.int64)
        self.offsets = None if rows is None else np.cumsum([0, *rows[:-1]])
        self.max_diff, self.sum_diff = np.zeros(count), np.zeros(count)
        self.elements = np.zeros(count, dtype=np.int64)
        self.min_cosine = np.ones(count)
        self.top1_rows = np.zeros(count, dtype=np.int64)
        self.top1_agreements = np.zeros(count, dtype=np.int64)
        self.kl_sum, self.kl_positions = np.zeros(count), np.zeros(count, dtype=np.int64)
        self.counts: list[dict[int | str, list[int]]] = [{} for _ in range(count)]
        # Per batch row, for the exemplars (batch_rows None: not asked for).
        self.batch_rows = batch_rows
        kept = batch_rows or 0
        self.disagreements = np.zeros(kept, dtype=np.int64)
        self.row_kl_sum = np.zeros(kept)
        self.row_positions = 0
        self.row_max = np.zeros(kept)
        self.reference_class: np.ndarray | None = None

    def _per_request(self, per_row: np.ndarray, reduce: np.ufunc) -> np.ndarray:
        assert self.offsets is not None
        return reduce.reduceat(per_row, self.offsets)

    def add_differences(
        self, reference: np.ndarray, answer: np.ndarray, statistics: ArrayStatistics
    ) -> bool:
        """Adds one output's differences and cosines; False when a request's share of
        them cannot be told apart (a non-finite value both sides hold)."""
        row_max = None
        if self.offsets is not None or self.batch_rows is not None:
            row_max, row_sum = _row_differences(reference, answer)
            if self.offsets is not None and not np.isfinite(row_max).all():
                return False
            if self.batch_rows is not None:
                np.maximum(self.row_max, row_max, out=self.row_max)
        if self.offsets is None:
            self.max_diff[0] = max(self.max_diff[0], statistics.max_abs_difference)
            self.sum_diff[0] += statistics.sum_abs_difference
            self.elements[0] += statistics.elements
            if statistics.cosines.size:
                self.min_cosine[0] = min(self.min_cosine[0], float(statistics.cosines.min()))
        else:
            assert self.rows is not None and row_max is not None
            np.maximum(self.max_diff, self._per_request(row_max, np.maximum), out=self.max_diff)
            self.sum_diff += self._per_request(row_sum, np.add)
            self.elements += self.rows * (statistics.elements // reference.shape[0])
            cosines = self._per_request(statistics.cosines, np.minimum)
            np.minimum(self.min_cosine, cosines, out=self.min_cosine)
        return True

    def add_classes(self, trusted: np.ndarray, other: np.ndarray, agrees: np.ndarray) -> None:
        """Adds one output with classes: its top-1 rows by the trusted side's class (the
        grouping of `output_statistics.top1_by_reference_class`) and its KL divergence."""
        batch_rows, classes_count = trusted.shape[0], trusted.shape[-1]
        classes = trusted.argmax(axis=-1).reshape(batch_rows, -1)
        positions = classes.shape[1]  # top-1 rows per batch row
        agreed = agrees.reshape(batch_rows, positions)
        kl = kl_divergence_rows(trusted, other).reshape(batch_rows, positions)
        row_kl = kl.sum(axis=1) if positions > 1 else kl[:, 0]
        if self.offsets is None:
            keys = classes.ravel()
            self.top1_rows[0] += agreed.size
            self.top1_agreements[0] += int(np.count_nonzero(agreed))
            self.kl_sum[0] += float(row_kl.sum())
            self.kl_positions[0] += kl.size
        else:
            assert self.rows is not None
            request_of_row = np.repeat(np.arange(self.count), self.rows)
            keys = (request_of_row[:, None] * classes_count + classes).ravel()
            row_agreements = agreed.sum(axis=1) if positions > 1 else agreed[:, 0]
            self.top1_rows += self.rows * positions
            self.top1_agreements += self._per_request(row_agreements.astype(np.int64), np.add)
            self.kl_sum += self._per_request(row_kl, np.add)
            self.kl_positions += self.rows * positions
        present, index, counts = np.unique(keys, return_inverse=True, return_counts=True)
        agreements = np.bincount(index[agreed.ravel()], minlength=present.size)
        for key, rows, agreeing in zip(present.tolist(), counts.tolist(), agreements.tolist(),
                                       strict=True):  # fmt: skip
            request, label = divmod(key, classes_count) if self.offsets is not None else (0, key)
            tally = self.counts[request].setdefault(label, [0, 0])
            tally[0] += rows
            tally[1] += agreeing
        if self.batch_rows is not None:
            self.disagreements += positions - agreed.sum(axis=1)
            self.row_kl_sum += row_kl
            self.row_positions += positions
            if self.reference_class is None:
                first = np.where(agreed.all(axis=1), 0, (~agreed).argmax(axis=1))
                self.reference_class = classes[np.arange(batch_rows), first]

    def add_labels(self, trusted: np.ndarray, agrees: np.ndarray) -> None:
        """Adds one discrete output: each element a top-1 position, agreeing where both
        sides are equal (`agrees`, flat), tallied by the trusted side's value."""
        batch_rows = trusted.shape[0]
        agreed = agrees.reshape(batch_rows, -1)
        positions = agreed.shape[1]
        if not positions:
            return
        row_agreements = agreed.sum(axis=1)
        if self.offsets is None:
            requests = np.zeros(agreed.size, dtype=np.int64)
            self.top1_rows[0] += agreed.size
            self.top1_agreements[0] += int(np.count_nonzero(agreed))
        else:
            assert self.rows is not None
            requests = np.repeat(np.arange(self.count), self.rows * positions)
            self.top1_rows += self.rows * positions
            self.top1_agreements += self._per_request(row_agreements.astype(np.int64), np.add)
        values, codes = np.unique(trusted.ravel(), return_inverse=True)
        keys = requests * values.size + codes.ravel()
        present, index, counts = np.unique(keys, return_inverse=True, return_counts=True)
        agreements = np.bincount(index[agreed.ravel()], minlength=present.size)
        for key, rows, agreeing in zip(present.tolist(), counts.tolist(), agreements.tolist(),
                                       strict=True):  # fmt: skip
            request, code = divmod(key, values.size)
            tally = self.counts[request].setdefault(label_name(values[code]), [0, 0])
            tally[0] += rows
            tally[1] += agreeing
        if self.batch_rows is not None:
            self.disagreements += positions - row_agreements
            if self.reference_class is None:
                first = np.where(agreed.all(axis=1), 0, (~agreed).argmax(axis=1))
                labels = trusted.reshape(batch_rows, -1)[np.arange(batch_rows), first]
                self.reference_class = np.array([label_name(v) for v in labels], dtype=object)

    def results(self) -> list[RequestComparison]:
        starts = [0] if self.offsets is None else self.offsets.tolist()
        rows = [self.batch_rows or 0] if self.rows is None else self.rows.tolist()
        kl_sum, kl_positions = self.kl_sum.tolist(), self.kl_positions.tolist()
        row_kl = None
        if self.batch_rows and self.row_positions:
            row_kl = self.row_kl_sum / self.row_positions
        results = []
        for index, (max_diff, sum_diff, elements, cosine, top1_rows, agreements) in enumerate(
            zip(self.max_diff.tolist(), self.sum_diff.tolist(), self.elements.tolist(),
                self.min_cosine.tolist(), self.top1_rows.tolist(),
                self.top1_agreements.tolist(), strict=True)
        ):  # fmt: skip
            row_figures = None
            if self.batch_rows:
                part = slice(starts[index], starts[index] + rows[index])
                classes = self.reference_class
                row_figures = RowFigures(
                    disagreements=self.disagreements[part],
                    kl_divergence=None if row_kl is None else row_kl[part],
                    max_abs_difference=self.row_max[part],
                    reference_class=None if classes is None else classes[part],
                )
            tallies = tuple(
                (label, n, agreed)
                for label, (n, agreed) in sorted(self.counts[index].items(), key=_class_key)
            )
            positions = kl_positions[index]
            results.append(
                RequestComparison(
                    max_abs_difference=max_diff,
                    sum_abs_difference=sum_diff,
                    elements=elements,
                    min_cosine=cosine,
                    top1_rows=top1_rows,
                    top1_agreements=agreements,
                    class_tallies=tallies,
                    kl_divergence=kl_sum[index] / positions if positions else None,
                    rows=row_figures,
                )
            )
        return results


def _class_key(item: tuple[int | str, list[int]]) -> tuple[int, int, str]:
    """Classes in order: integers by value, then strings by text."""
    label = item[0]
    return (0, label, "") if isinstance(label, int) else (1, 0, label)


def _row_differences(serving: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each batch row's largest and summed element difference (`compare_arrays`' float64
    |difference|; none for a discrete output)."""
    batch_rows = serving.shape[0]
    if is_discrete(serving):
        return np.zeros(batch_rows), np.zeros(batch_rows)
    difference = np.abs(
        serving.reshape(batch_rows, -1).astype(np.float64)
        - candidate.reshape(batch_rows, -1).astype(np.float64)
    )
    if not difference.shape[1]:
        return np.zeros(batch_rows), np.zeros(batch_rows)
    return difference.max(axis=1), difference.sum(axis=1)


def compare_request(
    serving: Outputs, candidate: Outputs, *, trusted: Trusted = "serving", per_row: bool = False
) -> RequestComparison:
    """The candidate's outputs against the serving engine's for one request; `trusted`
    says whose top-1 classes group the rows and whose distribution KL measures from;
    `per_row` adds each batch row's figures (when every output has the same rows)."""
    return compare_requests((serving,), candidate, trusted=trusted, per_row=per_row)[0]


def compare_requests(
    serving: Sequence[Outputs],
    candidate: Outputs,
    *,
    trusted: Trusted = "serving",
    per_row: bool = False,
) -> list[RequestComparison]:
    """Several requests the candidate answered as one, their rows stacked along dimension
    0 in order (`stack_requests`): each request's figures, as `compare_request` gives
    them, from one pass over the stacked arrays. With more than one request, every tensor
    of a request has its rows (`request_rows`) and the requests share their outputs'
    names, datatypes and trailing shapes."""
    count = len(serving)
    rows: list[int] | None = None
    if count == 1:
        stacked = serving[0]
        batch_rows = request_rows(stacked)
    else:
        rows = [request_rows(outputs) or 0 for outputs in serving]
        if not all(rows):
            raise ValueError("requests compared as one must each have rows in every output")
        stacked = stack_requests(serving)
        batch_rows = sum(rows)
    mismatch = _name_mismatch(stacked, candidate)
    if mismatch is not None:
        return [RequestComparison(mismatch=mismatch)] * count
    figures = _Figures(count, rows, batch_rows if per_row else None)
    for name in sorted(stacked):
        problem = _kind_mismatch(name, stacked[name], candidate[name])
        if problem is not None:
            return [RequestComparison(mismatch=problem)] * count
        reference, answer = stacked[name][1], candidate[name][1]
        if reference.ndim == 0:  # a scalar output: one row of one element
            reference, answer = reference.reshape(1), answer.reshape(1)
        if reference.shape[0] == 0:
            continue
        statistics = compare_arrays(reference, answer)
        if not statistics.finite:
            if count == 1:
                return [RequestComparison(mismatch=f"output {name!r}: NaN or infinity where "
                                          "the other answer has a number")]  # fmt: skip
            return _one_by_one(serving, candidate, trusted, per_row)
        if not figures.add_differences(reference, answer, statistics):
            return _one_by_one(serving, candidate, trusted, per_row)
        sides = (reference, answer) if trusted == "serving" else (answer, reference)
        if statistics.discrete:
            assert statistics.top1 is not None
            figures.add_labels(sides[0], statistics.top1)
        elif statistics.top1 is not None and has_classes(reference.shape):
            figures.add_classes(*sides, statistics.top1)
    return figures.results()


def stack_requests(requests: Sequence[Outputs]) -> dict[str, tuple[str, np.ndarray]]:
    """The requests' tensors of each name, their rows stacked along dimension 0 in order
    (the first request's names and datatypes)."""
    return {
        name: (datatype, np.concatenate([request[name][1] for request in requests]))
        for name, (datatype, _) in requests[0].items()
    }


def unstack(outputs: Outputs, start: int, rows: int) -> dict[str, tuple[str, np.ndarray]]:
    """Rows `start` to `start + rows` of every tensor (views); a tensor without those rows
    is given whole (its comparison then shows a mismatch of shape)."""
    return {
        name: (datatype, array[start : start + rows] if array.ndim else array)
        for name, (datatype, array) in outputs.items()
    }


def _one_by_one(
    serving: Sequence[Outputs], candidate: Outputs, trusted: Trusted, per_row: bool
) -> list[RequestComparison]:
    """Each request on its own: a non-finite value in one request's rows is a mismatch of
    that request only."""
    results, start = [], 0
    for outputs in serving:
        rows = request_rows(outputs) or 0
        answer = unstack(candidate, start, rows)
        results.append(compare_request(outputs, answer, trusted=trusted, per_row=per_row))
        start += rows
    return results


def _name_mismatch(serving: Outputs, candidate: Outputs) -> str | None:
    missing = sorted(set(serving) - set(candidate))
    if missing:
        return f"output {missing[0]!r} is missing from the answer"
    extra = sorted(set(candidate) - set(serving))
    if extra:
        return f"output {extra[0]!r} is not an output of the serving model"
    return None
