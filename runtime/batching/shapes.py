"""Requests whose inputs differ in a variable axis besides the batch (a sequence length):
which shapes a model accepts, which batch a request may join, and what padding and
cutting back that takes. Pure (numpy only); `ShapePlan.check` runs once per request.

A request's *batch shape* (`BatchShape`, the item shape of each input) is what it shares
a batch with: requests of one batch shape run together (`policy` groups them). Under
`EqualShapes` it is the request's own shape. Under `PadToBuckets` each padded axis name
is rounded up to the next of `shapeBuckets` (powers of two by default), at most the
largest extent the inputs allow, so requests of nearby lengths meet in one batch. A name
is padded when every input axis bearing it belongs to an input with a `padValue`, and it
is never a term of a sum name (a decoder's `past_sequence_length + sequence_length`)
except the last: padding at the end of a sum's last term is padding at the end of the
sum's axis, which a mask input of that axis (padded with 0) then hides. Each output axis
named after a padded name, or a sum of names, is cut back to the request's own extent,
so a client gets exactly what the unpadded request would have returned (up to the
rounding of a larger batch's arithmetic, when the model masks its padding).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from kubeinfer.contract.runtime_config import BatchingPolicy, InputShape, ShapeBatching
from kubeinfer.runtime.batching.assembler import Cut, check_inputs
from kubeinfer.runtime.engines.base import BatchShape, TensorSpec, UnsupportedModel
from kubeinfer.runtime.engines.dimensions import (
    AxisRange,
    evaluate,
    name_bounds,
    resolve_item_shape,
    sum_terms,
    variable_axes,
)
from kubeinfer.runtime.protocol.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What the batcher needs of one checked request of a model with variable axes."""

    batch_shape: BatchShape
    """The batch it joins (its own shape, or its padded one)."""
    cut: Cut = ()
    """How its rows of the batch's outputs are cut back to its own extents."""


def _range_text(spec: TensorSpec) -> str:
    low, high = spec.min_item_shape or spec.item_shape, spec.max_item_shape or spec.item_shape
    axes = [str(a) if a == b else f"{a}..{b}" for a, b in zip(low, high, strict=True)]
    return f"[batch, {', '.join(axes)}]" if axes else "[batch]"


