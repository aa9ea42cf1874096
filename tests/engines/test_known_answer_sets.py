"""The known-answer set every build records, on real models built with `build_engine` and
loaded as `kubeinfer serve` loads them (`load_cached`):

- int8 with calibration data: the probes are the calibration file's held-out rows, the
  expected outputs what the fp32 model answers to them now, the tolerance 3x the error
  the served engine shows on them (its build error, measured again here), and the served
  engine passes its check, on this CPU, with that margin;
- without data: probes drawn within each input's valid range, read from the graph (a
  BERT-style encoder's token ids below its word table and token types below its type
  table, its mask all ones; an image model's pixels in the range its metadata states);
  the check runs on an engine with variable axes, and is skipped, saying why, where the
  serving configuration's shape range excludes the probes;
- a text classifier (BYTES in, string labels out) is checked label by label, exactly;
- `--probe-set` names the probes, and a cache hit keeps the set its build recorded;
- the file is hashed with the entry: altered, the entry is refused before it is served.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kubeinfer.contract.runtime_config import InputShape
from kubeinfer.runtime.building.calibration import load_samples, split_holdout, write_samples
from kubeinfer.runtime.building.engine_build import BuildResult, build_engine
from kubeinfer.runtime.building.probe_inputs import draw_probe_inputs, index_bounds
from kubeinfer.runtime.engine_cache import EngineIntegrityError, load_cached, resolve_engine
from kubeinfer.runtime.engine_manifest import sha256_file
from kubeinfer.runtime.known_answers.comparison import PRECISION_FLOOR, relative_errors
from kubeinfer.runtime.known_answers.runner import check_engine, load_known_answers
from models.sklearn_models import build_text_classifier, normalised, text_split
from models.transformer_models import EncoderConfig, build_encoder
from onnx import TensorProto, helper


def _known(built: BuildResult, cache: Path, **load: object):  # type: ignore[no-untyped-def]
    cached = load_cached(cache, built.digest, built.manifest.key.batch_profile.max, **load)  # type: ignore[arg-type]
    known = load_known_answers(cached.resolved.directory, cached.resolved.manifest)
    assert known is not None
    return cached.engine, known


@pytest.fixture(scope="module")
def int8(
    models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[BuildResult, Path]:
    cache = tmp_path_factory.mktemp("cache")
    calibration = str(models["small_calibration"])
    built = build_engine(str(models["small"]), "onnxruntime", "int8", cache,
                         calibration=calibration, max_batch_size=8)  # fmt: skip
    return built, cache


def test_int8_probes_are_held_out_calibration_rows_with_the_fp32_answers(
    int8: tuple[BuildResult, Path], models: dict[str, Path]
) -> None:
    built, cache = int8
    recorded = built.manifest.known_answers
    assert recorded is not None and recorded.source == "calibration" and recorded.probes == 16
    assert recorded.source_sha256 == sha256_file(models["small_calibration"])
    entry = built.engine_path.parent
    assert recorded.sha256 == sha256_file(entry / recorded.file)
    engine, known = _known(built, cache)
    try:
        samples = load_samples(models["small_calibration"], built.manifest.inputs, "c")
        held_out = split_holdout(samples)[1]
        np.testing.assert_array_equal(known.probes.inputs["input"], held_out["input"][:16])
        fp32 = ort.InferenceSession(str(models["small"])).run(None, known.probes.inputs)[0]
        np.testing.assert_array_equal(known.probes.expected["logits"], fp32)
        served = ort.InferenceSession(str(built.engine_path)).run(None, known.probes.inputs)[0]
        own_error = relative_errors(fp32, served).max()
        (logits,) = recorded.outputs
        assert logits.comparison == "relativeError" and logits.gated
        assert logits.build_error == pytest.approx(own_error, rel=1e-6)
        assert 0.01 < own_error < 0.1  # quantisation's own error, not zero
        assert logits.tolerance == pytest.approx(max(3 * own_error, PRECISION_FLOOR["int8"]))
        verdict = check_engine(engine, known)
    finally:
        engine.close()
    assert verdict.passed and verdict.checked, verdict.reason()
    assert verdict.outputs[0].error == pytest.approx(own_error, rel=1e-5)
    assert verdict.outputs[0].error_ratio <= 1 / 3 + 1e-6


def test_an_altered_known_answer_file_is_refused_with_the_entry(
    int8: tuple[BuildResult, Path], tmp_path: Path
) -> None:
    built, cache = int8
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    entry = copy / "engines" / built.digest.removeprefix("sha256:")
    (entry / "known_answers.npz").write_bytes(b"not the recorded probes")
    with pytest.raises(EngineIntegrityError, match=r"known_answers\.npz has sha256"):
        resolve_engine(copy, built.digest)


def _image_model(path: Path) -> Path:
    """[batch, 3, 8, 8] pixels -> per-channel mean, stating its pixel range 0..255."""
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["scores"])],
        "image", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"Image.NominalPixelRange": "NominalRange_0_255"})
    onnx.save(model, str(path))
    return path


def _cast_ids_model() -> onnx.ModelProto:
    """INT32 ids cast and unsqueezed before they index a table of 50 rows, and a second
    table of 30 the same ids index: the smaller bounds them."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [50, 4], [0.5] * 200)
    small = helper.make_tensor("small", TensorProto.FLOAT, [30, 4], [0.25] * 120)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
         helper.make_node("Unsqueeze", ["ids64", "axes"], ["ids3"]),
         helper.make_node("Gather", ["table", "ids3"], ["rows"]),
         helper.make_node("Gather", ["small", "ids"], ["others"]),
         helper.make_node("ReduceMean", ["rows"], ["out"], keepdims=0),
         helper.make_node("ReduceMean", ["others"], ["out2"], keepdims=0)],
        "ids", [helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", 6])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("out2", TensorProto.FLOAT, None)],
        [table, small, axes],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_drawn_probes_stay_within_what_the_graph_says_each_input_takes(tmp_path: Path) -> None:
    config = EncoderConfig()
    encoder = onnx.load(str(build_encoder(tmp_path / "encoder.onnx")))
    assert index_bounds(encoder) == {"input_ids": config.vocab, "token_type_ids": 2}
    assert index_bounds(_cast_ids_model()) == {"ids": 30}
    only_cast = _cast_ids_model()
    del only_cast.graph.node[3]  # the small table gone: the cast ids reach the 50 rows
    assert index_bounds(only_cast) == {"ids": 50}
    from kubeinfer.runtime.building.calibration import describe_model

    probes = draw_probe_inputs(encoder, describe_model(encoder)[0], 16)
    ids = probes["input_ids"]
    assert ids.shape == (16, 8) and ids.min() >= 0 and ids.max() < config.vocab
    assert ids.max() > 100  # drawn over the vocabulary, not 0 and 1 only
    assert set(np.unique(probes["token_type_ids"])) == {0, 1}
    assert (probes["attention_mask"] == 1).all()
    image = onnx.load(str(_image_model(tmp_path / "image.onnx")))
    pixels = draw_probe_inputs(image, describe_model(image)[0], 16)["image"]
    assert pixels.min() >= 0 and pixels.max() <= 255 and pixels.max() > 200


def test_an_encoder_with_variable_axes_is_checked_within_its_range_and_skipped_outside(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    built = build_engine(str(build_encoder(tmp_path / "encoder.onnx")), "onnxruntime", "fp32",
                         cache, max_batch_size=4)  # fmt: skip
    recorded = built.manifest.known_answers
    assert recorded is not None and recorded.source == "drawn"
    assert [o.name for o in recorded.outputs] == ["logits", "last_hidden_state"]
    names = ("input_ids", "attention_mask", "token_type_ids")

    def shapes(low: int, high: int) -> list[InputShape]:
        return [
            InputShape(name=n, min_shape=[low], opt_shape=[high], max_shape=[high]) for n in names
        ]

    engine, known = _known(built, cache, input_shapes=shapes(1, 16))
    ids = known.probes.inputs["input_ids"]
    assert ids.shape == (16, 8) and 100 < ids.max() < EncoderConfig().vocab  # drawn in range
    assert (known.probes.inputs["attention_mask"] == 1).all()
    try:
        verdict = check_engine(engine, known, batch_rows=4)  # 16 probes: 1 alone, 4, 4, 4, 3
    finally:
        engine.close()
    assert verdict.passed and verdict.checked and verdict.probes == 16, verdict.reason()
    engine, known = _known(built, cache, input_shapes=shapes(16, 32))
    try:
        skipped = check_engine(engine, known)
    finally:
        engine.close()
    assert skipped.result == "skipped" and skipped.passed
    assert "input 'input_ids' has item shape [8], outside what this configuration serves" in (
        skipped.reason()
    )


def test_a_text_classifier_is_checked_label_by_label(tmp_path: Path) -> None:
    _, _, held_out, _ = text_split()
    texts = write_samples(tmp_path / "texts.npz", {"text": np.array(held_out).reshape(-1, 1)})
    model = build_text_classifier(tmp_path / "text.onnx")[0]
    cache = tmp_path / "cache"
    built = build_engine(str(model), "onnxruntime", "fp32", cache, calibration=str(texts))
    recorded = built.manifest.known_answers
    assert recorded is not None and recorded.source == "calibration"
    by_name = {o.name: o for o in recorded.outputs}
    assert (by_name["label"].comparison, by_name["label"].tolerance) == ("equal", 0.0)
    assert by_name["probabilities"].comparison == "relativeError"
    engine, known = _known(built, cache)
    try:
        assert len(set(known.probes.expected["label"].ravel())) > 1  # probes of several topics
        verdict = check_engine(engine, known)
    finally:
        engine.close()
    assert verdict.passed, verdict.reason()
    assert {o.name: o.error for o in verdict.outputs}["label"] == 0.0


def test_drawn_text_probes_are_answered_as_the_text_they_hold(tmp_path: Path) -> None:
    """A text model's fp32 reference reads the probes' strings as text, as serving does:
    fed their bytes, ONNX Runtime would read each as its repr ("b'...'"), record answers
    no served replica gives, and the replica would never become ready."""
    pytest.importorskip("onnxruntime_extensions")
    model, pipeline = build_text_classifier(tmp_path / "text.onnx", extensions=True)
    cache = tmp_path / "cache"
    built = build_engine(str(model), "onnxruntime", "fp16", cache)
    recorded = built.manifest.known_answers
    assert recorded is not None and recorded.source == "drawn"
    engine, known = _known(built, cache)
    try:
        verdict = check_engine(engine, known)
    finally:
        engine.close()
    assert verdict.passed, verdict.reason()
    texts = [normalised(t.decode()) for t in known.probes.inputs["raw_text"].ravel()]
    expected = [label.decode() for label in known.probes.expected["label"].ravel()]
    assert expected == list(pipeline.predict(texts))


def test_a_given_probe_set_is_recorded_and_a_cache_hit_keeps_the_recorded_one(
    models: dict[str, Path], tmp_path: Path
) -> None:
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((5, 16)).astype(np.float32)
    given = write_samples(tmp_path / "probes.npz", {"input": rows})
    cache = tmp_path / "cache"
    built = build_engine(str(models["tiny"]), "onnxruntime", "fp32", cache, probe_set=str(given))
    recorded = built.manifest.known_answers
    assert recorded is not None and recorded.source == "probe-set" and recorded.probes == 5
    assert recorded.source_sha256 == sha256_file(given)
    engine, known = _known(built, cache)
    engine.close()
    np.testing.assert_array_equal(known.probes.inputs["input"], rows)
    other = write_samples(tmp_path / "other.npz", {"input": np.zeros((2, 16), np.float32)})
    said: list[str] = []
    hit = build_engine(str(models["tiny"]), "onnxruntime", "fp32", cache, probe_set=str(other),
                       progress=said.append)  # fmt: skip
    assert hit.cache_hit and hit.manifest.known_answers == recorded
    assert any("keeps the known-answer set its build recorded (probe-set)" in s for s in said)
