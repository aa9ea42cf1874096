"""ONNX Runtime for models with variable axes besides the batch (a sequence length): the
ranges their tensors take, and an execution slot whose batches differ in shape.

Buffers: each tensor of a slot has one flat buffer, sized for a full batch at its largest
shape (`maxShape`; an output's from the input extents it follows), allocated once. A batch
of another shape uses the front of it, viewed with the batch's exact shape, contiguous: ONNX
Runtime reads and writes tensors of the batch's own size (16 tokens cost 16 tokens, not the
largest length), and a slot never holds more than one full batch at the largest shape. The
buffers' pages are left for the batches to map (the engine allocates them untouched): a
slot whose traffic stays short holds the memory of its short batches, and a slot starts
without writing its worst case (a GPT-2 vocabulary's logits at 256 tokens and 32 rows
are 1.5 GiB); the largest batch's first run pays its page faults once. An
IO binding is made per (rows, shape) the first time it is needed and kept, the most recent
`BINDINGS_KEPT` of them (a binding costs about 0.1 ms; a Transformer's batch, milliseconds).

An output whose axes no input names (`unk__3`) cannot be sized in advance: ONNX Runtime
allocates it on each run and its rows are copied out like the others'.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnxruntime as ort
from kubeinfer.contract.runtime_config import InputShape
from kubeinfer.runtime.engines.base import (
    BatchShape,
    EngineError,
    TensorSpec,
    UnsupportedModel,
    check_batch_size,
    front_view,
    recently_used,
)
from kubeinfer.runtime.engines.dimensions import (
    ShapeConfigError,
    largest_extents,
    named_extents,
    resolve_item_shape,
    resolve_ranges,
    variable_axes,
)

BINDINGS_KEPT = 512
"""IO bindings a slot keeps, most recently used first (one per batch rows and shape)."""


def with_ranges(
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    configured: Sequence[InputShape],
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The specs with each input's allowed range and each output's largest item shape
    (where the inputs tell it); raises UnsupportedModel when the ranges do not fit."""
    described = [(s.name, s.item_shape, s.axis_names) for s in inputs]
    try:
        ranges = resolve_ranges(described, configured)
    except ShapeConfigError as error:
        raise UnsupportedModel(str(error)) from None
    bounds = largest_extents(variable_axes(described, ranges))
    ranged = tuple(
        replace(s, min_item_shape=ranges[s.name][0], max_item_shape=ranges[s.name][1])
        for s in inputs
    )
    sized = tuple(
        replace(s, max_item_shape=resolve_item_shape(s.item_shape, s.axis_names, bounds))
        if s.variable
        else s
        for s in outputs
    )
    return ranged, sized


@dataclass(frozen=True, slots=True)
class _Bound:
    """One (rows, shape)'s binding and the views it binds."""

    binding: ort.IOBinding
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    allocated: tuple[tuple[int, str], ...]
    """(position among the bound outputs, name) of outputs ONNX Runtime allocates."""


class ShapedOnnxRuntimeSlot:
    """A slot whose batches differ in shape (see the module docstring); `allocate` makes
    its buffers (page-touched, aligned). One thread at a time; the views it returns are
    valid until its next run."""

    def __init__(
        self,
        session: ort.InferenceSession,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        max_batch_size: int,
        allocate: Callable[[tuple[int, ...], np.dtype], np.ndarray],
    ) -> None:
        self._session: ort.InferenceSession | None = session
        self._inputs, self._outputs = inputs, outputs
        self.max_batch_size = max_batch_size
        self._buffers = {
            spec.name: allocate((max_batch_size * math.prod(shape),), spec.dtype)
            for spec in (*inputs, *outputs)
            if (shape := spec.largest_item_shape) is not None
        }
        self._bound: OrderedDict[tuple[int, BatchShape], _Bound] = OrderedDict()

    def _view(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        return front_view(self._buffers.get(name), shape)

    def _bind(self, rows: int, shape: BatchShape) -> _Bound:
        session = self._session
        if session is None:
            raise EngineError("the slot is closed")
        binding = session.io_binding()
        inputs = {}
        for spec, item in zip(self._inputs, shape, strict=True):
            view = self._view(spec.name, (rows, *item))
            if view is None:
                raise EngineError(f"input {spec.name!r} of shape {list(item)} is past its buffer")
            binding.bind_input(spec.name, "cpu", 0, view.dtype, view.shape, view.ctypes.data)
            inputs[spec.name] = view
        extents = named_extents([s.axis_names for s in self._inputs], shape)
        outputs, allocated = {}, []
        for position, spec in enumerate(self._outputs):
            sized = resolve_item_shape(spec.item_shape, spec.axis_names, extents)
            view = None if sized is None else self._view(spec.name, (rows, *sized))
            if view is None:
                binding.bind_output(spec.name, "cpu")
                allocated.append((position, spec.name))
            else:
                binding.bind_output(spec.name, "cpu", 0, view.dtype, view.shape, view.ctypes.data)
                outputs[spec.name] = view
        return _Bound(binding, inputs, outputs, tuple(allocated))

    def _entry(self, rows: int, shape: BatchShape | None) -> _Bound:
        check_batch_size(rows, self.max_batch_size)
        if shape is None:
            raise EngineError("a model with variable axes needs each batch's shape")
        return recently_used(
            self._bound, (rows, shape), lambda: self._bind(rows, shape), BINDINGS_KEPT
        )

    def input_views(
        self, batch_size: int, shape: BatchShape | None = None
    ) -> dict[str, np.ndarray]:
        return self._entry(batch_size, shape).inputs

    def run(self, batch_size: int, shape: BatchShape | None = None) -> dict[str, np.ndarray]:
        entry = self._entry(batch_size, shape)
        session = self._session
        if session is None:
            raise EngineError("the slot is closed")
        session.run_with_iobinding(entry.binding)
        if not entry.allocated:
            return entry.outputs
        values = entry.binding.get_outputs()
        outputs = dict(entry.outputs)
        for position, name in entry.allocated:
            outputs[name] = values[position].numpy()
        return {spec.name: outputs[spec.name] for spec in self._outputs}

    def close(self) -> None:
        self._bound.clear()
        self._session = None
