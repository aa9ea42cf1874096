"""Engine builders, one per backend, on one base.

A builder turns a source ONNX model into an engine file for its backend and runs that
engine on samples (for the accuracy report). `Builder.build` is written once: the model of
the precision asked for, then the backend's compile of it. `get_builder` imports a backend
only when it is asked for, so the onnxruntime path never imports TensorRT.
"""

from __future__ import annotations

import errno
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

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


class Builder(ABC):
    """A backend's builder. `build` is the same for every backend: the backend is checked
    first (`_check_backend`, before any work), then the model of the precision asked for
    is made (int8: a QDQ model quantised on the calibration samples, its activations
    symmetric where the backend wants them, `symmetric_int8`; fp16: `_fp16_source`),
    then the backend compiles it into the engine file (`_compile`)."""

    backend: str
    engine_file: str
    """The engine's file name in the cache entry."""
    int8_form: str
    """The int8 model's form, as the progress line names it."""
    symmetric_int8: bool
    """int8 activations quantised symmetrically (else asymmetric uint8)."""

    @abstractmethod
    def backend_version(self) -> str: ...

    @abstractmethod
    def target(self) -> str:
        """`cpu`, or the GPU's compute capability and model (`engine_manifest.gpu_target`)."""

    @abstractmethod
    def library_versions(self) -> dict[str, str]: ...

    @abstractmethod
    def run(self, engine_path: Path, samples: Samples, max_batch_size: int) -> Samples:
        """The engine's outputs on `samples`, run in batches of at most `max_batch_size`."""

    def build(
        self,
        model_path: Path,
        precision: str,
        engine_path: Path,
        calibration: Samples | None,
        profile: BatchProfile,
        work_dir: Path,
        progress: Progress,
    ) -> None:
        """Builds the engine of `precision` from the ONNX model at `model_path` into
        `engine_path` (intermediate models in `work_dir`); raises BuildError."""
        self._check_backend()
        if precision == "int8":
            source = self._int8_source(model_path, calibration, work_dir, progress)
        elif precision == "fp16":
            source = self._fp16_source(model_path, work_dir, progress)
        else:
            source = model_path
        self._compile(source, precision, engine_path, profile, progress)

    def data_files(self, engine_path: Path) -> dict[str, str]:
        """The files beside the engine that it reads, each with its sha256 (none unless
        the backend's engine has such files)."""
        return {}

    def _check_backend(self) -> None:  # noqa: B027 (a hook: most backends check nothing)
        """Raises BuildError when this backend cannot build here (checked before any work)."""

    def _int8_source(
        self, model_path: Path, calibration: Samples | None, work_dir: Path, progress: Progress
    ) -> Path:
        """The QDQ model quantised on `calibration` (MinMax), written in `work_dir`."""
        from kubeinfer.runtime.building.builders.onnxruntime_builder import (
            make_qdq_model,
            model_bytes,
        )

        require_space(work_dir, model_bytes(model_path), "the int8 model")
        if calibration is None:
            raise BuildError("int8 needs calibration samples")
        count = next(iter(calibration.values())).shape[0]
        progress(f"Quantising to {self.int8_form} (MinMax over {count} calibration samples)")
        source = work_dir / "qdq.onnx"
        make_qdq_model(model_path, source, calibration, work_dir, self.symmetric_int8)
        return source

    def _fp16_source(self, model_path: Path, work_dir: Path, progress: Progress) -> Path:
        """The model the fp16 engine is compiled from: the source itself, unless the
        backend converts it first."""
        return model_path

    @abstractmethod
    def _compile(
        self,
        source: Path,
        precision: str,
        engine_path: Path,
        profile: BatchProfile,
        progress: Progress,
    ) -> None:
        """Compiles the model of the precision (`source`) into the engine file."""


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
