"""fp32, fp16 and int8 ONNX Runtime builds of a real model: each engine, loaded the way
`kubeinfer serve` loads it (`load_cached_engine` -> `load_engine`), answers like the fp32
model within its precision's tolerance; the int8 report's numbers are real measurements
(recomputed here from the served engine's outputs, non-zero, different from fp32's); an
engine that fails a gate is not published; the TensorRT build runs only on a GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from kubeinfer.runtime.building.accuracy import compare_outputs
from kubeinfer.runtime.building.builders import run_through_engine
from kubeinfer.runtime.building.calibration import load_samples, split_holdout
from kubeinfer.runtime.building.engine_build import AccuracyGateError, BuildResult, build_engine
from kubeinfer.runtime.engine_cache import load_cached_engine, resolve_engine


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def builds(models: dict[str, Path], cache: Path) -> dict[str, BuildResult]:
    calibration = str(models["small_calibration"])
    return {
        precision: build_engine(
            str(models["small"]),
            "onnxruntime",
            precision,
            cache,
            calibration=calibration if precision == "int8" else None,
            max_batch_size=16,
        )
        for precision in ("fp32", "fp16", "int8")
    }


def _held_out(models: dict[str, Path], manifest_inputs: list) -> dict[str, np.ndarray]:  # type: ignore[type-arg]
    samples = load_samples(models["small_calibration"], manifest_inputs, "calibration")
    return split_holdout(samples)[1]


def _serve(cache: Path, result: BuildResult, samples: dict[str, np.ndarray]) -> np.ndarray:
    engine = load_cached_engine(cache, result.digest, max_batch_size=16)
    try:
        return run_through_engine(engine, samples)["logits"]
    finally:
        engine.close()


def _reference(model: Path, samples: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, samples)[
        0
    ]


@pytest.mark.parametrize(("precision", "atol"), [("fp32", 1e-4), ("fp16", 5e-3), ("int8", 0.1)])
def test_each_precision_serves_outputs_close_to_fp32(
    builds: dict[str, BuildResult],
    models: dict[str, Path],
    cache: Path,
    precision: str,
    atol: float,
) -> None:
    result = builds[precision]
    samples = _held_out(models, result.manifest.inputs)
    served = _serve(cache, result, samples)
    reference = _reference(models["small"], samples)
    assert served.shape == reference.shape == (51, 128)
    np.testing.assert_allclose(served, reference, atol=atol)
    assert np.mean(served.argmax(1) == reference.argmax(1)) >= 0.9


def test_lower_precisions_make_smaller_engines(builds: dict[str, BuildResult]) -> None:
    sizes = {p: r.manifest.engine_bytes for p, r in builds.items()}
    assert sizes["int8"] < sizes["fp16"] < sizes["fp32"]
    assert sizes["int8"] < sizes["fp32"] / 3


def test_int8_report_holds_real_measurements_of_the_served_engine(
    builds: dict[str, BuildResult], models: dict[str, Path], cache: Path
) -> None:
    result = builds["int8"]
    report = result.manifest.accuracy
    assert report is not None and report.validation_source == "held-out"
    assert report.samples == 51  # 20% of 256 held out, never used to calibrate
    logits = report.outputs[0]
    assert 0 < logits.mean_abs_diff < logits.max_abs_diff < 0.2
    assert 0.99 < logits.cosine_similarity < 1.0
    assert logits.min_cosine_similarity < logits.cosine_similarity
    assert logits.top1_agreement is not None and 0.8 <= logits.top1_agreement <= 1.0
    # The same numbers, measured again here on the engine as served.
    samples = _held_out(models, result.manifest.inputs)
    again = compare_outputs(
        {"logits": _reference(models["small"], samples)},
        {"logits": _serve(cache, result, samples)},
        "held-out",
    ).outputs[0]
    assert again.max_abs_diff == pytest.approx(logits.max_abs_diff, rel=1e-3)
    assert again.cosine_similarity == pytest.approx(logits.cosine_similarity, abs=1e-6)
    assert again.top1_agreement == logits.top1_agreement
    fp32 = builds["fp32"].manifest.accuracy
    assert fp32 is not None and fp32.outputs[0].max_abs_diff < logits.max_abs_diff / 100


def test_builds_keep_float32_io_whatever_the_precision(builds: dict[str, BuildResult]) -> None:
    for result in builds.values():
        assert [(t.name, t.datatype, t.shape) for t in result.manifest.inputs] == [
            ("input", "FP32", [-1, 512])
        ]
        assert [t.datatype for t in result.manifest.outputs] == ["FP32"]


def test_an_engine_failing_a_gate_is_not_published(
    models: dict[str, Path], tmp_path: Path, snapshot
) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "cache"
    with pytest.raises(AccuracyGateError, match=r"--min-cosine 0\.999999") as failure:
        build_engine(
            str(models["tiny"]),
            "onnxruntime",
            "int8",
            cache,
            calibration=str(models["tiny_calibration"]),
            min_cosine=0.999999,
        )
    assert failure.value.report.outputs[0].cosine_similarity < 0.999999
    assert snapshot(cache) == {}
    engines = cache / "engines"
    assert not engines.exists() or not any(engines.iterdir())


@pytest.mark.gpu("tensorrt", "pycuda.driver")
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_tensorrt_builds_serve_outputs_close_to_fp32(
    models: dict[str, Path], tmp_path: Path, precision: str
) -> None:
    result = build_engine(
        str(models["small"]),
        "tensorrt",
        precision,
        tmp_path,
        calibration=str(models["small_calibration"]),
        max_batch_size=16,
    )
    assert result.manifest.key.target.startswith("sm_")
    samples = _held_out(models, result.manifest.inputs)
    np.testing.assert_allclose(
        _serve(tmp_path, result, samples), _reference(models["small"], samples), atol=0.1
    )


def test_int8_cpu_weights_fit_the_kernels_without_vnni(
    builds: dict[str, BuildResult], cache: Path
) -> None:
    """Every int8 weight of the CPU engine is within 7 bits (|w| <= 64), so the u8 x s8
    kernels ONNX Runtime uses on x86 without VNNI cannot saturate their 16-bit pair sums
    (255 * 64 * 2 < 32767): the engine answers alike on every CPU, as on the one that
    built and gated it."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(resolve_engine(cache, builds["int8"].digest).engine_path))
    weights = [
        numpy_helper.to_array(tensor)
        for tensor in model.graph.initializer
        if tensor.data_type == onnx.TensorProto.INT8 and len(tensor.dims) >= 2
    ]
    assert weights, "the int8 engine keeps its weights as int8 initializers"
    largest = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert largest <= 64, f"an int8 weight of {largest} would saturate without VNNI"
