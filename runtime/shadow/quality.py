"""The quality watch's running figures: the serving engine judged by its reference.

A quality watch mirrors a share of the answered requests to the same model version's
reference-precision engine through the same `Mirror` as a shadow candidate;
`QualityAggregates` is the `RunningAggregates` of that reference, under the role
`quality`, with the reference as the trusted side (its top-1 classes group the rows, KL is
measured from its distributions) and two additions:

- slices: when the watch names a `sliceHeader`, the header's raw value travels with the
  mirrored request and the top-1 rows are tallied per slice (`SliceNames`: sanitized,
  the first `maxSlices` values by name, the rest and a missing header as `other`);
- exemplars: the input rows that disagreed most within `windowSeconds`
  (`ExemplarBuffer`), served by `GET /v2/quality/exemplars` (`encode_exemplars`).

`status()` is the `GET /v2/quality` body. Its `effectiveSampleRate` is the compared
requests over the requests answered 200 since the watch started (every offer counts,
sampled or not), so it shows how much of the asked share a dropping or failing reference
really delivers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from kubeinfer.contract.runtime_config import QualityWatch
from kubeinfer.runtime.output_statistics import label_name
from kubeinfer.runtime.shadow.aggregates import OUTCOME_KEYS, RunningAggregates, ShadowMetrics
from kubeinfer.runtime.shadow.comparison import Outputs, RequestComparison, RowFigures
from kubeinfer.runtime.shadow.exemplars import (
    Exemplar,
    ExemplarBuffer,
    encode_exemplars,
    rank_of,
)
from kubeinfer.runtime.shadow.slices import SliceNames


class QualityAggregates(RunningAggregates):
    """One quality watch's figures since its reference was read (see the module)."""

    trusted = "candidate"

    def __init__(
        self,
        watch: QualityWatch,
        model: str,
        serving_version: str,
        metrics: ShadowMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(watch.reference, model, serving_version, metrics, role="quality")
        self.watch = watch
        self._clock, self._wall_clock = clock, wall_clock
        self._slice_names = SliceNames(watch.max_slices) if watch.slice_header else None
        self.exemplars = ExemplarBuffer(
            watch.max_exemplars, watch.max_exemplar_bytes, watch.window_seconds
        )
        self.per_row = watch.max_exemplars > 0 and watch.max_exemplar_bytes > 0
        self._sum_element_difference = 0.0
        self._elements = 0

    def configure(self, watch: QualityWatch) -> None:
        """The same watch with new exemplar bounds or window (its slices unchanged)."""
        self.watch = watch
        self.target = watch.reference
        self.exemplars.configure(
            watch.max_exemplars, watch.max_exemplar_bytes, watch.window_seconds
        )
        self.per_row = watch.max_exemplars > 0 and watch.max_exemplar_bytes > 0

    def record_comparison(
        self,
        comparison: RequestComparison,
        serving_seconds: float,
        candidate_seconds: float,
        *,
        slice_value: str | None = None,
        inputs: Outputs | None = None,
    ) -> None:
        if self._closed:
            return
        super().record_comparison(comparison, serving_seconds, candidate_seconds)
        if comparison.mismatch is not None:
            return
        self._sum_element_difference += comparison.sum_abs_difference
        self._elements += comparison.elements
        slice_name = None
        if self._slice_names is not None:
            slice_name = self._slice_names.name_of(slice_value)
            if comparison.top1_rows:
                tally = self.slice_tally(slice_name)
                tally.add(comparison.top1_rows, comparison.top1_agreements)
        if comparison.rows is not None and inputs is not None and self.per_row:
            self._keep_exemplars(comparison.rows, inputs, slice_name)

    def _keep_exemplars(self, rows: RowFigures, inputs: Outputs, slice_name: str | None) -> None:
        count = rows.max_abs_difference.shape[0]
        if any(array.ndim == 0 or array.shape[0] != count for _, array in inputs.values()):
            return  # inputs without the outputs' rows: no row to point at
        row_bytes = sum(array.nbytes // count for _, array in inputs.values()) if count else 0
        now = self._clock()
        for index in range(count):
            kl = None if rows.kl_divergence is None else float(rows.kl_divergence[index])
            difference = float(rows.max_abs_difference[index])
            rank = rank_of(int(rows.disagreements[index]), kl, difference)
            make = partial(self._exemplar, rows, inputs, index, slice_name, now, row_bytes)
            self.exemplars.offer(rank, row_bytes, now, make)

    def _exemplar(
        self,
        rows: RowFigures,
        inputs: Outputs,
        index: int,
        slice_name: str | None,
        now: float,
        nbytes: int,
    ) -> Exemplar:
        """Row `index` of a compared request, its inputs copied."""
        classes, kl = rows.reference_class, rows.kl_divergence
        return Exemplar(
            inputs={name: (datatype, np.array(array[index], copy=True))
                    for name, (datatype, array) in inputs.items()},
            disagreements=int(rows.disagreements[index]),
            kl_divergence=None if kl is None else float(kl[index]),
            max_abs_difference=float(rows.max_abs_difference[index]),
            reference_class=None if classes is None else label_name(classes[index]),
            slice=slice_name,
            recorded_at_seconds=now,
            recorded_unix_seconds=self._wall_clock(),
            nbytes=nbytes,
        )  # fmt: skip

    def exemplars_npz(self) -> bytes:
        """The `GET /v2/quality/exemplars` body (`encode_exemplars`)."""
        return encode_exemplars(self.exemplars.current(self._clock()))

    def status(self) -> dict[str, Any]:
        """The `GET /v2/quality` body for this watch (null where there is no data)."""
        reference, compared = self.target, self.outcomes["compared"]
        valued = compared - self.mismatches
        return {
            "active": True,
            "servingVersion": self.serving_version,
            "reference": {
                "url": reference.url,
                "modelName": reference.model_name,
                "version": reference.candidate_version,
                "digest": reference.candidate_digest,
            },
            "samplePercent": reference.traffic_percent,
            "answered": self.answered,
            "effectiveSampleRate": compared / self.answered if self.answered else None,
            "requests": {OUTCOME_KEYS[o]: n for o, n in self.outcomes.items()},
            "mismatches": self.mismatches,
            "top1": {
                "rows": self.top1_rows,
                "agreements": self.top1_agreements,
                "agreement": self.top1_agreements / self.top1_rows if self.top1_rows else None,
            },
            "meanAbsDifference": self._sum_difference / valued if valued else None,
            "meanElementAbsDifference": (
                self._sum_element_difference / self._elements if self._elements else None
            ),
            "maxAbsDifference": self.max_abs_difference,
            "meanKlDivergence": self.mean_kl_divergence,
            "classes": [
                {"referenceClass": name, **tally.status()}
                for name, tally in sorted(self.classes.items(), key=_class_order)
            ],
            "sliceHeader": self.watch.slice_header,
            "slices": [
                {"slice": name, **tally.status()} for name, tally in sorted(self.slices.items())
            ],
            "windowSeconds": self.watch.window_seconds,
            "exemplars": len(self.exemplars.current(self._clock())),
        }


def _class_order(item: tuple[str, Any]) -> tuple[int, str]:
    name = item[0]
    return (int(name), "") if name.isdigit() else (1 << 62, name)


def inactive_quality_status(serving_version: str) -> dict[str, Any]:
    """The `GET /v2/quality` body while no watch runs."""
    return {
        "active": False,
        "servingVersion": serving_version,
        "reference": None,
        "samplePercent": None,
        "answered": 0,
        "effectiveSampleRate": None,
        "requests": dict.fromkeys(OUTCOME_KEYS.values(), 0),
        "mismatches": 0,
        "top1": {"rows": 0, "agreements": 0, "agreement": None},
        "meanAbsDifference": None,
        "meanElementAbsDifference": None,
        "maxAbsDifference": None,
        "meanKlDivergence": None,
        "classes": [],
        "sliceHeader": None,
        "slices": [],
        "windowSeconds": None,
        "exemplars": 0,
    }
