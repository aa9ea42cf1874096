"""Engine builders, one per backend, behind one small interface.

A builder turns a source ONNX model into an engine file for its backend and runs that
engine on samples (for the accuracy report). `get_builder` imports a backend only when it
is asked for, so the onnxruntime path never imports TensorRT.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
from kubeinfer.runtime.engine_manifest import BatchProfile

if TYPE_CHECKING:
    from kubeinfer.runtime.engines.base import Engine

Samples = dict[str, np.ndarray]
Progress = Callable[[str], None]


class BuildError(RuntimeError):
    """The backend could not build an engine from the model."""


def require_space(directory: Path, needed: int, what: str) -> None:
    """Raises OSError(ENOSPC) when `directory`'s filesystem has fewer than `needed` bytes
    free. ONNX Runtime reports a model it could not write as `INVALID_PROTOBUF ...
    serialization failed`, which sends the reader looking at the model; checking before
    writing (and again after a failed write) names the full disk instead."""
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"No space left on device: {what} needs about {needed / 1e6:.1f} MB and the "
            f"filesystem holding it has {free / 1e6:.1f} MB free",
            str(directory),
        )


class Builder(Protocol):
    backend: str
    engine_file: str
    """The engine's file name in the cache entry."""

    def backend_version(self) -> str: ...

    def target(self) -> str:
        """`cpu`, or the GPU's compute capability and model (`engine_manifest.gpu_target`)."""
        ...

    def library_versions(self) -> dict[str, str]: ...

    def build(
        self,
        model_path: Path,
        precision: str,
        engine_path: Path,
        calibration: Samples | None,
        profile: BatchProfile,
        work_dir: Path,
        progress: Progress,
    ) -> None: ...

    def run(self, engine_path: Path, samples: Samples, max_batch_size: int) -> Samples:
        """The engine's outputs on `samples`, run in batches of at most `max_batch_size`."""
        ...


def get_builder(backend: str) -> Builder:
    if backend == "onnxruntime":
        from kubeinfer.runtime.building.builders.onnxruntime_builder import OnnxRuntimeBuilder

        return OnnxRuntimeBuilder()
    if backend == "tensorrt":
        from kubeinfer.runtime.building.builders.tensorrt_builder import TensorRTBuilder

        return TensorRTBuilder()
    raise ValueError(f"unknown backend {backend!r}; use onnxruntime or tensorrt")


def run_through_engine(engine: Engine, samples: Samples) -> Samples:
    """Runs `samples` through a loaded serving `Engine` (engines/base.py) the way the
    batcher does: copy rows into a slot's input views, run, copy the outputs out."""
    count = next(iter(samples.values())).shape[0]
    slot = engine.create_slot()
    chunks: dict[str, list[np.ndarray]] = {}
    try:
        for start in range(0, count, engine.max_batch_size):
            rows = min(engine.max_batch_size, count - start)
            for name, view in slot.input_views(rows).items():
                view[...] = samples[name][start : start + rows]
            for name, out in slot.run(rows).items():
                chunks.setdefault(name, []).append(np.array(out, copy=True))
    finally:
        slot.close()
    return {name: np.concatenate(parts) for name, parts in chunks.items()}
