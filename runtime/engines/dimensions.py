"""Variable axes besides the batch: the names ONNX gives them, the ranges a configuration
states for them, and the sizes they take for one request or one batch. Pure (no numpy,
no engine library): engines size their buffers with it, the batcher groups, pads and
cuts requests with it.

An axis is named by its ONNX symbolic dimension (`sequence_length`). Axes that share a
name have the same extent in every request; that is how an output's axis is known to
follow an input's. A name that is a sum (`past_sequence_length + sequence_length`, as
transformers' exports name a decoder's attention mask and presents) has the sum of its
terms' extents; a term is a name or a whole number. Any other name (`unk__12`, `2*n`)
stands for itself: an axis of its own, whose extent nothing else tells.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kubeinfer.contract.runtime_config import InputShape

_TERM = re.compile(r"[A-Za-z_][A-Za-z0-9_.:]*|[0-9]+")


class ShapeConfigError(ValueError):
    """The configured shape ranges do not fit the model (an engine raises it at load as
    its own `UnsupportedModel`)."""


def sum_terms(name: str) -> tuple[str | int, ...]:
    """The terms of an axis name: `a + b + 1` is ('a', 'b', 1), a plain name is itself, and
    a name that is not a sum of names and numbers is one opaque term."""
    parts = [part.strip() for part in name.split("+")]
    if len(parts) > 1 and all(_TERM.fullmatch(part) for part in parts):
        return tuple(int(part) if part.isdigit() else part for part in parts)
    return (name,)


def evaluate(name: str, values: Mapping[str, int]) -> int | None:
    """The extent of an axis named `name` given the extents of names; None when a term of
    it is unknown. A name known as a whole (an input's axis bears it) is read first."""
    if name in values:
        return values[name]
    total = 0
    for term in sum_terms(name):
        if isinstance(term, int):
            total += term
        elif term in values:
            total += values[term]
        else:
            return None
    return total


@dataclass(frozen=True, slots=True)
class AxisRange:
    """One variable axis of one input: its position after the batch axis, its name, and
    the extents allowed."""

    input: str
    axis: int
    name: str
    low: int
    high: int


def resolve_ranges(
    inputs: Sequence[tuple[str, tuple[int, ...], tuple[str | None, ...]]],
    configured: Sequence[InputShape],
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each input's (min, max) item shape, from the model's item shape (-1 where variable;
    `inputs` as (name, item shape, axis names)) and the configured ranges. Raises
    `ShapeConfigError` naming the input when a variable axis has no range, a range names
    no input or has the wrong number of axes, or disagrees with an axis the model fixes."""
    by_name = {shape.name: shape for shape in configured}
    known = {name for name, _, _ in inputs}
    unknown = sorted(set(by_name) - known)
    if unknown:
        raise ShapeConfigError(
            f"inputShapes names {unknown[0]!r}, which is not an input of the model "
            f"(its inputs: {sorted(known)})"
        )
    ranges = {}
    for name, item, axis_names in inputs:
        shape = by_name.get(name)
        if shape is None:
            variable = [axis_names[i] or f"axis {i + 1}" for i, d in enumerate(item) if d < 0]
            if variable:
                example = "x".join("N" if d < 0 else str(d) for d in item)
                raise ShapeConfigError(
                    f"input {name!r} has variable axes besides the batch ({variable}); state "
                    "its range in inputShapes (minShape, optShape and maxShape of the axes "
                    f"after the batch one), or with --input-shape {name}=MIN:OPT:MAX, each "
                    f"shape written like {example}"
                )
            ranges[name] = (item, item)
            continue
        low, high = tuple(shape.min_shape), tuple(shape.max_shape)
        if len(low) != len(item):
            raise ShapeConfigError(
                f"inputShapes of {name!r} has {len(low)} axes; the input has {len(item)} "
                f"after the batch one (shape {['batch', *(d if d >= 0 else '?' for d in item)]})"
            )
        for axis, (fixed, a, b) in enumerate(zip(item, low, high, strict=True)):
            if fixed >= 0 and not a == b == fixed:
                raise ShapeConfigError(
                    f"inputShapes of {name!r}: axis {axis + 1} is fixed at {fixed} by the "
                    f"model, but its range is {a}..{b}"
                )
        ranges[name] = (low, high)
    return ranges


def variable_axes(
    inputs: Sequence[tuple[str, tuple[int, ...], tuple[str | None, ...]]],
    ranges: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]],
) -> list[AxisRange]:
    """Every variable axis of the inputs with its range (an unnamed one gets a name of its
    own, `input:axis`, so it follows nothing else)."""
    found = []
    for name, item, axis_names in inputs:
        low, high = ranges[name]
        for axis, fixed in enumerate(item):
            if fixed < 0:
                axis_name = axis_names[axis] if axis < len(axis_names) else None
                found.append(
                    AxisRange(name, axis, axis_name or f"{name}:{axis + 1}", low[axis], high[axis])
                )
    return found


def name_bounds(axes: Sequence[AxisRange]) -> dict[str, int]:
    """The largest extent of each axis name: the smallest maximum of the axes bearing it
    (a request must fit every one of them)."""
    bounds: dict[str, int] = {}
    for axis in axes:
        bounds[axis.name] = min(bounds.get(axis.name, axis.high), axis.high)
    return bounds


def largest_extents(axes: Sequence[AxisRange]) -> dict[str, int]:
    """The largest extent each name and each term of a sum name can take together."""
    bounds = name_bounds(axes)
    for axis in axes:
        for term in sum_terms(axis.name):
            if isinstance(term, str) and term not in bounds:
                bounds[term] = axis.high
    return bounds


def resolve_item_shape(
    item: tuple[int, ...], axis_names: tuple[str | None, ...], values: Mapping[str, int]
) -> tuple[int, ...] | None:
    """An item shape with each variable axis sized from the extents of names; None when one
    cannot be (its name, or a term of it, is unknown)."""
    shape = []
    for axis, fixed in enumerate(item):
        if fixed >= 0:
            shape.append(fixed)
            continue
        name = axis_names[axis] if axis < len(axis_names) else None
        extent = None if name is None else evaluate(name, values)
        if extent is None:
            return None
        shape.append(extent)
    return tuple(shape)


def named_extents(
    axis_names: Sequence[tuple[str | None, ...]], item_shapes: Sequence[tuple[int, ...]]
) -> dict[str, int]:
    """The extent of each named variable axis in one batch: the inputs' axis names beside
    the batch's item shape of each input, in the same order."""
    values = {}
    for names, item in zip(axis_names, item_shapes, strict=True):
        for axis, name in enumerate(names):
            if name is not None:
                values[name] = item[axis]
    return values


def elements(shape: Sequence[int]) -> int:
    return math.prod(shape)
