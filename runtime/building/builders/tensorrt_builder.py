"""The TensorRT builder: the ONNX parser, a builder config, one optimisation profile, and
the serialized plan as the engine.

Unverified: no line of this module has run with TensorRT (TensorRT cannot be installed on
our machines, and the GPU machine lent to some sessions has none). On that machine's H100
only `target()` ran (`make gpu-check`: `sm_90-h100-80gb-hbm3`, read from the device). Written
against the TensorRT 10 Python API (`create_network(0)`: explicit batch is the only mode;
`parse_from_file`; `set_memory_pool_limit`; `build_serialized_network`), checked against
NVIDIA's API documentation but never run. What did run, on a CPU, against stand-ins for the
`tensorrt` and `pycuda.driver` modules (`tests/runtime/test_gpu_fixes.py`): the TensorRT
version check and `target()`. The `gpu` test that builds and serves real plans is
`tests/engines/test_engine_precisions.py::test_tensorrt_builds_serve_outputs_close_to_fp32`;
it needs TensorRT, so `make gpu-check` skips it on a machine without it.

- TensorRT 10 only (`tensorrt>=10,<11` in the `gpu` extra, and checked on import): 11
  removes `BuilderFlag.FP16` and builds every network strongly typed, which changes what
  fp16 means below.
- fp32: no precision flags.
- fp16: `BuilderFlag.FP16` on a weakly typed network.
- int8: explicit quantisation. The same calibration drives ONNX Runtime's
  `quantize_static` (symmetric int8 activations and weights, as TensorRT requires) into a
  QDQ model, which is parsed into a STRONGLY_TYPED network: NVIDIA's documentation says
  Q/DQ networks should be strongly typed and built without precision flags. TensorRT's
  implicit calibrators are deprecated in 10 and not used.
- One optimisation profile per input: batch min 1, opt and max `maxBatchSize`, the other
  dimensions as the model declares them (a dynamic non-batch dimension is refused).

The target is read from the CUDA device the plan is built on (`device_index`, a CUDA
ordinal, so it honours CUDA_VISIBLE_DEVICES as TensorRT does, where NVML's indices do
not), and the build runs with that device's primary context current, so TensorRT builds
on the device named in the target. The target holds the compute capability and the GPU
model (`sm_90-h100-80gb-hbm3`, see `engine_manifest.gpu_target`): a plan only runs on the
architecture and TensorRT version that built it, and TensorRT picks its kernels by timing
them on the GPU model at hand, so an H200's plan is not an H100's. The accuracy report
runs the plan through the serving engine (`engines.loader.load_engine`).

`build` is the base `Builder`'s, shared with ONNX Runtime (the int8 QDQ model, now after
a free-space check as ONNX Runtime's); this module's part is `_compile`. That move was
mechanical and, like the rest, has not run with TensorRT (unverified).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from kubeinfer.runtime.building.builders import (
    Builder,
    BuildError,
    Progress,
    Samples,
    run_through_engine,
)
from kubeinfer.runtime.engine_manifest import BatchProfile, gpu_target
from kubeinfer.runtime.engines.base import BackendUnavailable
from kubeinfer.runtime.engines.cuda_streams import CudaContext
from kubeinfer.runtime.engines.loader import installed_backend_version

WORKSPACE_BYTES = 4 << 30
TENSORRT_MAJOR = 10


def _tensorrt():
    try:
        import tensorrt as trt
    except ImportError as error:
        raise BuildError(
            "the tensorrt backend needs TensorRT 10 and a CUDA GPU: install the extra "
            "'kubeinfer[gpu]' on a GPU node, or build with --backend onnxruntime"
        ) from error
    major = str(trt.__version__).split(".")[0]
    if major != str(TENSORRT_MAJOR):
        raise BuildError(
            f"TensorRT {trt.__version__} is installed, but kubeinfer builds with TensorRT "
            f"{TENSORRT_MAJOR} (11 drops BuilderFlag.FP16 and builds every network strongly "
            "typed): pip install 'tensorrt>=10,<11'"
        )
    return trt


class TensorRTBuilder(Builder):
    backend = "tensorrt"
    engine_file = "model.plan"
    int8_form = "a symmetric int8 QDQ model for explicit quantisation"
    symmetric_int8 = True

    def __init__(self, device_index: int = 0) -> None:
        self.device_index = device_index
        self._cuda: CudaContext | None = None

    def _device(self) -> CudaContext:
        """The CUDA device the plan is built on (its primary context, retained once)."""
        if self._cuda is None:
            try:
                self._cuda = CudaContext(self.device_index)
            except BackendUnavailable as error:
                raise BuildError(
                    f"cannot open CUDA device {self.device_index} to build on: {error}"
                ) from error
        return self._cuda

    def backend_version(self) -> str:
        """What serving compares the plan's manifest with (`installed_backend_version`)."""
        trt = _tensorrt()  # refuses a missing TensorRT or another major version
        return installed_backend_version(self.backend) or str(trt.__version__)

    def target(self) -> str:
        device = self._device().device
        major, minor = device.compute_capability()
        return gpu_target(major, minor, device.name())

    def library_versions(self) -> dict[str, str]:
        import onnx
        import onnxruntime

        return {
            "tensorrt": self.backend_version(),
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        }

    def _check_backend(self) -> None:
        _tensorrt()  # refuses a missing TensorRT or another major version, before any work

    def _compile(
        self,
        source: Path,
        precision: str,
        engine_path: Path,
        profile: BatchProfile,
        progress: Progress,
    ) -> None:
        trt = _tensorrt()
        flags = 0
        if precision == "int8":  # a QDQ model: explicit quantisation, strongly typed
            flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        with self._device().active():  # TensorRT builds on the current context's device
            plan = self._build_plan(trt, source, flags, precision, profile, progress)
        with engine_path.open("wb") as handle:
            handle.write(plan)

    def _build_plan(
        self,
        trt: ModuleType,
        source: Path,
        flags: int,
        precision: str,
        profile: BatchProfile,
        progress: Progress,
    ) -> Any:
        """The serialized plan (TensorRT's IHostMemory), built with the device current."""
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
        return plan

    def run(self, engine_path: Path, samples: Samples, max_batch_size: int) -> Samples:
        from kubeinfer.runtime.engines.tensorrt import TensorRTEngine

        engine = TensorRTEngine(engine_path, max_batch_size, self.device_index)
        try:
            return run_through_engine(engine, samples)
        finally:
            engine.close()
