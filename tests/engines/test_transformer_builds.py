"""Engines built from models with a variable sequence length (`models.transformer_models`),
then served from the cache with their ranges.

Covers: the BERT-style encoder and the GPT-2-style decoder build at fp32 and fp16 with no
sample data (synthetic samples give each named variable axis an extent, a sum the sum of
its terms', so the decoder's attention mask matches its past and new tokens) and the
encoder at int8 from calibration data of one length; each built engine, loaded from the
cache for serving with `inputShapes`, answers requests of other lengths as the fp32 model
does (within each precision's own tolerance; int8 judged on the logits' top-1); a model
with an unnamed variable axis still needs sample data, and says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kubeinfer.contract.runtime_config import InputShape
from kubeinfer.runtime.building.calibration import CalibrationDataError, write_samples
from kubeinfer.runtime.building.engine_build import build_engine
from kubeinfer.runtime.engine_cache import load_cached_engine
from models.transformer_models import build_decoder, build_encoder, decoder_inputs, encoder_inputs
from onnx import TensorProto, helper

TEXT = ("input_ids", "attention_mask", "token_type_ids")
TEXT_SHAPES = [
    InputShape(name=n, min_shape=[1], opt_shape=[32], max_shape=[128], pad_value=0) for n in TEXT
]
DECODER_SHAPES = [
    InputShape(name="input_ids", min_shape=[1], opt_shape=[8], max_shape=[64]),
    InputShape(name="attention_mask", min_shape=[1], opt_shape=[8], max_shape=[128]),
    *(
        InputShape(name=f"past_{i}_{p}", min_shape=[4, 0, 16], opt_shape=[4, 8, 16],
                   max_shape=[4, 64, 16])
        for i in range(2)
        for p in ("key", "value")
    ),
]  # fmt: skip


def answer(engine, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    slot = engine.create_slot()
    rows = next(iter(feed.values())).shape[0]
    shape = tuple(feed[s.name].shape[1:] for s in engine.inputs)
    for name, view in slot.input_views(rows, shape).items():
        view[...] = feed[name]
    outputs = {k: v.copy() for k, v in slot.run(rows, shape).items()}
    slot.close()
    return outputs


def fp32(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_transformers_build_without_samples_and_serve_other_lengths(
    tmp_path: Path, precision: str
) -> None:
    rng = np.random.default_rng(0)
    tolerance = 1e-4 if precision == "fp32" else 5e-2
    cases = [
        (build_encoder(tmp_path / "encoder.onnx"), TEXT_SHAPES, encoder_inputs(rng, 3, 37)),
        (build_decoder(tmp_path / "decoder.onnx"), DECODER_SHAPES, decoder_inputs(rng, 2, 5, 11)),
    ]
    for path, shapes, feed in cases:
        built = build_engine(
            str(path), "onnxruntime", precision, tmp_path / "cache", max_batch_size=4
        )
        engine = load_cached_engine(tmp_path / "cache", built.digest, 4, input_shapes=shapes)
        got, want = answer(engine, feed), fp32(path, feed)
        for name, expected in want.items():
            np.testing.assert_allclose(got[name], expected, rtol=tolerance, atol=tolerance)
        engine.close()


def test_an_int8_encoder_calibrated_on_one_length_serves_others(tmp_path: Path) -> None:
    path = build_encoder(tmp_path / "encoder.onnx")
    calibration = write_samples(
        tmp_path / "calibration.npz", encoder_inputs(np.random.default_rng(1), 48, 32)
    )
    built = build_engine(
        str(path), "onnxruntime", "int8", tmp_path / "cache", calibration=str(calibration),
        max_batch_size=8, max_top1_drop=0.2,
    )  # fmt: skip
    engine = load_cached_engine(tmp_path / "cache", built.digest, 8, input_shapes=TEXT_SHAPES)
    rng = np.random.default_rng(2)
    agreed = total = 0
    for length in (3, 64, 128):
        feed = encoder_inputs(rng, 8, length)
        got, want = answer(engine, feed)["logits"], fp32(path, feed)["logits"]
        agreed += int((got.argmax(1) == want.argmax(1)).sum())
        total += len(got)
    assert agreed >= 0.8 * total, (agreed, total)
    engine.close()


def test_an_unnamed_variable_axis_still_needs_samples(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "unnamed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "unnamed.onnx"))
    with pytest.raises(CalibrationDataError, match="unnamed dynamic non-batch dimension"):
        build_engine(str(tmp_path / "unnamed.onnx"), "onnxruntime", "fp32", tmp_path / "cache")
