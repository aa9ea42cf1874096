"""CUDA execution slots driven with pycuda: a stream, pinned host buffers, device buffers and
an event per slot, all made once for `max_batch_size` rows.

A `CudaSlot` runs a batch as: async copy of the first n rows of every input (pinned host
-> device) on the slot's stream, the compute (`enqueue(n, slot)`: TensorRT's
`execute_async_v3`, or any kernel launched on `slot.stream_handle`), async copy of the
first n rows of every output back to pinned host memory, an event recorded after it, and a
wait on that event. Each slot has its own stream, so while one slot's copies run another
slot's kernels can (the point of `executionSlots` > 1 on a GPU); the wait releases the GIL
(pycuda's `Event.synchronize` is a threaded call), so slots in worker threads overlap.

Why the primary context, pushed around each call: pycuda keeps a per-thread context stack,
and the batcher calls `run` from worker threads. Retaining the device's primary context
(the one the CUDA runtime, CuPy, PyTorch and TensorRT use) and pushing it for the
duration of each call makes the slot usable from any thread and lets runtime-API
libraries share its allocations and streams.

Why blocking-sync events by default: a spinning wait burns a CPU core per slot in flight,
the cores the HTTP loop and the request codec need; a blocking wait costs some
microseconds of wake-up latency per batch instead.

Why non-blocking streams: a stream created with default flags synchronises with the legacy
default stream, so any work a library queues there (a CuPy or PyTorch call outside a stream
block, a synchronous `cudaMemcpy`) would wait for every slot's batch and make every slot wait
for it, serialising the slots. `CU_STREAM_NON_BLOCKING` opts out of that. The price: work
queued on the default stream is not ordered before a slot's batch either, so whoever
uploads what a compute reads (weights through CuPy or PyTorch) synchronises before the
first batch (`CudaContext.synchronize`, which the TensorRT engine calls after loading the
plan and creating each execution context).

Why a failed batch synchronises before it raises: the host-to-device copies read the pinned
input buffers asynchronously. If the compute raises after they were queued, the slot goes
back to the batcher, which writes the next batch into those buffers while the copy may
still be reading them; waiting for the stream first hands the slot back idle.

The row views and the buffers' allocation are `engines.base`'s (`RowPrefixSlot`,
`batch_buffers`), shared with the ONNX Runtime slot; since then on a GPU too (below).

pycuda is imported lazily and guarded: importing this module never needs it; creating a
context without it (or without a device) raises `BackendUnavailable`.

Ran on an NVIDIA H100 (CUDA 13.0 driver 580, pycuda 2026.1 built there, CuPy 14 computes),
through `make gpu-check`: `CudaSlot` whole (made, `input_views`, `run` eager and with CUDA
Graphs, `close`) but for `run`'s failure branch, and `CudaContext`'s retain, push, pop and
`active`. Never on a GPU: `run`'s failure branch (it ran on a CPU, against a stand-in for
`pycuda.driver` in `tests/runtime/test_gpu_fixes.py`), `CudaContext`'s failure branches,
`synchronize` and `close` (only the TensorRT engine calls them). The `gpu` tests in
`tests/runtime/test_engines_cuda.py` passed, also under compute-sanitizer's memcheck (no
memory error); `tests/benchmarks/gpu_slots.py` counted no pycuda, CuPy or driver
allocation per batch in steady state, and measured the overlap of slots; docs/gpu-check.md
has the figures. On an NVIDIA H200 (2026-11-27), the slots as they are now: flat buffers
with a variable sequence axis (`test_a_sequence_slot_returns_each_batch_at_every_bucket`)
and the other `gpu` tests under memcheck (no memory error), and PyTorch's ResNet-50 and
BERT-base launched on the slots' streams behind the served runtime
(`tests/benchmarks/gpu_data_path.py`: outputs equal to the module run directly). With
TensorRT as the compute (`engines/tensorrt.py`) it never ran.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from kubeinfer.runtime.engines.base import (
    BackendUnavailable,
    BatchShape,
    EngineError,
    RowPrefixSlot,
    TensorSpec,
    UnsupportedModel,
    batch_buffers,
    check_batch_size,
    front_view,
    recently_used,
)
from kubeinfer.runtime.engines.dimensions import named_extents, resolve_item_shape

if TYPE_CHECKING:
    from kubeinfer.runtime.engines.cuda_graphs import SlotGraphs

# cuda.h's CUstream_flags: the stream does not synchronise with the legacy default stream.
# pycuda's `Stream(flags)` passes the flags to cuStreamCreate and defines no constant.
CU_STREAM_NON_BLOCKING = 0x1

SHAPED_VIEWS_KEPT = 512
"""Views a slot of a model with variable axes keeps, most recently used first (one set per
batch rows and shape)."""


def import_pycuda() -> ModuleType:
    """`pycuda.driver`, or `BackendUnavailable` saying how to get it."""
    try:
        import pycuda.driver as cuda
    except ImportError as error:
        raise BackendUnavailable(
            "pycuda is not installed (pip install 'kubeinfer[gpu]'; it builds against the "
            f"CUDA toolkit, so nvcc and the CUDA headers must be present): {error}"
        ) from error
    return cuda


class CudaContext:
    """The primary context of one device, retained once and pushed per call."""

    def __init__(self, device_index: int = 0) -> None:
        cuda = import_pycuda()
        try:
            cuda.init()
            count = cuda.Device.count()
        except Exception as error:  # pycuda's errors, e.g. "cuInit failed: no device"
            raise BackendUnavailable(f"CUDA could not be initialised: {error}") from error
        if not 0 <= device_index < count:
            raise BackendUnavailable(
                f"no CUDA device {device_index}: this machine has {count} device(s)"
            )
        self.cuda = cuda
        self.device = cuda.Device(device_index)
        self._context: Any = self.device.retain_primary_context()

    def push(self) -> None:
        """Makes the primary context current on this thread (pair with `pop`)."""
        self._context.push()

    def pop(self) -> None:
        self.cuda.Context.pop()

    def synchronize(self) -> None:
        """Waits for all work queued in the context (call with it current): the slots'
        non-blocking streams are not ordered after set-up work on other streams."""
        self.cuda.Context.synchronize()

    @contextmanager
    def active(self) -> Iterator[None]:
        """The primary context is current on this thread inside the block."""
        self.push()
        try:
            yield
        finally:
            self.pop()

    def close(self) -> None:
        """Drops our handle on the primary context. It is not released explicitly:
        pycuda's `detach` of a primary context leaves its context stack unbalanced when
        called from a worker thread, and the driver releases it at process exit."""
        self._context = None


# What a slot runs between copy-in and copy-out: enqueue(batch_size, slot) launches work on
# `slot.stream_handle` reading `slot.device_inputs` and writing `slot.device_outputs`.
Enqueue = Callable[[int, "CudaSlot"], None]


class CudaSlot(RowPrefixSlot):
    """One batch in flight on the GPU: pinned host and device buffers for `max_batch_size`
    rows of every input and output, a stream and an event, made once.

    `input_views(n)` are views of the pinned input buffers (write requests there);
    `run(n)` returns views of the pinned output buffers, valid until the next run.

    A model with variable axes besides the batch (a sequence length) gets, per tensor, one
    flat buffer sized for a full batch at its largest item shape (the input's `maxShape`;
    an output's from the input extents it follows). A batch of another shape uses the
    front of it, viewed with the batch's exact shape, and the copies move that many bytes
    only: 32 tokens cost 32 tokens of PCIe, not the longest bucket's. Its `enqueue` reads
    the batch's item shapes from `batch_shape`. With CUDA Graphs, a graph is captured per
    (rows, shape).
    """

    def __init__(
        self,
        context: CudaContext,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        max_batch_size: int,
        enqueue: Enqueue,
        blocking_sync: bool = True,
        capture_graphs: bool = False,
    ) -> None:
        self.context = context
        self._enqueue = enqueue
        self._input_specs, self._output_specs = inputs, outputs
        self.shaped = any(spec.variable for spec in inputs)
        self.batch_shape: BatchShape | None = None
        """The item shape of each input of the batch being queued (None: no variable axes)."""
        sizes = _flat_sizes((*inputs, *outputs), max_batch_size) if self.shaped else None
        cuda = context.cuda
        with context.active():
            # pycuda's pinned arrays (`.base` is their pinned allocation, freed at close)
            pinned = cuda.pagelocked_empty
            if sizes is None:
                self.host_inputs: dict[str, Any] = batch_buffers(inputs, max_batch_size, pinned)
                self.host_outputs: dict[str, Any] = batch_buffers(outputs, max_batch_size, pinned)
            else:
                self.host_inputs = {s.name: pinned((sizes[s.name],), s.dtype) for s in inputs}
                self.host_outputs = {s.name: pinned((sizes[s.name],), s.dtype) for s in outputs}
            for array in (*self.host_inputs.values(), *self.host_outputs.values()):
                array.fill(0)
            self.device_inputs = {
                k: cuda.mem_alloc(max(v.nbytes, 1)) for k, v in self.host_inputs.items()
            }
            self.device_outputs = {
                k: cuda.mem_alloc(max(v.nbytes, 1)) for k, v in self.host_outputs.items()
            }
            self.stream = cuda.Stream(CU_STREAM_NON_BLOCKING)
            flags = cuda.event_flags.DISABLE_TIMING
            if blocking_sync:
                flags |= cuda.event_flags.BLOCKING_SYNC
            self.done = cuda.Event(flags)
        # Device pointers as ints, for TensorRT's set_tensor_address and CuPy/PyTorch views.
        self.input_pointers = {k: int(v) for k, v in self.device_inputs.items()}
        self.output_pointers = {k: int(v) for k, v in self.device_outputs.items()}
        self.stream_handle: int = self.stream.handle
        # Imported here: a slot without graphs needs nothing beyond pycuda.
        self.graphs: SlotGraphs | None = None
        if capture_graphs:
            from kubeinfer.runtime.engines.cuda_graphs import SlotGraphs

            self.graphs = SlotGraphs(self.stream_handle)
        Views = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]
        self._shaped_views: OrderedDict[tuple[int, BatchShape], Views] = OrderedDict()
        if self.shaped:
            self.max_batch_size = max_batch_size
            self._drop_views()
        else:
            self._make_views(self.host_inputs, self.host_outputs, max_batch_size)
        self._closed = False

    def input_views(
        self, batch_size: int, shape: BatchShape | None = None
    ) -> dict[str, np.ndarray]:
        return self._views(batch_size, shape)[0]

    def _views(
        self, batch_size: int, shape: BatchShape | None
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The input and output views of a batch: the first rows of each buffer, or for a
        model with variable axes the front of each buffer in the batch's exact shape."""
        check_batch_size(batch_size, self.max_batch_size)
        if not self.shaped:
            return self._input_views[batch_size], self._output_views[batch_size]
        if shape is None:
            raise EngineError("a model with variable axes needs each batch's shape")
        return recently_used(
            self._shaped_views, (batch_size, shape),
            lambda: self._carve(batch_size, shape), SHAPED_VIEWS_KEPT,
        )  # fmt: skip

    def _carve(
        self, batch_size: int, shape: BatchShape
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        if len(shape) != len(self._input_specs):
            raise EngineError(f"a batch shape has {len(shape)} inputs, the model has "
                              f"{len(self._input_specs)}")  # fmt: skip
        inputs = {
            spec.name: _front(self.host_inputs[spec.name], (batch_size, *item), spec.name)
            for spec, item in zip(self._input_specs, shape, strict=True)
        }
        extents = named_extents([spec.axis_names for spec in self._input_specs], shape)
        outputs = {}
        for spec in self._output_specs:
            item = resolve_item_shape(spec.item_shape, spec.axis_names, extents)
            if item is None:  # an axis named after no input's: nothing tells its extent
                raise EngineError(f"output {spec.name!r}: no input tells its shape")
            outputs[spec.name] = _front(self.host_outputs[spec.name], (batch_size, *item),
                                        spec.name)  # fmt: skip
        return inputs, outputs

    def run(self, batch_size: int, shape: BatchShape | None = None) -> dict[str, np.ndarray]:
        inputs, outputs = self._views(batch_size, shape)
        if self._closed:
            raise EngineError("the slot is closed")
        self.batch_shape = shape if self.shaped else None
        self.context.push()  # push/pop rather than `active()`: no generator per batch
        try:
            if self.graphs is None:
                self._queue_step(batch_size, inputs, outputs)
            else:
                key: Hashable = (batch_size, shape) if self.shaped else batch_size
                self.graphs.queue(key, lambda _: self._queue_step(batch_size, inputs, outputs))
            self.done.record(self.stream)
            self.done.synchronize()
        except BaseException as error:
            # The queued copies may still read the pinned inputs: finish them before the
            # slot is handed back for the next batch to be written there.
            try:
                self.stream.synchronize()
            except Exception as sync_error:  # a sticky CUDA error: the context is lost
                error.add_note(f"Synchronising the slot's stream failed too: {sync_error}")
            raise
        finally:
            self.context.pop()
        return outputs

    def _queue_step(
        self, batch_size: int, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
    ) -> None:
        """Queues one batch's copy-in, compute and copy-out on the slot's stream."""
        cuda = self.context.cuda
        for name, view in inputs.items():
            # A view of the first rows (or the front of a flat buffer) is contiguous: the
            # copy moves the batch's bytes only.
            cuda.memcpy_htod_async(self.device_inputs[name], view, self.stream)
        self._enqueue(batch_size, self)
        for name, view in outputs.items():
            cuda.memcpy_dtoh_async(view, self.device_outputs[name], self.stream)

    def close(self) -> None:
        """Frees the device and pinned buffers now (with the context current, as pycuda
        needs), rather than whenever the garbage collector gets to them."""
        if self._closed:
            return
        self._closed = True
        with self.context.active():
            self.stream.synchronize()
            if self.graphs is not None:
                self.graphs.close()
            for allocation in (*self.device_inputs.values(), *self.device_outputs.values()):
                allocation.free()
            for array in (*self.host_inputs.values(), *self.host_outputs.values()):
                array.base.free()
        self._drop_views()
        self._shaped_views.clear()


def _flat_sizes(specs: tuple[TensorSpec, ...], max_batch_size: int) -> dict[str, int]:
    """Elements of each tensor's flat buffer: a full batch at its largest item shape.
    Raises UnsupportedModel for a tensor whose largest shape is unknown (an output no
    input tells the extents of): a CUDA slot allocates every buffer once, up front."""
    sizes = {}
    for spec in specs:
        largest = spec.largest_item_shape
        if largest is None:
            raise UnsupportedModel(
                f"tensor {spec.name!r} has a variable axis whose largest extent is unknown: "
                "a CUDA slot sizes every buffer once, for the largest batch"
            )
        sizes[spec.name] = max_batch_size * math.prod(largest)
    return sizes


def _front(buffer: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    """`front_view`, or EngineError when the batch is past the buffer."""
    view = front_view(buffer, shape)
    if view is None:
        raise EngineError(f"{name!r} of shape {list(shape)} is past its buffer")
    return view
