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
  no fp16 kernel, to which we add the text operators and custom domains
  (`fp16_block_list`).
- int8: a QDQ model from `onnxruntime.quantization.quantize_static` (MinMax calibration
  over the calibration samples, per-channel 7-bit int8 weights, uint8 activations: the
  U8S8 form ONNX Runtime's CPU kernels are fastest at, with weights small enough that
  those kernels never saturate, VNNI or not), after ONNX Runtime's recommended
  `quant_pre_process`; then optimised like fp32, which fuses the QDQ pairs into QGemm /
  QLinear kernels. The TensorRT builder reuses `make_qdq_model` with symmetric int8
  activations (explicit quantisation, TensorRT's only int8 form). The quantiser's option
  `QDQDisableWeightAdjustForInt32Bias` is set: without it ONNX Runtime fails on a bias of
  shape [1, N] (scikit-learn's MLPs as skl2onnx exports them; microsoft/onnxruntime#24815)
  and it only matters for weights so small that their bias would overflow int32, which
  the 7-bit range rules out. Only the weighted operators (`WEIGHTED_OPERATORS`) and
  their inputs are quantised; elementwise operators and softmaxes stay float32: the
  quantiser's default (every operator it knows) also quantised a Transformer's mask
  arithmetic (`(1 - mask) * -10000`, added to the scores) to the range calibration saw,
  [0, 0] for unpadded samples, so the mask vanished and padding (PadToBuckets, or the
  client's) changed an int8 BERT's answers. What int8 cannot do is refused before
  anything is built (`int8_refusal`): a graph without a weighted standard operator to
  quantise (one of `ai.onnx.ml` operators only, such as skl2onnx's linear classifiers).

External data (torch's `model.onnx` + `model.onnx.data`, and every model over 2 GB): the
intermediate models are written with their weights in a data file beside them, and so is
the engine (`ENGINE_DATA_FILE` beside `model.onnx`), so the engine loads as the source did.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from kubeinfer.runtime.building.builders import (
    Builder,
    BuildError,
    Progress,
    Samples,
    require_space,
)
from kubeinfer.runtime.engine_manifest import BatchProfile, sha256_file
from kubeinfer.runtime.engines.loader import installed_backend_version
from kubeinfer.runtime.engines.onnx_text import (
    bytes_outputs,
    load_hint,
    register_extensions,
    str_inputs,
)

CALIBRATION_BATCH = 32
ENGINE_DATA_FILE = "model.onnx.data"
"""The engine's external data file, beside it, when the source model has external data."""
EXTERNAL_DATA_MIN_BYTES = 1024
"""Initializers from this size on go to the data file (ONNX's own default threshold)."""
FP32_ONLY_OPERATORS = frozenset({"TfIdfVectorizer", "StringNormalizer"})
"""Standard operators with float32 kernels only in ONNX Runtime (its text operators)."""
WEIGHTED_OPERATORS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Gather"})
"""Standard operators whose weights int8 quantises (those of ONNX Runtime's QDQ registry
that carry weights); a graph without one has nothing for int8 to do."""


def has_external_data(model_path: Path) -> bool:
    """Whether the ONNX model at `model_path` keeps tensors in files beside it."""
    model = onnx.load(str(model_path), load_external_data=False)
    return any(
        tensor.data_location == onnx.TensorProto.EXTERNAL for tensor in model.graph.initializer
    )


def model_bytes(model_path: Path) -> int:
    """The model's size on disk, its external data files included."""
    names = {model_path.name}
    model = onnx.load(str(model_path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                names.add(entry.value)
    return sum((model_path.parent / name).stat().st_size for name in names)


def _session(model_path: Path, optimize_to: Path | None = None) -> ort.InferenceSession:
    """An ONNX Runtime session; with `optimize_to`, the optimised model is written there
    (with about the source's size free first: see `require_space`), its weights in
    `ENGINE_DATA_FILE` beside it when the source keeps them outside its protobuf."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    register_extensions(options)
    if optimize_to is not None:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(optimize_to)
        size = model_bytes(model_path)
        require_space(optimize_to.parent, size, "the optimised model")
        if has_external_data(model_path):
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", ENGINE_DATA_FILE
            )
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes",
                str(EXTERNAL_DATA_MIN_BYTES),
            )
    try:
        return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # ORT raises its own Fail/InvalidGraph types
        if optimize_to is not None:  # a disk that filled up meanwhile
            require_space(optimize_to.parent, model_bytes(model_path), "the optimised model")
        raise BuildError(
            f"ONNX Runtime cannot load {model_path.name}: {error}{load_hint(str(error))}"
        ) from error


def run_model(model_path: Path, samples: Samples, max_batch_size: int) -> Samples:
    """Runs an ONNX model on CPU in batches; the outputs concatenated per output name.
    Strings go in and come out as the served engine takes and gives them (UTF-8 `bytes`
    in the data plane, `str` to ONNX Runtime, which would read a `bytes` element as its
    repr), so the gate and the known answers judge what serving will answer."""
    session = _session(model_path)
    names = [o.name for o in session.get_outputs()]
    count = next(iter(samples.values())).shape[0]
    chunks: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for start in range(0, count, max_batch_size):
        feed = {k: str_inputs(v[start : start + max_batch_size]) for k, v in samples.items()}
        for name, value in zip(names, session.run(names, feed), strict=True):
            chunks[name].append(bytes_outputs(np.asarray(value)))
    return {name: np.concatenate(parts) for name, parts in chunks.items()}


class _Reader:
    """A CalibrationDataReader over in-memory samples, in batches."""

    def __init__(self, samples: Samples) -> None:
        count = next(iter(samples.values())).shape[0]
        self._batches: Iterator[dict[str, np.ndarray]] = iter(
            [
                {k: str_inputs(v[start : start + CALIBRATION_BATCH]) for k, v in samples.items()}
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
    """Writes a statically quantised QDQ model calibrated on `calibration` (its weights in
    a data file beside it when the source keeps them outside its protobuf)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = work_dir / "preprocessed.onnx"
    external = has_external_data(model_path)
    # quant_pre_process logs through the root logger; keep the CLI's stderr to our lines.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        # ONNX shape inference suffices for standard ops; symbolic inference needs sympy.
        quant_pre_process(
            str(model_path), str(prepared), skip_symbolic_shape=True,
            save_as_external_data=external, all_tensors_to_one_file=True,
            external_data_location=f"{prepared.name}.data" if external else None,
        )  # fmt: skip
        _quantize_static(prepared, qdq_path, calibration, symmetric_activations, external)
    except BuildError:
        raise
    except Exception as error:
        raise BuildError(f"int8 quantisation failed: {error}") from error
    finally:
        root.setLevel(level)
        prepared.unlink(missing_ok=True)
        (work_dir / f"{prepared.name}.data").unlink(missing_ok=True)


def _quantize_static(
    prepared: Path, qdq_path: Path, calibration: Samples, symmetric: bool, external: bool
) -> None:
    """`quantize_static` of the pre-processed model: MinMax, per-channel symmetric int8
    weights, int8 (symmetric) or uint8 activations."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(_Reader, CalibrationDataReader):
        pass

    quantize_static(
        str(prepared),
        str(qdq_path),
        Reader(calibration),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        # 7-bit weights for the CPU's u8 x s8 kernels: on x86 without VNNI they add pairs
        # of products in 16 bits (vpmaddubsw), which saturate with full 8-bit weights
        # (255 * 127 * 2 > 32767), so the same engine would be less accurate there than
        # on the machine that built and gated it; 255 * 64 * 2 fits, on every CPU.
        # TensorRT's symmetric form runs no such kernel and keeps all 8 bits.
        reduce_range=not symmetric,
        calibrate_method=CalibrationMethod.MinMax,
        op_types_to_quantize=sorted(WEIGHTED_OPERATORS),
        use_external_data_format=external,
        extra_options={
            "ActivationSymmetric": symmetric,
            "WeightSymmetric": True,
            # onnxruntime#24815: a [1, N] bias fails the weight adjustment; see the module
            "QDQDisableWeightAdjustForInt32Bias": True,
        },
    )


class OnnxRuntimeBuilder(Builder):
    backend = "onnxruntime"
    engine_file = "model.onnx"
    int8_form = "int8 QDQ"
    symmetric_int8 = False

    def backend_version(self) -> str:
        """What serving compares the engine's manifest with (`installed_backend_version`)."""
        return installed_backend_version(self.backend) or ort.__version__

    def target(self) -> str:
        return "cpu"

    def library_versions(self) -> dict[str, str]:
        return {"onnxruntime": ort.__version__, "onnx": onnx.__version__}

    def data_files(self, engine_path: Path) -> dict[str, str]:
        """The engine's external data (`ENGINE_DATA_FILE`, when the source had some)."""
        from kubeinfer.runtime.building.model_files import external_data_locations

        model = onnx.load(str(engine_path), load_external_data=False)
        locations = external_data_locations(model, str(engine_path))
        return {name: sha256_file(engine_path.parent / name) for name in locations}

    def _fp16_source(self, model_path: Path, work_dir: Path, progress: Progress) -> Path:
        """The fp16 copy of the model (float32 inputs and outputs kept), in `work_dir`."""
        from onnxruntime.transformers.float16 import convert_float_to_float16

        require_space(work_dir, model_bytes(model_path), "the fp16 model")
        progress("Converting to fp16 (onnxruntime float16 converter, float32 I/O kept)")
        model = onnx.load(str(model_path))
        converted = convert_float_to_float16(
            model, keep_io_types=True, op_block_list=fp16_block_list(model)
        )
        source = work_dir / "fp16.onnx"
        external = has_external_data(model_path)
        onnx.save(
            converted, str(source), save_as_external_data=external,
            all_tensors_to_one_file=True, location=f"{source.name}.data",
            size_threshold=EXTERNAL_DATA_MIN_BYTES,
        )  # fmt: skip
        return source

    def _compile(
        self,
        source: Path,
        precision: str,
        engine_path: Path,
        profile: BatchProfile,
        progress: Progress,
    ) -> None:
        progress("Optimising the graph offline (ONNX Runtime, level EXTENDED)")
        _session(source, optimize_to=engine_path)
        if not engine_path.is_file():
            raise BuildError("ONNX Runtime did not write the optimised model")

    def run(self, engine_path: Path, samples: Samples, max_batch_size: int) -> Samples:
        return run_model(engine_path, samples, max_batch_size)


def fp16_block_list(model: onnx.ModelProto) -> list[str]:
    """Operators the fp16 converter leaves in float32: its own list (ONNX-ML's, and a
    few without fp16 kernels), `FP32_ONLY_OPERATORS`, and every operator outside the
    standard domain (ONNX-ML's, onnxruntime-extensions', com.microsoft's text operators),
    whose kernels take float32 where they take floats at all."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    custom = {n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")}
    return sorted({*DEFAULT_OP_BLOCK_LIST, *FP32_ONLY_OPERATORS, *custom})


def int8_refusal(model: onnx.ModelProto) -> str | None:
    """Why int8 cannot be built from `model` (the graph without its tensors' data), or
    None: a graph with no weighted standard operator (`WEIGHTED_OPERATORS`) leaves the
    quantiser nothing to do, and one of `ai.onnx.ml` operators only makes it fail."""
    standard = {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}
    if standard & WEIGHTED_OPERATORS:
        return None
    others = sorted({f"{n.op_type} ({n.domain or 'ai.onnx'})" for n in model.graph.node})
    return (
        "int8 quantises the weights of standard ONNX operators "
        f"({', '.join(sorted(WEIGHTED_OPERATORS))}), and this graph has none: its operators "
        f"are {', '.join(others)}. Build it at fp32 (its operators already run on ONNX "
        "Runtime's own CPU kernels), or export the model with such operators (e.g. an "
        "MLPClassifier rather than a linear model)"
    )
