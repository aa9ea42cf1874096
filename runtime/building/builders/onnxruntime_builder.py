"""The ONNX Runtime builder: an offline-optimised ONNX model is the engine.

- fp32: ONNX Runtime's graph optimiser (level EXTENDED: constant folding, node fusions
  such as Gemm+Relu) applied once at build time and saved with `optimized_model_filepath`,
  so pods do not redo it at start. EXTENDED rather than ALL because ALL adds layout
  transformations tied to the building machine's CPU; the key's target is `cpu` and its
  backend version pins the ONNX Runtime that optimised it.
- fp16: `onnxruntime.transformers.float16.convert_float_to_float16`, with
  `keep_io_types=True` so the engine still takes and returns float32 and clients do not
  change with the precision. We chose ONNX Runtime's copy of the converter over
  onnxconverter-common's: it ships inside onnxruntime (no new dependency), is maintained
  by the team whose kernels run the result, and keeps an op block list of ops that have
  no fp16 kernel.
- int8: a QDQ model from `onnxruntime.quantization.quantize_static` (MinMax calibration
  over the calibration samples, per-channel 7-bit int8 weights, uint8 activations: the
  U8S8 form ONNX Runtime's CPU kernels are fastest at, with weights small enough that
  those kernels never saturate, VNNI or not), after ONNX Runtime's recommended
  `quant_pre_process`; then optimised like fp32, which fuses the QDQ pairs into QGemm /
  QLinear kernels. The TensorRT builder reuses `make_qdq_model` with symmetric int8
  activations (explicit quantisation, TensorRT's only int8 form).

Models must fit in one protobuf (< 2 GB): external-data models are not handled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from kubeinfer.runtime.building.builders import BuildError, Progress, Samples, require_space
from kubeinfer.runtime.engine_manifest import BatchProfile
from kubeinfer.runtime.engines.loader import installed_backend_version

CALIBRATION_BATCH = 32


def _session(model_path: Path, optimize_to: Path | None = None) -> ort.InferenceSession:
    """An ONNX Runtime session; with `optimize_to`, the optimised model is written there
    (with about the source's size free first: see `require_space`)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if optimize_to is not None:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(optimize_to)
        require_space(optimize_to.parent, model_path.stat().st_size, "the optimised model")
    try:
        return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # ORT raises its own Fail/InvalidGraph types
        if optimize_to is not None:  # a disk that filled up meanwhile
            require_space(optimize_to.parent, model_path.stat().st_size, "the optimised model")
        raise BuildError(f"ONNX Runtime cannot load {model_path.name}: {error}") from error


def run_model(model_path: Path, samples: Samples, max_batch_size: int) -> Samples:
    """Runs an ONNX model on CPU in batches; the outputs concatenated per output name."""
    session = _session(model_path)
    names = [o.name for o in session.get_outputs()]
    count = next(iter(samples.values())).shape[0]
    chunks: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for start in range(0, count, max_batch_size):
        feed = {k: v[start : start + max_batch_size] for k, v in samples.items()}
        for name, value in zip(names, session.run(names, feed), strict=True):
            chunks[name].append(np.asarray(value))
    return {name: np.concatenate(parts) for name, parts in chunks.items()}


class _Reader:
    """A CalibrationDataReader over in-memory samples, in batches."""

    def __init__(self, samples: Samples) -> None:
        count = next(iter(samples.values())).shape[0]
        self._batches: Iterator[dict[str, np.ndarray]] = iter(
            [
                {k: v[start : start + CALIBRATION_BATCH] for k, v in samples.items()}
                for start in range(0, count, CALIBRATION_BATCH)
            ]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def rewind(self) -> None:  # part of CalibrationDataReader's interface; one pass suffices
        pass


def make_qdq_model(
    model_path: Path,
    qdq_path: Path,
    calibration: Samples,
    work_dir: Path,
    symmetric_activations: bool,
) -> None:
    """Writes a statically quantised QDQ model calibrated on `calibration`."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(_Reader, CalibrationDataReader):
        pass

    prepared = work_dir / "preprocessed.onnx"
    # quant_pre_process logs through the root logger; keep the CLI's stderr to our lines.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        # ONNX shape inference suffices for standard ops; symbolic inference needs sympy.
        quant_pre_process(str(model_path), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(qdq_path),
            Reader(calibration),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8 if symmetric_activations else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            # 7-bit weights for the CPU's u8 x s8 kernels: on x86 without VNNI they add pairs
            # of products in 16 bits (vpmaddubsw), which saturate with full 8-bit weights
            # (255 * 127 * 2 > 32767), so the same engine would be less accurate there than
            # on the machine that built and gated it; 255 * 64 * 2 fits, on every CPU.
            # TensorRT's symmetric form runs no such kernel and keeps all 8 bits.
            reduce_range=not symmetric_activations,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": symmetric_activations, "WeightSymmetric": True},
        )
    except BuildError:
        raise
    except Exception as error:
        raise BuildError(f"int8 quantisation failed: {error}") from error
    finally:
        root.setLevel(level)
        prepared.unlink(missing_ok=True)


class OnnxRuntimeBuilder:
    backend = "onnxruntime"
    engine_file = "model.onnx"

    def backend_version(self) -> str:
        """What serving compares the engine's manifest with (`installed_backend_version`)."""
        return installed_backend_version(self.backend) or ort.__version__

    def target(self) -> str:
        return "cpu"

    def library_versions(self) -> dict[str, str]:
        return {"onnxruntime": ort.__version__, "onnx": onnx.__version__}

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
        source = model_path
        if precision != "fp32":  # a converted or quantised copy is written first
            require_space(work_dir, model_path.stat().st_size, f"the {precision} model")
        if precision == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            progress("Converting to fp16 (onnxruntime float16 converter, float32 I/O kept)")
            converted = convert_float_to_float16(onnx.load(str(model_path)), keep_io_types=True)
            source = work_dir / "fp16.onnx"
            onnx.save(converted, str(source))
        elif precision == "int8":
            if calibration is None:
                raise BuildError("int8 needs calibration samples")
            progress(
                f"Quantising to int8 QDQ (MinMax over "
                f"{next(iter(calibration.values())).shape[0]} calibration samples)"
            )
            source = work_dir / "qdq.onnx"
            make_qdq_model(model_path, source, calibration, work_dir, symmetric_activations=False)
        progress("Optimising the graph offline (ONNX Runtime, level EXTENDED)")
        _session(source, optimize_to=engine_path)
        if not engine_path.is_file():
            raise BuildError("ONNX Runtime did not write the optimised model")

    def run(self, engine_path: Path, samples: Samples, max_batch_size: int) -> Samples:
        return run_model(engine_path, samples, max_batch_size)
