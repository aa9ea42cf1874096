"""The pure pieces of "does this model batch?", and the probe on real engines.

Covers: `compare_trial` (stacked answers batch; an output of the wrong row count, of
another shape, or of values past the tolerance does not; integers and strings compare
exactly; NaN where the other has NaN is equal); `tolerance` by datatype; `trial_rows`
(two different rows of valid values for each datatype); `trial_item_shapes` (optShape,
else one extent per axis name within the range); `effective_max_batch_size`;
`with_batching_found` (the config served: maxBatchSize 1 and no preferred sizes unless
the model batches) and what `say_batching_found` logs; `probe_batching` on ONNX Runtime
engines: the tokenizer-in-graph classifiers, a BERT-style encoder with variable axes, a
model whose one-row run fails (reported, not raised), one that fails on two rows, and an
engine loaded for one row.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from kubeinfer.contract.runtime_config import InputShape, RuntimeConfig
from kubeinfer.runtime.engines.base import TensorSpec
from kubeinfer.runtime.engines.batching_probe import (
    FLOAT16_RTOL,
    FLOAT32_RTOL,
    TRIAL_EXTENT,
    BatchingProbe,
    compare_trial,
    effective_max_batch_size,
    probe_batching,
    say_batching_found,
    tolerance,
    trial_item_shapes,
    trial_rows,
    with_batching_found,
)
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from models.transformer_models import build_encoder
from onnx import TensorProto, helper

LOGITS = TensorSpec("logits", "FP32", (-1, 2))
LABEL = TensorSpec("label", "BYTES", (-1,))


def _alone(*rows: list[float]) -> list[dict[str, np.ndarray]]:
    return [{"logits": np.array([row], np.float32)} for row in rows]


def test_answers_that_stack_batch() -> None:
    alone = _alone([1.0, 2.0], [3.0, 4.0])
    together = {"logits": np.array([[1.0, 2.0], [3.0, 4.0 + 1e-6]], np.float32)}
    assert compare_trial([LOGITS], alone, together) == BatchingProbe(True)


@pytest.mark.parametrize(
    ("together", "why"),
    [
        (np.array([[2.0, 3.0]], np.float32), "has 1 rows for a run of 2 different rows"),
        (np.zeros((0, 2), np.float32), "has 0 rows for a run of 2 different rows"),
        (np.array([[1.0, 2.0], [3.0, 4.1]], np.float32), "largest difference 0.1"),
        (np.array([[1.0, 2.0, 0], [3.0, 4.0, 0]], np.float32), "shape [2, 3], alone [2, 2]"),
        (np.array([[1.0, np.nan], [3.0, 4.0]], np.float32), "NaN or infinity"),
    ],
)
def test_answers_that_do_not_stack_do_not_batch(together: np.ndarray, why: str) -> None:
    found = compare_trial([LOGITS], _alone([1.0, 2.0], [3.0, 4.0]), {"logits": together})
    assert found.batches is False and why in found.reason and "'logits'" in found.reason


def test_an_output_that_does_not_follow_one_row_does_not_batch() -> None:
    alone = [{"logits": np.zeros((0, 2), np.float32)}, *_alone([1.0, 2.0])]
    found = compare_trial([LOGITS], alone, {"logits": np.zeros((2, 2), np.float32)})
    assert found == BatchingProbe(
        False,
        "output 'logits' has 0 rows for a run of one row (row A): it does not follow the batch",
    )


def test_nan_where_alone_has_nan_is_equal_and_strings_compare_exactly() -> None:
    alone = [{"logits": np.array([[np.nan, 1.0]], np.float32)}, *_alone([2.0, 3.0])]
    together = {"logits": np.array([[np.nan, 1.0], [2.0, 3.0]], np.float32)}
    assert compare_trial([LOGITS], alone, together).batches is True
    labels = [{"label": np.array([b"cat"], object)}, {"label": np.array([b"dog"], object)}]
    assert compare_trial([LABEL], labels, {"label": np.array([b"cat", b"dog"], object)}).batches
    swapped = compare_trial([LABEL], labels, {"label": np.array([b"dog", b"cat"], object)})
    assert swapped == BatchingProbe(
        False,
        "output 'label' of 2 different rows run together is not their outputs run alone "
        "(different values)",
    )


def test_the_tolerance_is_relative_to_the_outputs_scale_and_by_datatype() -> None:
    assert tolerance(np.dtype(np.float32)) == FLOAT32_RTOL
    assert tolerance(np.dtype(np.float64)) == FLOAT32_RTOL
    assert tolerance(np.dtype(np.float16)) == FLOAT16_RTOL
    assert tolerance(np.dtype(np.int64)) is None and tolerance(np.dtype(object)) is None
    big = _alone([1000.0, 0.0], [0.0, 0.0])
    within = {"logits": np.array([[1000.5, 0.0], [0.5, 0.0]], np.float32)}  # 5e-4 of 1000
    assert compare_trial([LOGITS], big, within).batches is True
    past = {"logits": np.array([[1000.0, 0.0], [2.0, 0.0]], np.float32)}  # 2e-3 of 1000
    assert compare_trial([LOGITS], big, past).batches is False


@pytest.mark.parametrize("datatype", ["INT64", "INT32", "UINT8", "BOOL", "FP32", "FP16", "BYTES"])
def test_trial_rows_differ_and_stay_valid(datatype: str) -> None:
    spec = TensorSpec("x", datatype, (-1, 6))
    first, second = trial_rows(spec, (6,))
    assert first.shape == second.shape == (1, 6) and first.dtype == spec.dtype
    assert not np.array_equal(first, second)
    if datatype not in ("FP32", "FP16", "BYTES"):  # ids, masks and indices: 0 and 1 only
        assert set(np.unique(np.concatenate([first, second]).astype(int))) <= {0, 1}
        assert first.ravel()[0] == second.ravel()[0] == 1  # a first token kept, a mask's too
    one_a, one_b = trial_rows(TensorSpec("x", datatype, (-1, 1)), (1,))
    assert not np.array_equal(one_a, one_b)


def test_variable_axes_take_the_opt_shape_else_one_extent_per_axis_name() -> None:
    ids = TensorSpec("ids", "INT64", (-1, -1), ("sequence",), (1,), (4,))
    mask = TensorSpec("mask", "INT64", (-1, -1), ("sequence",), (1,), (64,))
    fixed = TensorSpec("fixed", "FP32", (-1, 3))
    assert trial_item_shapes([ids, mask, fixed]) == ((4,), (4,), (3,))  # 8, within ids' range
    wide = TensorSpec("ids", "INT64", (-1, -1), ("sequence",), (1,), (512,))
    assert trial_item_shapes([wide]) == ((TRIAL_EXTENT,),)
    opt = [InputShape(name="ids", min_shape=[1], opt_shape=[32], max_shape=[512])]
    assert trial_item_shapes([wide], opt) == ((32,),)


def test_a_model_that_does_not_batch_runs_one_request_per_run() -> None:
    assert effective_max_batch_size(BatchingProbe(True), 8) == 8
    assert effective_max_batch_size(BatchingProbe(False, "why"), 8) == 1
    assert effective_max_batch_size(BatchingProbe(None, "why"), 8) == 1
    assert BatchingProbe(None).one_request_per_run and not BatchingProbe(True).one_request_per_run


def test_the_config_served_is_the_one_what_the_probe_found_allows() -> None:
    config = RuntimeConfig.model_validate({
        "modelName": "m", "engine": {"onnxPath": "m.onnx"},
        "batching": {"maxBatchSize": 16, "preferredBatchSizes": [4, 16]},
    })  # fmt: skip
    assert with_batching_found(config, BatchingProbe(True)) is config
    for probe in (BatchingProbe(False, "why"), BatchingProbe(None, "why")):
        found = with_batching_found(config, probe)
        assert (found.batching.max_batch_size, found.batching.preferred_batch_sizes) == (1, [])
        assert found.batching.execution_slots == config.batching.execution_slots


def test_what_the_probe_found_is_said_once_a_warning_when_a_size_is_set_aside(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = RuntimeConfig.model_validate(
        {"modelName": "m", "engine": {"onnxPath": "m.onnx"}, "batching": {"maxBatchSize": 8}}
    )
    caplog.set_level(logging.INFO, logger="kubeinfer.runtime.engines.batching_probe")
    say_batching_found(config, BatchingProbe(True), 8)
    say_batching_found(config, BatchingProbe(False, "its output has one row"), 1)
    found, set_aside = caplog.records
    assert found.levelno == logging.INFO and "Found the model batches" in found.getMessage()
    assert set_aside.levelno == logging.WARNING
    assert set_aside.getMessage() == (
        "Serving one request per run: the model does not batch (its output has one row) "
        "model=m max_batch_size=1; maxBatchSize 8 set aside"
    )


# -- the probe on real engines ---------------------------------------------------------------


def _save(path: Path, nodes: list, inputs: list, outputs: list, initializers: list) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_the_tokenizer_in_graph_classifiers_are_found_out(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime_extensions")
    from models.tokenizer_models import build_bert_tokenizer_classifier, build_hf_json_classifier

    found = {
        name: probe_batching(OnnxRuntimeEngine(build(tmp_path / f"{name}.onnx"), 4))
        for name, build in [
            ("bert", build_bert_tokenizer_classifier),
            ("unmasked", lambda p: build_hf_json_classifier(p, False)),
            ("masked", lambda p: build_hf_json_classifier(p, True)),
        ]
    }
    assert found["bert"] == BatchingProbe(
        False, "output 'logits' has 1 rows for a run of 2 different rows"
    )
    assert found["unmasked"].batches is False
    assert "not their outputs run alone (largest difference" in found["unmasked"].reason
    assert found["masked"] == BatchingProbe(True)


def test_an_encoder_with_variable_axes_batches(tmp_path: Path) -> None:
    shapes = [InputShape(name=n, min_shape=[1], opt_shape=[16], max_shape=[64])
              for n in ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip
    engine = OnnxRuntimeEngine(build_encoder(tmp_path / "encoder.onnx"), 4, input_shapes=shapes)
    assert probe_batching(engine, shapes) == BatchingProbe(True)


def test_a_model_whose_one_row_run_fails_is_reported_not_raised(tmp_path: Path) -> None:
    """A lookup into a table of one row: the trial's id 1 is out of range."""
    path = _save(
        tmp_path / "lookup.onnx",
        [helper.make_node("Gather", ["table", "ids"], ["y"])],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor("table", TensorProto.FLOAT, [1, 3], [1.0, 2.0, 3.0])],
    )
    found = probe_batching(OnnxRuntimeEngine(path, 4))
    assert found.batches is None
    assert found.reason.startswith("a trial run of one row failed, so it is not known: ")
    assert "\n" not in found.reason


