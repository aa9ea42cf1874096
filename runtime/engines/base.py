"""The engine contract the batcher programs against.

An `Engine` is a loaded model; it hands out `ExecutionSlot`s. A slot owns every buffer a
batch needs, allocated once for `max_batch_size` (and, on GPU, its own CUDA stream), so
the hot path allocates nothing: the batcher copies requests straight into
`slot.input_views(n)`, calls `slot.run(n)`, and copies each request's rows out of the
returned output views before handing the slot to the next batch. One slot runs one batch
at a time; `executionSlots` slots run concurrently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

# Open Inference Protocol v2 datatypes and their numpy equivalents.
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
}
NUMPY_TO_V2: dict[np.dtype, str] = {v: k for k, v in V2_TO_NUMPY.items()}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: `shape` includes the batch dimension first, as -1."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return V2_TO_NUMPY[self.datatype]

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one batch item (the shape without the batch dimension)."""
        return self.shape[1:]


class ExecutionSlot(Protocol):
    """Preallocated buffers (and a stream) for one batch in flight."""

    def input_views(self, batch_size: int) -> dict[str, np.ndarray]:
        """Writable views of the first `batch_size` rows of each input buffer."""
        ...

    def run(self, batch_size: int) -> dict[str, np.ndarray]:
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

    def create_slot(self) -> ExecutionSlot:
        """A new slot with buffers for `max_batch_size` rows."""
        ...

    def close(self) -> None: ...
