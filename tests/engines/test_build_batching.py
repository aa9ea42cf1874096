"""`kubeinfer build` finds out whether the model batches, as serving does at start, and
records it: the built engine tried with one row and two different rows.

Covers: a classifier with `BertTokenizer` in its graph is recorded as not batching, why, in
the manifest (`batching`, also on a cache hit) and the termination message (`batches`,
`batchingReason`), and its accuracy is measured one sample per run, as it is served (the
tokenizer cannot take a batch: measured in batches, the build would fail); the same
tokenizer pipeline whose padding is masked is recorded as batching; a model with variable
input axes is left for the runtime to find out (their ranges are the serving
configuration's), and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubeinfer.cli.main import main
from kubeinfer.runtime.building.engine_build import NOT_PROBED_AT_BUILD
from models.tokenizer_models import build_bert_tokenizer_classifier, build_hf_json_classifier
from models.transformer_models import build_encoder

pytest.importorskip("onnxruntime_extensions")


def _build(
    capsys: pytest.CaptureFixture[str], model: Path, cache: Path, message: Path
) -> tuple[dict, dict, str]:
    """(the termination message, the manifest, stderr) of `kubeinfer build --json`."""
    code = main(["build", "--model", str(model), "--cache", str(cache), "--max-batch-size", "8",
                 "--json", "--termination-message-path", str(message)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(message.read_text()), json.loads(captured.out), captured.err


def test_a_tokenizer_that_reads_one_text_per_run_is_recorded_as_not_batching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = build_bert_tokenizer_classifier(tmp_path / "bert" / "model.onnx")
    why = "output 'logits' has 1 rows for a run of 2 different rows"
    summary, manifest, err = _build(capsys, model, tmp_path / "cache", tmp_path / "message")
    assert summary["batches"] is False and summary["batchingReason"] == why
    assert manifest["batching"] == {"batches": False, "reason": why}
    assert manifest["accuracy"]["samples"] == 32  # measured one sample per run
    assert f"Found the model does not batch: it is served one request per run ({why})" in err
    again, manifest, _ = _build(capsys, model, tmp_path / "cache", tmp_path / "message")
    assert again["cacheHit"] is True and again["batches"] is False
    assert manifest["batching"] == {"batches": False, "reason": why}


def test_a_tokenizer_pipeline_that_masks_its_padding_is_recorded_as_batching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = build_hf_json_classifier(tmp_path / "masked" / "model.onnx", mask_padding=True)
    summary, manifest, _ = _build(capsys, model, tmp_path / "cache", tmp_path / "message")
    assert summary["batches"] is True and "batchingReason" not in summary
    assert manifest["batching"] == {"batches": True, "reason": ""}


def test_variable_input_axes_leave_it_to_the_runtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = build_encoder(tmp_path / "encoder.onnx")
    summary, manifest, _ = _build(capsys, model, tmp_path / "cache", tmp_path / "message")
    assert summary["batches"] is None and summary["batchingReason"] == NOT_PROBED_AT_BUILD
    assert manifest["batching"] == {"reason": NOT_PROBED_AT_BUILD}  # unset: not found out
