"""Probe inputs drawn within each input's valid range, for a model built without data.

Read from the graph, not guessed from names alone:

- token ids: an integer input that reaches the indices of a `Gather` from a table of
  weights (an embedding: word, position or token type), through operators that keep its
  values (Cast, Reshape, Unsqueeze, ...), takes values below the table's size along the
  gathered axis, the smallest such table where it reaches several (`index_bounds`);
- masks: an input named like a mask (`attention_mask`) is all ones (nothing masked);
- images: where the model states its pixel range (ONNX's metadata convention,
  `Image.NominalPixelRange`), floating inputs with the four axes of an image are drawn
  uniformly in it; uint8 inputs take the whole 0..255;
- other floating inputs are standard normal, other integers 0 or 1 (valid as an index
  into any table), strings short words, as the build's synthetic samples are; a
  variable axis besides the batch takes the extent of `calibration.synthetic_samples`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import onnx
from kubeinfer.runtime.building import calibration as cal
from kubeinfer.runtime.engine_manifest import TensorInfo

VALUE_KEEPING_OPERATORS = frozenset(
    {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Transpose"}
)
"""Operators whose output holds its input's values (rearranged): token ids stay token ids."""
MASK_NAME = re.compile(r"mask", re.IGNORECASE)
PIXEL_RANGES = {
    "NominalRange_0_255": (0.0, 255.0),
    "Normalized_0_1": (0.0, 1.0),
    "Normalized_1_1": (-1.0, 1.0),
    "NominalRange_16_235": (16.0, 235.0),
}
"""ONNX's `Image.NominalPixelRange` metadata values and the ranges they name."""


def _table_rows(
    node: onnx.NodeProto, tables: Mapping[str, onnx.TensorProto | onnx.ValueInfoProto]
) -> int | None:
    """The size of the gathered axis of a Gather's data, when that is a known tensor."""
    table = tables.get(node.input[0])
    if table is None:
        return None
    dims = table.dims if isinstance(table, onnx.TensorProto) else None
    if dims is None or not dims:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    return int(dims[axis]) if -len(dims) <= axis < len(dims) else None


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Each graph input that indexes a table of weights (`Gather`), with the number of
    rows of the smallest table it indexes (see the module)."""
    tables: dict[str, onnx.TensorProto | onnx.ValueInfoProto] = {
        t.name: t for t in model.graph.initializer
    }
    for node in model.graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                tables[node.output[0]] = value
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    bounds: dict[str, int] = {}
    for graph_input in model.graph.input:
        pending, seen = [graph_input.name], set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in consumers.get(name, ()):
                if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name:
                    rows = _table_rows(node, tables)
                    if rows is not None:
                        bounds[graph_input.name] = min(rows, bounds.get(graph_input.name, rows))
                elif node.op_type in VALUE_KEEPING_OPERATORS and node.input[0] == name:
                    pending.extend(node.output)
    return bounds


def pixel_range(model: onnx.ModelProto) -> tuple[float, float] | None:
    """The pixel range the model's metadata states (`Image.NominalPixelRange`), if any."""
    for prop in model.metadata_props:
        if prop.key == "Image.NominalPixelRange":
            return PIXEL_RANGES.get(prop.value)
    return None


def draw_probe_inputs(
    model: onnx.ModelProto, inputs: list[TensorInfo], count: int, seed: int = 0
) -> cal.Samples:
    """`count` probes for `model`'s `inputs`, each within its valid range (see the
    module); seeded, so a build draws the same probes every time."""
    samples = cal.synthetic_samples(inputs, count, seed, names=cal.axis_names(model))
    bounds, pixels = index_bounds(model), pixel_range(model)
    rng = np.random.default_rng([seed, 1])
    for spec in inputs:
        array = samples[spec.name]
        if array.dtype.kind == "O":
            continue
        if MASK_NAME.search(spec.name) and array.dtype.kind in "biuf":
            samples[spec.name] = np.ones_like(array)
        elif spec.name in bounds and array.dtype.kind in "iu":
            samples[spec.name] = rng.integers(0, bounds[spec.name], array.shape).astype(array.dtype)
        elif array.dtype == np.uint8:
            samples[spec.name] = rng.integers(0, 256, array.shape).astype(np.uint8)
        elif pixels is not None and array.dtype.kind == "f" and array.ndim == 4:
            low, high = pixels
            samples[spec.name] = rng.uniform(low, high, array.shape).astype(array.dtype)
    return samples
