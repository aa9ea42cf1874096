"""The ONNX Runtime CPU engine: execution slots over preallocated, reused numpy buffers.

Why IO binding, and one binding per batch size: `InferenceSession.run` allocates every
output array on each call and converts every input, and rebinding an `IOBinding` costs
more than the run itself on a small model (measured: tiny MLP, batch 1: `run` 33 us,
rebinding then running 70 us, a binding made once and reused 17 us). So each slot
allocates its input and output buffers once for `max_batch_size` rows, and at creation
builds, for every batch size n, an `IOBinding` of views of the first n rows plus the
dict of those views. `run(n)` is then a single `run_with_iobinding` on a ready binding:
ONNX Runtime reads the input rows in place and writes the outputs straight into the
slot's buffers; no tensor buffer is allocated on the hot path (a test counts them).
Making a slot's bindings costs ~0.1 ms per batch size (136 ms for maxBatchSize 1024),
once, at start.

Sessions: one `InferenceSession` shared by every slot by default (ONNX Runtime's `Run`
is thread-safe; each slot has its own bindings and buffers). A session per slot is
available (`session_per_slot=True`) and gives each slot its own intra-op thread pool, but
a copy of the weights per slot, and was no faster: on 2 cores, two slots in two threads
(small MLP, 1 intra-op thread) ran 2571 vs 2333 rows/s at batch 8 and 5082 vs 4575 at
batch 32, shared vs per slot, and the memory-bound MLP's process held 298 vs 455 MiB with
two slots (`tests/benchmarks/ort_slots.py`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from kubeinfer.contract.runtime_config import InputShape
from kubeinfer.runtime.engines.base import (
    BatchShape,
    EngineBase,
    EngineError,
    RowPrefixSlot,
    TensorSpec,
    UnsupportedModel,
    batch_buffers,
    check_batch_size,
)
from kubeinfer.runtime.engines.onnx_text import (
    STRING_TYPE,
    empty_strings,
    load_hint,
    non_tensor_message,
    open_session,
    run_unbound,
)
from kubeinfer.runtime.engines.onnxruntime_shapes import ShapedOnnxRuntimeSlot, with_ranges

# ONNX Runtime's type strings with a v2 datatype; anything else (bfloat16, fp8, sequences,
# maps) is refused at load with `UnsupportedModel`. Strings are BYTES (`onnx_text`).
ORT_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    STRING_TYPE: "BYTES",
}

# Buffers start on a cache-line boundary, as MLAS's own allocations do.
_ALIGNMENT = 64


def serving_session_options(intra_op_threads: int | None) -> ort.SessionOptions:
    """Options for serving: full graph optimisation, sequential execution (one batch
    never needs inter-op parallelism; concurrency comes from slots), the memory arena and
    memory patterns kept on (intermediates are reused across runs), warnings silenced.

    `intra_op_threads` None keeps ONNX Runtime's default (one thread per physical core).
    Spinning is off when the pool has workers: a worker that spins after its share of a
    batch burns a core the HTTP loop and the other slots need (serving shares the CPU).
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if intra_op_threads is not None:
        if intra_op_threads < 1:
            raise ValueError(f"intra_op_threads must be at least 1, got {intra_op_threads}")
        options.intra_op_num_threads = intra_op_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_cpu_mem_arena = True
    options.enable_mem_pattern = True
    options.log_severity_level = 3
    return options


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, touch: bool = True) -> np.ndarray:
    """A C-contiguous array on a 64-byte boundary with every page touched now, so the
    first batch pays no page faults (np.zeros/np.empty map pages lazily); with `touch`
    off, its pages are mapped as they are first written. A string tensor's buffer is an
    object array of empty bytes."""
    if dtype.kind == "O":
        return empty_strings(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % _ALIGNMENT
    array = raw[offset : offset + nbytes].view(dtype).reshape(shape)
    if touch:
        array.fill(0)
    return array


def _untouched(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A variable-shape slot's buffer: sized for the largest batch, its pages mapped as
    batches first reach them, so a slot holds what its traffic has used, not the worst
    case, and starts without writing it all (`onnxruntime_shapes`)."""
    return aligned_empty(shape, dtype, touch=False)


def _tensor_specs(
    args: Sequence[ort.NodeArg], kind: str
) -> tuple[tuple[TensorSpec, ...], list[str]]:
    """TensorSpecs for a session's inputs or outputs, and the names of those whose item
    shape is not static in the model (outputs can be resolved by a probe run)."""
    specs, unresolved = [], []
    for arg in args:
        datatype = ORT_TO_V2.get(arg.type)
        if datatype is None:
            raise UnsupportedModel(
                non_tensor_message(kind, arg.name, arg.type)
                or f"{kind} {arg.name!r} has type {arg.type}, which has no Open Inference "
                f"Protocol datatype; supported: {', '.join(sorted(ORT_TO_V2))}"
            )
        shape = list(arg.shape)
        if not shape:
            raise UnsupportedModel(
                f"{kind} {arg.name!r} is a scalar; a batch dimension (first) is required"
            )
        if isinstance(shape[0], int):
            raise UnsupportedModel(
                f"{kind} {arg.name!r} has a fixed first dimension ({shape[0]}); export the "
                "model with a dynamic batch dimension (e.g. dynamic_axes={0: 'batch'})"
            )
        item = [d if isinstance(d, int) and d >= 0 else -1 for d in shape[1:]]
        # A variable axis keeps the model's name for it (None when it has none).
        names = tuple(d if isinstance(d, str) and d else None for d in shape[1:])
        if -1 in item:
            unresolved.append(arg.name)
        specs.append(TensorSpec(arg.name, datatype, (-1, *item), names if -1 in item else ()))
    return tuple(specs), unresolved


def _model_specs(
    session: ort.InferenceSession, input_shapes: Sequence[InputShape] | None
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The session's input and output specs: with variable input axes, each input's range
    from `input_shapes` and each output's largest shape (`onnxruntime_shapes`; None: not
    asked for, the structure alone is checked); without, outputs the model leaves
    symbolic are read from a probe run."""
    inputs, variable = _tensor_specs(session.get_inputs(), "input")
    outputs, unresolved = _tensor_specs(session.get_outputs(), "output")
    if input_shapes is None and variable:
        return inputs, outputs
    if variable or input_shapes:
        ranged, sized = with_ranges(inputs, outputs, input_shapes or ())
        if variable:
            if any(s.dtype.kind == "O" for s in (*inputs, *outputs) if s.variable):
                raise UnsupportedModel(
                    "a string tensor with variable axes besides the batch cannot be served"
                )
            return ranged, sized
    if unresolved:
        outputs = _probe_output_specs(session, inputs, outputs, unresolved)
    return inputs, outputs


def _probe_output_specs(
    session: ort.InferenceSession,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    unresolved: list[str],
) -> tuple[TensorSpec, ...]:
    """Output shapes the model leaves symbolic, read from one run on a batch of two rows
    of zeros (two, so that an output whose first dimension does not follow the batch is
    caught)."""
    feed = {s.name: aligned_empty((2, *s.item_shape), s.dtype) for s in inputs}
    try:
        results = session.run([s.name for s in outputs], feed)
    except Exception as error:  # ONNX Runtime raises its own exception types
        raise UnsupportedModel(
            f"outputs {unresolved} have no static shape and a probe run failed: {error}"
        ) from error
    probed = []
    for spec, result in zip(outputs, results, strict=True):
        if result.ndim == 0 or result.shape[0] != 2:
            raise UnsupportedModel(
                f"output {spec.name!r} does not follow the batch (shape {result.shape} "
                "for a batch of 2); every output needs the batch dimension first"
            )
        probed.append(TensorSpec(spec.name, spec.datatype, (-1, *result.shape[1:])))
    return tuple(probed)


def check_servable(path: str | os.PathLike[str]) -> None:
    """Raises `UnsupportedModel` (or FileNotFoundError) when `kubeinfer serve` would refuse
    to load the ONNX model at `path`: it is loaded exactly as serving loads it, by
    `OnnxRuntimeEngine` (datatypes with a v2 equivalent, a dynamic batch dimension first,
    outputs that follow the batch; variable input axes besides the batch are allowed, their
    ranges being the serving configuration's). `kubeinfer build`
    runs it on the source model before building, so a build and the serving that follows
    cannot disagree about a model."""
    OnnxRuntimeEngine(path, max_batch_size=1, intra_op_threads=1, input_shapes=None).close()


class OnnxRuntimeSlot(RowPrefixSlot):
    """Buffers for `max_batch_size` rows and, per batch size, a ready IO binding.

    `input_views(n)` and `run(n)` return the same dict objects (of the same views) on
    every call with the same n: treat them as read-only mappings. One thread at a time.
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        max_batch_size: int,
    ) -> None:
        self._session: ort.InferenceSession | None = session
        self.input_buffers = batch_buffers(inputs, max_batch_size, aligned_empty)
        self.output_buffers = batch_buffers(outputs, max_batch_size, aligned_empty)
        # IO binding takes no string tensor: such a model runs on the views unbound.
        self._unbound = any(s.dtype.kind == "O" for s in (*inputs, *outputs))
        self._make_views(self.input_buffers, self.output_buffers, max_batch_size)
        self._bindings: list[ort.IOBinding | None] = [None]  # index n: n rows (0 unused)
        for n in range(1, max_batch_size + 1):
            self._bindings.append(None if self._unbound else self._bind(session, n))

    def _bind(self, session: ort.InferenceSession, n: int) -> ort.IOBinding:
        binding = session.io_binding()
        for name, view in self._input_views[n].items():
            binding.bind_input(name, "cpu", 0, view.dtype, view.shape, view.ctypes.data)
        for name, view in self._output_views[n].items():
            binding.bind_output(name, "cpu", 0, view.dtype, view.shape, view.ctypes.data)
        return binding

    def run(self, batch_size: int, shape: BatchShape | None = None) -> dict[str, np.ndarray]:
        check_batch_size(batch_size, self.max_batch_size)
        if self._session is None:
            raise EngineError("the slot is closed")
        if self._unbound:
            names = list(self.output_buffers)
            return run_unbound(self._session, names, self._input_views[batch_size])
        # No RunOptions: in ONNX Runtime 1.31 passing one costs ~150 us per call (its
        # Python wrapper looks up a missing config key, which raises and is caught).
        self._session.run_with_iobinding(self._bindings[batch_size])
        return self._output_views[batch_size]

    def close(self) -> None:
        """Drops the bindings (and the slot's own session, if it has one)."""
        self._bindings = [None]
        self._session = None


class OnnxRuntimeEngine(EngineBase):
    """An ONNX model on ONNX Runtime's CPU execution provider.

    The model must have a dynamic first (batch) dimension on every input and output. Its
    other input axes are fixed, or variable within the ranges of `input_shapes` (then its
    slots are `ShapedOnnxRuntimeSlot`s; outputs follow the input axes they are named
    after); outputs left symbolic by the exporter of a model without variable input axes
    are resolved by one probe run at load. `intra_op_threads` sizes the thread pool of each
    session: with a shared session (the default) all slots draw on that one pool; with
    `session_per_slot=True` each slot gets a session and a pool of that size.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_batch_size: int,
        intra_op_threads: int | None = None,
        session_per_slot: bool = False,
        input_shapes: Sequence[InputShape] | None = (),
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self._path = str(Path(path))
        self._max_batch_size = max_batch_size
        self._intra_op_threads = intra_op_threads
        self._session_per_slot = session_per_slot
        self._session: ort.InferenceSession | None = self._new_session()
        self._inputs, self._outputs = _model_specs(self._session, input_shapes)
        self._shaped = any(s.variable for s in self._inputs)
        if session_per_slot:
            self._session = None  # each slot loads its own; the probe session is dropped

    def _new_session(self) -> ort.InferenceSession:
        try:
            return open_session(
                self._path,
                serving_session_options(self._intra_op_threads),
                providers=["CPUExecutionProvider"],
            )
        except FileNotFoundError:
            raise
        except Exception as error:  # ONNX Runtime raises its own exception types
            if not Path(self._path).is_file():
                raise FileNotFoundError(f"no model file at {self._path}") from error
            raise UnsupportedModel(
                f"ONNX Runtime cannot load {self._path}: {error}{load_hint(str(error))}"
            ) from error

    @property
    def default_execution_slots(self) -> int:
        # One session's intra-op threads already use every core; a second concurrent batch
        # would only split the queue into smaller batches.
        return 1

    def create_slot(self) -> OnnxRuntimeSlot | ShapedOnnxRuntimeSlot:
        if self._session_per_slot:
            session = self._new_session()
        elif self._session is None:
            raise EngineError("the engine is closed")
        else:
            session = self._session
        if self._shaped:
            return ShapedOnnxRuntimeSlot(
                session, self._inputs, self._outputs, self._max_batch_size, _untouched
            )
        return OnnxRuntimeSlot(session, self._inputs, self._outputs, self._max_batch_size)

    def close(self) -> None:
        self._session = None
