"""One entry point from a model file and a backend name to a loaded `Engine`, and the one
answer to "which version of a backend is installed here".

The backend modules are imported here, lazily, so that choosing ONNX Runtime never
imports TensorRT or pycuda, and a missing GPU stack is reported only when asked for.

`installed_backend_version` is what the builders record in an engine's key and what
serving compares an engine's manifest with: one function, so the version a build writes
and the version serving expects are the same string by construction.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from kubeinfer.contract.runtime_config import InputShape
from kubeinfer.runtime.engines.base import Engine

Backend = Literal["onnxruntime", "tensorrt"]
BACKENDS: tuple[str, ...] = ("onnxruntime", "tensorrt")


def installed_backend_version(backend: str) -> str | None:
    """The version of `backend`'s library in this environment (`onnxruntime.__version__`,
    `tensorrt.__version__`), or None when it is not installed. Raises ValueError for an
    unknown backend."""
    if backend == "onnxruntime":
        try:
            import onnxruntime
        except ImportError:
            return None
        return str(onnxruntime.__version__)
    if backend == "tensorrt":
        try:
            import tensorrt
        except ImportError:
            return None
        return str(tensorrt.__version__)
    raise ValueError(f"unknown engine backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def load_engine(
    path: str | os.PathLike[str],
    backend: str,
    max_batch_size: int,
    intra_op_threads: int | None = None,
    input_shapes: Sequence[InputShape] | None = (),
) -> Engine:
    """Loads `path` with `backend`: an ONNX file for "onnxruntime", a serialized TensorRT
    plan for "tensorrt" (whose optimisation profile must allow `max_batch_size`).
    `input_shapes` gives the ranges of variable input axes besides the batch (ONNX
    Runtime; TensorRT's come from its optimisation profile); None loads a model with such
    axes without them, to check its structure only (its slots cannot run).

    Raises FileNotFoundError for a missing file, ValueError for an unknown backend,
    `UnsupportedModel` for a model the backend cannot serve, and `BackendUnavailable`
    when TensorRT / pycuda / a CUDA device is missing. `intra_op_threads` applies to
    ONNX Runtime only.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"no model file at {os.fspath(path)}")
    if backend == "onnxruntime":
        from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine

        return OnnxRuntimeEngine(
            path, max_batch_size, intra_op_threads=intra_op_threads, input_shapes=input_shapes
        )
    if backend == "tensorrt":
        from kubeinfer.runtime.engines.tensorrt import TensorRTEngine

        return TensorRTEngine(path, max_batch_size)
    raise ValueError(f"unknown engine backend {backend!r}; choose one of {', '.join(BACKENDS)}")
