"""The TensorRT builder: the ONNX parser, a builder config, one optimisation profile, and
the serialized plan as the engine.

unverified: TensorRT cannot be installed on our machines (no GPU). Written against the
TensorRT 10 Python API (`create_network(0)`: explicit batch is the only mode;
`parse_from_file`; `set_memory_pool_limit`; `build_serialized_network`), checked against
NVIDIA's API documentation but never run here.

- fp32: no precision flags.
- fp16: `BuilderFlag.FP16` on a weakly typed network (TensorRT 10; 11 removes the flag).
- int8: explicit quantisation. The same calibration drives ONNX Runtime's
  `quantize_static` (symmetric int8 activations and weights, as TensorRT requires) into a
  QDQ model, which is parsed into a STRONGLY_TYPED network: NVIDIA's documentation says
  Q/DQ networks should be strongly typed and built without precision flags. TensorRT's
  implicit calibrators are deprecated in 10 and not used.
- One optimisation profile per input: batch min 1, opt and max `maxBatchSize`, the other
  dimensions as the model declares them (a dynamic non-batch dimension is refused).

The target is the GPU's compute capability from NVML (`sm_90`), because a plan only runs
on the architecture and TensorRT version that built it; both are in the cache key. The
accuracy report runs the plan through the serving engine (`engines.loader.load_engine`).
"""

from __future__ import annotations

from pathlib import Path

from kubeinfer.runtime.builders import BuildError, Progress, Samples, run_through_engine
from kubeinfer.runtime.engine_manifest import BatchProfile

WORKSPACE_BYTES = 4 << 30


def _tensorrt():  # type: ignore[no-untyped-def]
    try:
        import tensorrt as trt  # type: ignore[import-not-found]
    except ImportError as error:
        raise BuildError(
            "the tensorrt backend needs TensorRT 10 and a CUDA GPU: install the extra "
            "'kubeinfer[gpu]' on a GPU node, or build with --backend onnxruntime"
        ) from error
    return trt


class TensorRTBuilder:
    backend = "tensorrt"
    engine_file = "model.plan"

    def backend_version(self) -> str:
        return str(_tensorrt().__version__)

    def target(self) -> str:
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(0)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            finally:
                pynvml.nvmlShutdown()
        except Exception as error:  # ImportError, or NVMLError without a GPU
            raise BuildError(
                f"cannot read the GPU's compute capability through NVML ({error}); TensorRT "
                "engines are built on the GPU model they will run on"
            ) from error
        return f"sm_{major}{minor}"

    def library_versions(self) -> dict[str, str]:
        import onnx
        import onnxruntime

        return {
            "tensorrt": self.backend_version(),
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        }

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
        trt = _tensorrt()
        source = model_path
        flags = 0
        if precision == "int8":
            from kubeinfer.runtime.builders.onnxruntime_builder import make_qdq_model

            if calibration is None:
                raise BuildError("int8 needs calibration samples")
            progress("Quantising to a symmetric int8 QDQ model for explicit quantisation")
            source = work_dir / "qdq.onnx"
            make_qdq_model(model_path, source, calibration, work_dir, symmetric_activations=True)
            flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        progress("Parsing the ONNX model (TensorRT ONNX parser)")
        if not parser.parse_from_file(str(source)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise BuildError(f"TensorRT cannot parse the model: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
        if precision == "fp16":
            config.set_flag(trt.BuilderFlag.FP16)
        optimisation_profile = builder.create_optimization_profile()
        for index in range(network.num_inputs):
            tensor = network.get_input(index)
            item = list(tensor.shape)[1:]
            if any(d < 0 for d in item):
                raise BuildError(
                    f"input {tensor.name!r} has a dynamic non-batch dimension {tensor.shape}"
                )
            optimisation_profile.set_shape(
                tensor.name,
                (profile.min, *item),
                (profile.opt, *item),
                (profile.max, *item),
            )
        config.add_optimization_profile(optimisation_profile)
        progress(f"Building the TensorRT plan ({precision}, batch {profile.min}..{profile.max})")
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise BuildError("TensorRT failed to build the engine (see its log above)")
        with engine_path.open("wb") as handle:
            handle.write(plan)

    def run(self, engine_path: Path, samples: Samples, max_batch_size: int) -> Samples:
        from kubeinfer.runtime.engines.loader import load_engine  # type: ignore[import-not-found]

        engine = load_engine(engine_path, "tensorrt", max_batch_size)
        try:
            return run_through_engine(engine, samples)
        finally:
            engine.close()