def test_a_model_that_fails_on_two_rows_does_not_batch(tmp_path: Path) -> None:
    """x scaled by a table's entry at the batch size less one, in a table of one entry:
    right for one row, out of range for two."""
    path = _save(
        tmp_path / "one_row.onnx",
        [helper.make_node("Shape", ["x"], ["x_shape"]),
         helper.make_node("Gather", ["x_shape", "zero"], ["rows"], axis=0),
         helper.make_node("Sub", ["rows", "one"], ["last"]),
         helper.make_node("Gather", ["scales", "last"], ["scale"], axis=0),
         helper.make_node("Mul", ["x", "scale"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
         helper.make_tensor("one", TensorProto.INT64, [], [1]),
         helper.make_tensor("scales", TensorProto.FLOAT, [1], [2.0])],
    )  # fmt: skip
    found = probe_batching(OnnxRuntimeEngine(path, 4))
    assert found.batches is False
    assert found.reason.startswith("a trial run of two different rows failed: ")


def test_an_engine_for_one_row_is_not_probed(tmp_path: Path) -> None:
    engine = OnnxRuntimeEngine(build_encoder(tmp_path / "encoder.onnx"), 1, input_shapes=None)
    assert probe_batching(engine) == BatchingProbe(
        None, "not probed: maxBatchSize 1 runs one request per run already"
    )