class ShapePlan:
    """The shapes a model's requests may take and the batches they join (see the module).
    Built once at start; raises `UnsupportedModel` when padding is asked for and cannot be
    done safely (nothing padded, an input given a padValue whose axis another input does
    not pad, an output axis named after no input axis)."""

    def __init__(
        self,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        policy: BatchingPolicy,
        input_shapes: Sequence[InputShape] = (),
    ) -> None:
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        self.variable = any(spec.variable for spec in self.inputs)
        described = [(s.name, s.item_shape, s.axis_names) for s in self.inputs]
        ranges = {
            s.name: (s.min_item_shape or s.item_shape, s.max_item_shape or s.item_shape)
            for s in self.inputs
        }
        self._axes = variable_axes(described, ranges) if self.variable else []
        self._bounds = name_bounds(self._axes)
        given = {s.name: s.pad_value for s in input_shapes if s.pad_value is not None}
        padding = self.variable and policy.shape_batching == ShapeBatching.PAD_TO_BUCKETS
        self.padded = _padded_names(self._axes, set(given)) if padding else frozenset()
        self.pad_values: dict[str, float] = {
            name: value for name, value in given.items() if self._pads(name)
        }
        self.buckets = tuple(policy.shape_buckets)
        if padding:
            self._check_padding(given)

    def _pads(self, input_name: str) -> bool:
        return any(
            axis.input == input_name and any(t in self.padded for t in sum_terms(axis.name))
            for axis in self._axes
        )

    def _check_padding(self, given: Mapping[str, float]) -> None:
        unpadded = sorted(set(given) - set(self.pad_values))
        if unpadded:
            raise UnsupportedModel(
                f"input {unpadded[0]!r} has a padValue, but none of its variable axes can be "
                "padded: an axis is padded only when every input bearing its name has a padValue, "
                "and only as the last term of a sum such as a decoder's "
                "'past_sequence_length + sequence_length'"
            )
        if not self.padded:
            raise UnsupportedModel(
                "shapeBatching PadToBuckets pads nothing: give a padValue (in inputShapes) "
                "to every input of each variable axis to pad, e.g. token ids, attention "
                "mask and token types"
            )
        known = {axis.name for axis in self._axes}
        for spec in self.outputs:
            for axis, name in enumerate(spec.axis_names):
                if name is None and spec.item_shape[axis] >= 0:
                    continue
                terms = sum_terms(name) if name else ("?",)
                if name not in known and not all(isinstance(t, int) or t in known for t in terms):
                    raise UnsupportedModel(
                        f"output {spec.name!r} axis {axis + 1} ({name or 'unnamed'}) is named "
                        "after no input axis, so padded requests could not be cut back from "
                        "it; serve this model with shapeBatching EqualShapes"
                    )

    def check(
        self, inputs: Mapping[str, tuple[str, np.ndarray]], max_rows: int
    ) -> tuple[int, RequestShape | None]:
        """Validates one request (`assembler.check_inputs`, then each variable axis
        against its range and the axes of one name against each other); returns its rows
        and, for a model with variable axes, its `RequestShape`. Raises InvalidRequest
        naming the range or the axes that disagree."""
        rows = check_inputs(self.inputs, inputs, max_rows)
        if not self.variable:
            return rows, None
        own = tuple(inputs[spec.name][1].shape[1:] for spec in self.inputs)
        for spec, item in zip(self.inputs, own, strict=True):
            low, high = spec.min_item_shape, spec.max_item_shape
            assert low is not None and high is not None
            if any(not a <= d <= b for d, a, b in zip(item, low, high, strict=True)):
                raise InvalidRequest(
                    f"input {spec.name!r} has shape {[rows, *item]}; this model accepts "
                    f"{_range_text(spec)} (its inputShapes' minShape..maxShape)"
                )
        values = self._extents(own)
        if not self.padded:
            return rows, RequestShape(own)
        padded = self._padded_extents(values)
        batch_shape = tuple(
            _sized(spec, item, padded) for spec, item in zip(self.inputs, own, strict=True)
        )
        return rows, RequestShape(batch_shape, self._cut(values, padded))

    def _extents(self, own: BatchShape) -> dict[str, int]:
        """The extent of each axis name in a request, checked for agreement."""
        values: dict[str, int] = {}
        seen: dict[str, str] = {}
        for axis in self._axes:
            extent = own[self._position(axis.input)][axis.axis]
            if axis.name in values and values[axis.name] != extent:
                raise InvalidRequest(
                    f"input {axis.input!r} has {extent} along its axis {axis.axis + 1} "
                    f"({axis.name}), input {seen[axis.name]!r} {values[axis.name]}; the "
                    "axes of one name must agree"
                )
            values[axis.name], seen[axis.name] = extent, axis.input
        for axis in self._axes:
            terms = sum_terms(axis.name)
            if len(terms) > 1:
                total = evaluate(" + ".join(str(t) for t in terms), _without(values, axis.name))
                if total is not None and total != values[axis.name]:
                    raise InvalidRequest(
                        f"input {axis.input!r} has {values[axis.name]} along its axis "
                        f"{axis.axis + 1} ({axis.name}), but the other inputs make that {total}"
                    )
        return values

    def _position(self, input_name: str) -> int:
        return next(i for i, spec in enumerate(self.inputs) if spec.name == input_name)

    def bucket(self, extent: int, bound: int) -> int:
        """The extent a padded axis of `extent` is rounded up to: the next bucket (powers
        of two without any), never past `bound`."""
        for size in self.buckets:
            if size >= extent:
                return min(size, bound)
        if self.buckets:
            return bound
        return min(1 << max(0, extent - 1).bit_length(), bound)

    def _padded_extents(self, values: Mapping[str, int]) -> dict[str, int]:
        """The extents of a request's batch: padded names rounded up, then each sum name
        re-added, its last term lowered where the sum would pass its axis' maximum."""
        padded = dict(values)
        for name in self.padded:
            if name in values:
                padded[name] = max(values[name], self.bucket(values[name], self._bounds[name]))
        for axis in self._axes:
            terms = sum_terms(axis.name)
            if len(terms) > 1 and isinstance(last := terms[-1], str) and last in self.padded:
                total = evaluate(" + ".join(str(t) for t in terms), _without(padded, axis.name))
                if total is not None and total > axis.high:
                    padded[last] -= total - axis.high
        for axis in self._axes:
            if len(sum_terms(axis.name)) > 1:
                total = evaluate(axis.name, _without(padded, axis.name))
                padded[axis.name] = values[axis.name] if total is None else total
        return padded

    def _cut(self, values: Mapping[str, int], padded: Mapping[str, int]) -> Cut:
        cut = []
        for spec in self.outputs:
            if not spec.variable:
                continue
            own = resolve_item_shape(spec.item_shape, spec.axis_names, values)
            large = resolve_item_shape(spec.item_shape, spec.axis_names, padded)
            if own is not None and own != large:
                cut.append((spec.name, (slice(None), *(slice(0, d) for d in own))))
        return tuple(cut)


def _sized(spec: TensorSpec, own: tuple[int, ...], extents: Mapping[str, int]) -> tuple[int, ...]:
    shape = resolve_item_shape(spec.item_shape, spec.axis_names, extents)
    return own if shape is None else shape


def _without(values: Mapping[str, int], name: str) -> dict[str, int]:
    return {k: v for k, v in values.items() if k != name}


def _padded_names(axes: Sequence[AxisRange], padded_inputs: set[str]) -> frozenset[str]:
    """The plain axis names that may be padded (see the module docstring)."""
    plain = {axis.name for axis in axes if len(sum_terms(axis.name)) == 1}
    allowed = set()
    for name in plain:
        bearers = [axis for axis in axes if axis.name == name]
        sums = [axis for axis in axes if len(terms := sum_terms(axis.name)) > 1 and name in terms]
        if all(axis.input in padded_inputs for axis in bearers) and all(
            sum_terms(axis.name)[-1] == name and axis.input in padded_inputs for axis in sums
        ):
            allowed.add(name)
    return frozenset(allowed)
