"""The quality watch's exemplars: the input rows that disagreed most with the reference in
the current window, and their `.npz` encoding. Pure (numpy only; `now` is passed in).

An exemplar is one batch row of a compared request (that row of every input, copied, so
a kept row never pins the request's whole body), with its figures: how many of its top-1
positions disagreed, its mean KL(reference || serving), its largest element difference,
the reference's top-1 class, its slice, and when it was recorded.

Ranking, worst first: more disagreeing top-1 positions, then the larger KL divergence,
then the larger element difference (so among rows whose top-1 agrees, the ones whose
distribution moved most come first; rows of outputs without classes rank by difference
alone). `ExemplarBuffer` keeps at most `max_exemplars` rows and `max_bytes` of their
tensors: a new row takes the place of the lowest ranked ones only when it ranks strictly
above each of them (on a tie the older stays), and a row recorded `window_seconds` ago
or earlier is evicted, so what is kept always describes the current window.

Exemplars live in memory only: never written to disk or to a log; `GET
/v2/quality/exemplars` (`encode_exemplars`) is the one way out.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

METADATA_KEY = "__metadata__"
"""The `.npz` member holding the exemplars' figures as a JSON array (a 0-d string)."""

Rank = tuple[float, float, float]


def rank_of(disagreements: int, kl_divergence: float | None, max_abs_difference: float) -> Rank:
    """The order exemplars are kept by, larger is worse (see the module)."""
    return (float(disagreements), kl_divergence or 0.0, max_abs_difference)


@dataclass(frozen=True, slots=True)
class Exemplar:
    """One input row that disagreed with the reference, and its figures."""

    inputs: Mapping[str, tuple[str, np.ndarray]]
    """The row of each input, by name, as (v2 datatype, array without the batch axis)."""
    disagreements: int
    kl_divergence: float | None
    max_abs_difference: float
    reference_class: int | str | None
    """The reference's top-1 class index, or a discrete output's value (a label)."""
    slice: str | None
    recorded_at_seconds: float
    """The injected (monotonic) clock's reading when it was recorded: the window's."""
    recorded_unix_seconds: float
    """Wall-clock time it was recorded, for people reading it."""
    nbytes: int

    @property
    def rank(self) -> Rank:
        return rank_of(self.disagreements, self.kl_divergence, self.max_abs_difference)

    def metadata(self) -> dict[str, Any]:
        return {
            "disagreements": self.disagreements,
            "klDivergence": self.kl_divergence,
            "maxAbsDifference": self.max_abs_difference,
            "referenceClass": self.reference_class,
            "slice": self.slice,
            "recordedUnixSeconds": self.recorded_unix_seconds,
            "inputs": {name: {"datatype": datatype, "shape": list(array.shape)}
                       for name, (datatype, array) in self.inputs.items()},
        }  # fmt: skip


class ExemplarBuffer:
    """The worst rows of the current window, bounded in count and bytes (see the module)."""

    def __init__(self, max_exemplars: int, max_bytes: int, window_seconds: float) -> None:
        self.max_exemplars, self.max_bytes, self.window_seconds = (
            max_exemplars, max_bytes, window_seconds,
        )  # fmt: skip
        self._kept: list[Exemplar] = []

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._kept)

    def configure(self, max_exemplars: int, max_bytes: int, window_seconds: float) -> None:
        """New bounds; what no longer fits goes, the lowest ranked first."""
        self.max_exemplars, self.max_bytes, self.window_seconds = (
            max_exemplars, max_bytes, window_seconds,
        )  # fmt: skip
        kept = sorted(self._kept, key=_worst_first)
        while kept and (len(kept) > max_exemplars or sum(e.nbytes for e in kept) > max_bytes):
            kept.pop()
        self._kept = kept

    def _evict(self, now: float) -> None:
        horizon = now - self.window_seconds
        if any(e.recorded_at_seconds <= horizon for e in self._kept):
            self._kept = [e for e in self._kept if e.recorded_at_seconds > horizon]

    def offer(self, rank: Rank, nbytes: int, now: float, make: Callable[[], Exemplar]) -> bool:
        """Keeps the row `make()` builds if it earns a place (only then is it built, so a
        row that would not be kept is never copied); returns whether it was kept."""
        self._evict(now)
        if nbytes > self.max_bytes or self.max_exemplars == 0:
            return False
        if len(self._kept) >= self.max_exemplars and min(e.rank for e in self._kept) >= rank:
            return False  # the common case once full: decided without sorting
        kept = sorted(self._kept, key=_worst_first)
        used = sum(e.nbytes for e in kept)
        while kept and (len(kept) >= self.max_exemplars or used + nbytes > self.max_bytes):
            if kept[-1].rank >= rank:
                return False  # it ranks no higher than what it would replace
            used -= kept.pop().nbytes
        kept.append(make())
        self._kept = kept
        return True

    def current(self, now: float) -> list[Exemplar]:
        """The rows kept in the window ending `now`, worst first."""
        self._evict(now)
        return sorted(self._kept, key=_worst_first)


def _worst_first(exemplar: Exemplar) -> tuple[float, float, float, float]:
    rank = exemplar.rank
    return (-rank[0], -rank[1], -rank[2], exemplar.recorded_at_seconds)


def encode_exemplars(exemplars: Sequence[Exemplar]) -> bytes:
    """The exemplars as an `.npz` (numpy.savez, uncompressed): an input whose rows all
    have one shape and datatype is one array named after the input, the exemplars stacked
    along a new axis 0 in `exemplars`' order (the layout of a calibration file, so the
    array can be fed back to `kubeinfer build --calibration`); otherwise each row is its
    own member, `exemplar_{i}__{input}`. `__metadata__` is a JSON array, one object per
    exemplar in the same order, with its figures. A BYTES input is stored as a unicode
    array of its text (string inputs are UTF-8), which numpy reads without pickles."""
    arrays: dict[str, np.ndarray] = {}
    names = sorted({name for e in exemplars for name in e.inputs})
    for name in names:
        rows = [_storable(e.inputs.get(name)) for e in exemplars]
        shapes = {(r[1].shape, r[1].dtype) for r in rows if r is not None}
        if len(shapes) == 1 and all(r is not None for r in rows):
            arrays[name] = np.stack([r[1] for r in rows if r is not None])
        else:
            for index, row in enumerate(rows):
                if row is not None:
                    arrays[f"exemplar_{index}__{name}"] = row[1]
    arrays[METADATA_KEY] = np.array(json.dumps([e.metadata() for e in exemplars]))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _storable(row: tuple[str, np.ndarray] | None) -> tuple[str, np.ndarray] | None:
    """A row as `.npz` stores it without pickles: a BYTES row as unicode text."""
    if row is None or row[1].dtype.kind != "O":
        return row
    datatype, array = row
    text = [e.decode("utf-8", errors="replace") for e in array.ravel()]
    return datatype, np.array(text, dtype=str).reshape(array.shape)
