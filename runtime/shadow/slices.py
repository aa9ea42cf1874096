"""The quality watch's slices: a request header's value as a bounded metric label. Pure.

The header is the caller's, so nothing in it can be trusted. `slice_label` makes a value
a label value that cannot break the exposition or a dashboard: printable ASCII only (any
other character becomes `_`), surrounding blanks stripped, at most `MAX_SLICE_LABEL_CHARS`
characters; an empty result is no slice. `SliceNames` bounds the cardinality: the first
`max_slices` distinct labels keep their name for the life of the watch, any later one and
a request without the header count as `OTHER_SLICE`, so a flood of distinct values adds at
most one series.

Both run on the mirror's side only (for requests the watch sampled), never for every
request: the HTTP layer hands the raw value over as it found it.
"""

from __future__ import annotations

import re

from kubeinfer.contract.metric_series import OTHER_SLICE

MAX_SLICE_LABEL_CHARS = 64
_NOT_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def slice_label(raw: str | None) -> str | None:
    """The label value of a raw header value (see the module); None when there is none."""
    if raw is None:
        return None
    label = _NOT_PRINTABLE.sub("_", raw[: MAX_SLICE_LABEL_CHARS * 4]).strip()
    return label[:MAX_SLICE_LABEL_CHARS] or None


class SliceNames:
    """Names the slices of one watch: the first `max_slices` distinct labels as
    themselves, every other (and none) as `OTHER_SLICE`."""

    def __init__(self, max_slices: int) -> None:
        self.max_slices = max_slices
        self._named: set[str] = set()

    def name_of(self, raw: str | None) -> str:
        label = slice_label(raw)
        if label is None or label == OTHER_SLICE:
            return OTHER_SLICE
        if label in self._named:
            return label
        if len(self._named) < self.max_slices:
            self._named.add(label)
            return label
        return OTHER_SLICE
