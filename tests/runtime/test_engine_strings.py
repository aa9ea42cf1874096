"""Strings and what is not a tensor on the ONNX Runtime engine (`engines.onnx_text`), on
real models: a string graph built here, scikit-learn's TF-IDF text classifier and digits
MLP exported by skl2onnx, and the text classifier behind onnxruntime-extensions operators.

Covers: a STRING input and output are BYTES, read and answered as bytes through a slot at
every batch size (UTF-8 text beyond ASCII included, and the elements are not read as
their repr); the text classifier answers scikit-learn's own predictions and
probabilities; a graph using onnxruntime-extensions operators loads and answers where the
library is installed, and where it is not (a process that cannot import it) is refused
with the install command; skl2onnx's default ZipMap output is refused naming the option
that removes it; a text model whose locale this system lacks names the export option.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from kubeinfer.runtime.engines.base import TensorSpec, UnsupportedModel
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from models.sklearn_models import (
    build_digits_mlp,
    build_text_classifier,
    text_split,
)
from onnx import TensorProto, helper

pytest.importorskip("onnxruntime_extensions")


def _strings(values: list[str], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode() for v in values]
    return array.reshape(shape)


def _run(engine: OnnxRuntimeEngine, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rows = next(iter(feed.values())).shape[0]
    slot = engine.create_slot()
    try:
        for name, view in slot.input_views(rows).items():
            view[...] = feed[name]
        return {name: np.array(out, copy=True) for name, out in slot.run(rows).items()}
    finally:
        slot.close()


def test_string_tensors_are_bytes_through_a_slot_at_every_batch_size(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"]),
         helper.make_node("Shape", ["text"], ["shape"])],
        "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", 2])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["batch", 2]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "strings.onnx"
    onnx.save(model, str(path))
    with pytest.raises(UnsupportedModel, match="'shape'"):  # no batch: still refused
        OnnxRuntimeEngine(path, max_batch_size=4)
    del model.graph.node[1], model.graph.output[1]
    onnx.save(model, str(path))
    engine = OnnxRuntimeEngine(path, max_batch_size=4)
    assert engine.inputs == (TensorSpec("text", "BYTES", (-1, 2)),)
    assert engine.outputs == (TensorSpec("same", "BYTES", (-1, 2)),)
    words = ["naïve", "", "日本語", "a\x00b", "b'x'", "plain", "ünï", "z"]
    slot = engine.create_slot()
    for rows in range(1, 5):
        feed = _strings(words[: rows * 2], (rows, 2))
        slot.input_views(rows)["text"][...] = feed
        out = slot.run(rows)["same"]
        assert out.dtype == object and all(type(e) is bytes for e in out.ravel())
        assert out.tolist() == feed.tolist()
    slot.close()


@pytest.mark.parametrize("extensions", [False, True])
def test_the_text_classifier_answers_scikit_learns_predictions(
    tmp_path: Path, extensions: bool
) -> None:
    path, pipeline = build_text_classifier(tmp_path / "text.onnx", extensions=extensions)
    engine = OnnxRuntimeEngine(path, max_batch_size=16)
    name = engine.inputs[0].name
    assert engine.inputs[0].datatype == "BYTES"
    assert {s.name: s.datatype for s in engine.outputs} == {
        "label": "BYTES", "probabilities": "FP32"
    }  # fmt: skip
    _, _, held_out, topics = text_split()
    texts = [t.upper() + "!" for t in held_out] if extensions else held_out
    outputs = _run(engine, {name: _strings(texts, (len(texts), 1))})
    expected = pipeline.predict(held_out)
    assert [label.decode() for label in outputs["label"]] == list(expected)
    assert sum(np.asarray(expected) == topics) >= 6  # it learned the topics (7 of 9)
    np.testing.assert_allclose(
        outputs["probabilities"], pipeline.predict_proba(held_out), rtol=1e-4, atol=1e-5
    )


def test_an_extensions_graph_without_the_library_names_the_extra(tmp_path: Path) -> None:
    path, _ = build_text_classifier(tmp_path / "text.onnx", extensions=True)
    code = f"""
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "onnxruntime_extensions":
            raise ModuleNotFoundError(name=name)
sys.meta_path.insert(0, Blocked())
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
OnnxRuntimeEngine({str(path)!r}, max_batch_size=2)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    assert "ai.onnx.contrib:StringLower" in result.stderr
    assert "pip install 'kubeinfer[extensions]'" in result.stderr, result.stderr


def test_a_graph_of_standard_operators_loads_without_importing_the_library(
    tmp_path: Path,
) -> None:
    """The library (and the onnx package it imports) stays out of a process serving a
    model that needs none of its operators: a share of every start."""
    from kubeinfer.cli.demo.mlp_models import build_tiny_mlp

    path = build_tiny_mlp(tmp_path / "tiny.onnx")
    code = f"""
import sys
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
OnnxRuntimeEngine({str(path)!r}, max_batch_size=2).close()
print(sorted(m for m in ("onnxruntime_extensions", "onnx") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_a_zipmap_output_is_refused_naming_the_skl2onnx_option(tmp_path: Path) -> None:
    path, _ = build_digits_mlp(tmp_path / "digits-zipmap.onnx", zipmap=True)
    with pytest.raises(UnsupportedModel) as refused:
        OnnxRuntimeEngine(path, max_batch_size=4)
    message = str(refused.value)
    assert "'output_probability' has type seq(map(int64,tensor(float)))" in message
    assert "ZipMap" in message and "{'zipmap': False}" in message


def test_a_locale_this_system_lacks_names_the_export_option(tmp_path: Path) -> None:
    path, _ = build_text_classifier(tmp_path / "text.onnx")
    model = onnx.load(str(path))
    [normalizer] = [n for n in model.graph.node if n.op_type == "StringNormalizer"]
    [locale] = [a for a in normalizer.attribute if a.name == "locale"]
    locale.s = b"xx_NOWHERE.UTF-8"
    onnx.save(model, str(path))
    with pytest.raises(UnsupportedModel, match=r"(?s)xx_NOWHERE.*options=\{id\(vectorizer\)"):
        OnnxRuntimeEngine(path, max_batch_size=2)
