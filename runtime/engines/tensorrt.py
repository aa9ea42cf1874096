"""The TensorRT 10 engine: a deserialized plan whose slots are `CudaSlot`s, each with its own
execution context.

Per slot (made once, in `create_slot`): an `IExecutionContext` (contexts are not
thread-safe and each owns its activation memory, so one per slot), a CUDA stream, pinned
host and device buffers for `max_batch_size` rows, and the tensor addresses set on the
context once (`set_tensor_address`), since the device buffers never move. Per batch: the
input shapes are set only when the batch size changed since the slot's last batch
(`set_input_shape`), then async copy-in, `execute_async_v3(stream)`, async copy-out, and a
wait on the slot's event (see `cuda_streams`).

The plan's optimisation profile 0 must admit batch sizes 1..max_batch_size on every input
(the engine builder makes it so); other dimensions must be fixed.

Unverified: TensorRT cannot be installed on our machines, and the GPU machine lent to some
sessions has none, so this module was written against the TensorRT 10 Python API
documentation (the name-based tensor API: `num_io_tensors`, `get_tensor_name`,
`get_tensor_mode`, `get_tensor_dtype`, `get_tensor_shape`, `get_tensor_profile_shape`,
`set_input_shape`, `set_tensor_address`, `execute_async_v3`) and no line past
`import_tensorrt`'s failure path has ever run. What has run, on a CPU: importing the module
(it needs neither TensorRT nor pycuda) and loading a plan without TensorRT, which raises
`BackendUnavailable` (`tests/runtime/test_engines_cuda.py`). The `gpu` test that would run
it, `tests/engines/test_engine_precisions.py::test_tensorrt_builds_serve_outputs_close_to_fp32`,
needs TensorRT and is skipped where it is missing.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from kubeinfer.runtime.engines.base import (
    NUMPY_TO_V2,
    BackendUnavailable,
    EngineBase,
    EngineError,
    TensorSpec,
    UnsupportedModel,
)
from kubeinfer.runtime.engines.cuda_streams import CudaContext, CudaSlot


def import_tensorrt() -> ModuleType:
    """The `tensorrt` module, or `BackendUnavailable` saying how to get it."""
    try:
        import tensorrt
    except ImportError as error:
        raise BackendUnavailable(
            "TensorRT is not installed (pip install 'kubeinfer[gpu]' on a machine with an "
            f"NVIDIA driver); serve the ONNX model with the onnxruntime backend instead: {error}"
        ) from error
    return tensorrt


def _tensor_specs(trt: ModuleType, engine: Any, max_batch_size: int) -> tuple[list, list]:
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        try:
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
        except TypeError as error:  # nptype raises for types numpy lacks (bf16, fp8, int4)
            raise UnsupportedModel(f"tensor {name!r}: {error}") from error
        datatype = NUMPY_TO_V2.get(dtype)
        if datatype is None:
            raise UnsupportedModel(f"tensor {name!r} has type {dtype}, with no v2 datatype")
        shape = tuple(engine.get_tensor_shape(name))
        if not shape or shape[0] != -1:
            raise UnsupportedModel(
                f"tensor {name!r} has shape {shape}; the plan must be built with a dynamic "
                "first (batch) dimension"
            )
        if any(d < 0 for d in shape[1:]):
            raise UnsupportedModel(
                f"tensor {name!r} has shape {shape}: only the batch dimension may be dynamic"
            )
        spec = TensorSpec(name, datatype, shape)
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            low, _, high = engine.get_tensor_profile_shape(name, 0)
            if low[0] > 1 or high[0] < max_batch_size:
                raise UnsupportedModel(
                    f"input {name!r}: the plan's profile allows batch sizes {low[0]}.."
                    f"{high[0]}, not 1..{max_batch_size}; rebuild it or lower maxBatchSize"
                )
            inputs.append(spec)
        else:
            outputs.append(spec)
    return inputs, outputs


class TensorRTEngine(EngineBase):
    """A serialized TensorRT 10 plan on CUDA device `device_index`. Unverified (see the
    module docstring; its tensors' properties are `EngineBase`'s, a mechanical change that
    never ran with TensorRT either)."""

    def __init__(
        self, path: str | os.PathLike[str], max_batch_size: int, device_index: int = 0
    ) -> None:
        trt = import_tensorrt()
        self._context = CudaContext(device_index)
        self._trt = trt
        self._max_batch_size = max_batch_size
        plan = Path(path).read_bytes()
        with self._context.active():
            self._logger = trt.Logger(trt.Logger.WARNING)
            self._runtime = trt.Runtime(self._logger)
            self._engine = self._runtime.deserialize_cuda_engine(plan)
            self._context.synchronize()  # weights uploaded before any slot's stream reads them
        if self._engine is None:
            raise UnsupportedModel(
                f"TensorRT could not deserialize {path} (built by another TensorRT version "
                "or for another GPU?); rebuild the engine on this node type"
            )
        inputs, outputs = _tensor_specs(trt, self._engine, max_batch_size)
        self._inputs, self._outputs = tuple(inputs), tuple(outputs)

    @property
    def default_execution_slots(self) -> int:
        # Two CUDA streams: one slot's copies overlap the other's compute.
        return 2

    def create_slot(self) -> CudaSlot:
        with self._context.active():
            execution = self._engine.create_execution_context()
            self._context.synchronize()
        if execution is None:
            raise EngineError("TensorRT could not create an execution context (GPU memory?)")
        launcher = _Launcher(execution, self._inputs)
        slot = CudaSlot(self._context, self._inputs, self._outputs, self._max_batch_size, launcher)
        for name, pointer in (*slot.input_pointers.items(), *slot.output_pointers.items()):
            if not execution.set_tensor_address(name, pointer):
                raise EngineError(f"TensorRT refused the address of tensor {name!r}")
        return slot

    def close(self) -> None:
        self._engine = None
        self._runtime = None
        self._context.close()


class _Launcher:
    """The TensorRT part of a slot's batch: input shapes, then `execute_async_v3`."""

    def __init__(self, execution: Any, inputs: tuple[TensorSpec, ...]) -> None:
        self._execution = execution
        self._inputs = inputs
        self._shaped_for = 0  # the batch size the input shapes are set for

    def __call__(self, batch_size: int, slot: CudaSlot) -> None:
        if batch_size != self._shaped_for:
            for spec in self._inputs:
                if not self._execution.set_input_shape(spec.name, (batch_size, *spec.item_shape)):
                    raise EngineError(f"TensorRT refused batch size {batch_size} for {spec.name!r}")
            self._shaped_for = batch_size
        if not self._execution.execute_async_v3(slot.stream_handle):
            self._shaped_for = 0
            raise EngineError("TensorRT's execute_async_v3 failed (see its log)")
