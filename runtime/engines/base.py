"""The engine contract the batcher programs against.

An `Engine` is a loaded model; it hands out `ExecutionSlot`s. A slot owns every buffer a
batch needs, allocated once for `max_batch_size` (and, on GPU, its own CUDA stream), so
the hot path allocates nothing: the batcher copies requests straight into
`slot.input_views(n)`, calls `slot.run(n)`, and copies each request's rows out of the
returned output views before handing the slot to the next batch. One slot runs one batch
at a time; `executionSlots` slots run concurrently.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

# Open Inference Protocol v2 datatypes and their numpy equivalents. BYTES (strings) are
# object arrays of `bytes` (`kubeinfer.runtime.protocol.bytes_tensors`): no fixed size.
V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
NUMPY_TO_V2: dict[np.dtype, str] = {v: k for k, v in V2_TO_NUMPY.items()}


class EngineError(Exception):
    """Base of what an engine raises. The data plane turns it into its own error (a batch
    that failed is every one of its requests' error); nothing here knows HTTP."""


class UnsupportedModel(EngineError):
    """At load: the model cannot be served by this engine (a datatype with no v2
    equivalent, a variable axis with no configured range, no batch dimension).
    A start-up error, so the message names the tensor and what to change."""


class BatchSizeError(EngineError, ValueError):
    """A batch outside 1..max_batch_size was asked of a slot: the batcher's bug, never a
    client's (requests larger than maxBatchSize are refused before they are queued)."""


class BackendUnavailable(EngineError):
    """The backend's libraries (TensorRT, pycuda, a CUDA device) are missing here."""


def check_batch_size(batch_size: int, max_batch_size: int) -> None:
    """Raises `BatchSizeError` unless 1 <= batch_size <= max_batch_size."""
    if not 1 <= batch_size <= max_batch_size:
        raise BatchSizeError(
            f"batch size {batch_size} is outside 1..{max_batch_size} (the slot's buffers "
            f"hold max_batch_size={max_batch_size} rows)"
        )


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: `shape` includes the batch dimension first, as -1, and -1 for
    every other variable axis. For a variable axis, `axis_names` holds the model's name
    for it (None where the axis is fixed or unnamed), one per axis after the batch one,
    and the extents it may take are `min_item_shape`..`max_item_shape` (an input's
    configured range; an output's largest extents, None where the model does not tell)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    axis_names: tuple[str | None, ...] = ()
    min_item_shape: tuple[int, ...] | None = None
    max_item_shape: tuple[int, ...] | None = None

    @property
    def dtype(self) -> np.dtype:
        return V2_TO_NUMPY[self.datatype]

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one batch item (the shape without the batch dimension)."""
        return self.shape[1:]

    @property
    def variable(self) -> bool:
        """An axis besides the batch one is variable."""
        return any(d < 0 for d in self.shape[1:])

    @property
    def largest_item_shape(self) -> tuple[int, ...] | None:
        """The largest item this tensor holds; None when unknown (a variable axis that no
        input's range bounds)."""
        if not self.variable:
            return self.item_shape
        return self.max_item_shape


BatchShape = tuple[tuple[int, ...], ...]
"""The item shape of each input of a batch, in the engine's input order: what a slot of a
model with variable axes is told along with the batch's rows."""


def buffer_bytes(specs: Sequence[TensorSpec], rows: int) -> int:
    """Bytes of buffers holding `rows` rows of each tensor at its largest item shape (a
    tensor of unknown largest shape is left out: its engine allocates it per batch)."""
    total = 0
    for spec in specs:
        shape = spec.largest_item_shape
        if shape is not None:
            total += rows * math.prod(shape) * spec.dtype.itemsize
    return total


def slot_buffer_bytes(engine: Engine) -> int:
    """What one execution slot of `engine` holds in input and output buffers: a full batch
    (`max_batch_size` rows) of every tensor at its largest shape."""
    return buffer_bytes((*engine.inputs, *engine.outputs), engine.max_batch_size)


class ExecutionSlot(Protocol):
    """Preallocated buffers (and a stream) for one batch in flight.

    A model with variable axes besides the batch is also told each batch's `shape` (the
    item shape of each input, `BatchShape`): its views and outputs have that shape, carved
    from buffers sized for the largest allowed one. A model without is called with the
    rows alone."""

    def input_views(
        self, batch_size: int, shape: BatchShape | None = None
    ) -> dict[str, np.ndarray]:
        """Writable views of the first `batch_size` rows of each input buffer."""
        ...

    def run(self, batch_size: int, shape: BatchShape | None = None) -> dict[str, np.ndarray]:
        """Runs the batch in the input buffers; blocks until the outputs are ready and
        returns views of the first `batch_size` rows of each output buffer, valid until
        the slot's next run. Called from a worker thread."""
        ...

    def close(self) -> None: ...


class Engine(Protocol):
    """A loaded model that executes batches up to `max_batch_size`."""

    @property
    def inputs(self) -> tuple[TensorSpec, ...]: ...

    @property
    def outputs(self) -> tuple[TensorSpec, ...]: ...

    @property
    def max_batch_size(self) -> int: ...

    @property
    def default_execution_slots(self) -> int:
        """How many slots serve best when the policy sets none: 2 where a slot's copies
        can overlap another's compute (GPU), 1 where compute already fills every core."""
        ...

    def create_slot(self) -> ExecutionSlot:
        """A new slot with buffers for `max_batch_size` rows."""
        ...

    def close(self) -> None: ...


class EngineBase:
    """What every engine repeats: the `Engine` protocol's tensors and batch size, read-only
    (`_inputs`, `_outputs` and `_max_batch_size`, which the engine's load sets)."""

    _inputs: tuple[TensorSpec, ...]
    _outputs: tuple[TensorSpec, ...]
    _max_batch_size: int

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size


Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


def recently_used(
    cache: OrderedDict[Key, Value], key: Key, make: Callable[[], Value], keep: int
) -> Value:
    """`cache[key]`, made by `make()` the first time it is asked for; the `keep` most
    recently used entries stay (a slot's views or bindings per batch rows and shape)."""
    value = cache.get(key)
    if value is None:
        value = cache[key] = make()
        if len(cache) > keep:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return value


def front_view(buffer: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """The first elements of a flat buffer seen in `shape` (contiguous: a batch of any shape
    at the front of a buffer sized for the largest); None when they do not fit."""
    size = math.prod(shape)
    if buffer is None or size > buffer.size:
        return None
    return buffer[:size].reshape(shape)


Allocate = Callable[[tuple[int, ...], np.dtype], np.ndarray]
"""Makes a buffer of a shape and dtype (aligned host memory, pinned host memory, ...)."""


def batch_buffers(
    specs: Sequence[TensorSpec], rows: int, allocate: Allocate
) -> dict[str, np.ndarray]:
    """A buffer of `rows` rows for each tensor (of fixed item shape), by name."""
    return {s.name: allocate((rows, *s.item_shape), s.dtype) for s in specs}


class RowPrefixSlot:
    """What the slots over buffers of `max_batch_size` rows that never move repeat: a batch
    of n rows is the first n rows of each buffer, seen through one dict of views per n,
    made once (`_make_views`), so a batch allocates nothing. `input_views(n)` returns the
    same dict object (of the same views) on every call with the same n."""

    max_batch_size: int
    _input_views: list[dict[str, np.ndarray]]
    _output_views: list[dict[str, np.ndarray]]

    def _make_views(
        self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], max_batch_size: int
    ) -> None:
        self.max_batch_size = max_batch_size
        # Index n holds the views of the first n rows (index 0 unused).
        self._input_views = [{}]
        self._output_views = [{}]
        for n in range(1, max_batch_size + 1):
            self._input_views.append({k: b[:n] for k, b in inputs.items()})
            self._output_views.append({k: b[:n] for k, b in outputs.items()})

    def _drop_views(self) -> None:
        self._input_views, self._output_views = [{}], [{}]

    def input_views(
        self, batch_size: int, shape: BatchShape | None = None
    ) -> dict[str, np.ndarray]:
        """Writable views of the first `batch_size` rows of each input buffer."""
        check_batch_size(batch_size, self.max_batch_size)
        return self._input_views[batch_size]
