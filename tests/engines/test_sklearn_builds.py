"""`kubeinfer build` on scikit-learn models exported by skl2onnx, trained on the digits
data set scikit-learn ships and on a small text corpus, and the accuracy gate told which
outputs hold the scores.

Covers: the default export (ZipMap) is refused at every precision with one line naming
skl2onnx's option, exit 2, no traceback; without ZipMap the MLP builds at fp32 and at int8
(its [1, N] biases, onnxruntime#24815) calibrated on real digits, the gates judging
`probabilities` by default and comparing `label` only, and the int8 engine's labels
agree with fp32's on held-out digits within the gate (a tolerance, not exact values: the
CPU's int8 kernels differ with and without VNNI); a graph of `ai.onnx.ml` operators only
and the TF-IDF text model are refused for int8 with the reason, and build at fp32/fp16;
`--gate-outputs` chooses the judged outputs (an unknown name is bad input naming the
model's outputs), the report marks each output gated or compared only, and the
progress lines say so; the gate rules themselves as a table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.cli.main import main
from kubeinfer.runtime.building.accuracy import gate_violations, gated_output_names
from kubeinfer.runtime.building.calibration import write_samples
from kubeinfer.runtime.engine_cache import load_cached_engine
from kubeinfer.runtime.engine_manifest import AccuracyReport, OutputAccuracy
from models.sklearn_models import (
    build_digits_linear,
    build_digits_mlp,
    build_text_classifier,
    digits,
    text_split,
)

MAX_TOP1_DROP = 0.02


def _build(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | None, str]:
    code = main(["build", *args, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sklearn")
    data = digits()
    _, _, held_out, _ = text_split()
    return {
        "mlp": build_digits_mlp(root / "mlp.onnx")[0],
        "zipmap": build_digits_mlp(root / "zipmap.onnx", zipmap=True)[0],
        "linear": build_digits_linear(root / "linear.onnx")[0],
        "text": build_text_classifier(root / "text.onnx")[0],
        "calibration": write_samples(root / "calibration.npz", {"X": data.calibration_x}),
        "validation": write_samples(root / "validation.npz", {"X": data.validation_x}),
        "texts": write_samples(root / "texts.npz", {"text": np.array(held_out).reshape(-1, 1)}),
    }


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_default_zipmap_export_is_refused_naming_the_option(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], precision: str
) -> None:
    code, _, err = _build(
        capsys, "--model", str(files["zipmap"]), "--precision", precision,
        "--calibration", str(files["calibration"]), "--cache", str(tmp_path),
    )  # fmt: skip
    [line] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and "Traceback" not in err
    assert "cannot be served: output 'output_probability'" in line
    assert "ZipMap" in line and "options={id(clf): {'zipmap': False}}" in line


def test_the_mlp_builds_at_int8_gated_on_its_probabilities_and_agrees_with_fp32(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = str(tmp_path / "cache")
    gate = ["--max-top1-drop", str(MAX_TOP1_DROP), "--cache", cache]
    code, fp32, err = _build(capsys, "--model", str(files["mlp"]), *gate)
    assert code == 0, err
    code, int8, err = _build(
        capsys, "--model", str(files["mlp"]), "--precision", "int8",
        "--calibration", str(files["calibration"]), *gate,
    )  # fmt: skip
    assert code == 0, err
    assert "Gating outputs ['probabilities']; comparing only ['label']" in err
    outputs = {o["name"]: o for o in int8["accuracy"]["outputs"]}
    assert outputs["probabilities"]["gated"] and not outputs["label"]["gated"]
    assert outputs["probabilities"]["top1Agreement"] >= 1 - MAX_TOP1_DROP
    assert outputs["label"]["maxAbsDiff"] == 0  # labels are compared by equality
    labels = {}
    x = digits().validation_x
    for name, built in (("fp32", fp32), ("int8", int8)):
        engine = load_cached_engine(cache, built["digest"], max_batch_size=32)
        slot = engine.create_slot()
        chunks = []
        for start in range(0, len(x), 32):
            rows = x[start : start + 32]
            slot.input_views(len(rows))["X"][...] = rows
            chunks.append(np.array(slot.run(len(rows))["label"], copy=True))
        slot.close()
        engine.close()
        labels[name] = np.concatenate(chunks)
    agreement = float(np.mean(labels["fp32"] == labels["int8"]))
    assert agreement >= 1 - MAX_TOP1_DROP, agreement
    assert np.mean(labels["fp32"] == digits().validation_y) > 0.85  # a real classifier


@pytest.mark.parametrize(("model", "validation"), [("linear", "validation"), ("text", "texts")])
def test_graphs_int8_cannot_quantise_are_refused_and_build_at_fp32_and_fp16(
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    model: str,
    validation: str,
) -> None:
    cache = str(tmp_path / "cache")
    code, _, err = _build(
        capsys, "--model", str(files[model]), "--precision", "int8",
        "--calibration", str(files[validation]), "--cache", cache,
    )  # fmt: skip
    [line] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and "Traceback" not in err
    assert "int8 quantises the weights of standard ONNX operators" in line
    assert "LinearClassifier (ai.onnx.ml)" in line and "Build it at fp32" in line
    assert not (tmp_path / "cache" / "engines").exists()
    for precision in ("fp32", "fp16"):
        code, manifest, err = _build(
            capsys, "--model", str(files[model]), "--precision", precision,
            "--validation", str(files[validation]), "--max-top1-drop", "0", "--cache", cache,
        )  # fmt: skip
        assert code == 0, err
        outputs = {o["name"]: o for o in manifest["accuracy"]["outputs"]}
        assert outputs["probabilities"]["top1Agreement"] == 1.0
        assert outputs["label"]["top1Agreement"] == 1.0


def test_gate_outputs_choose_what_is_judged_and_an_unknown_one_is_bad_input(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = str(tmp_path / "cache")
    code, manifest, err = _build(
        capsys, "--model", str(files["mlp"]), "--gate-outputs", "label", "--cache", cache
    )
    assert code == 0 and "Gating outputs ['label']; comparing only ['probabilities']" in err
    gated = {o["name"]: o["gated"] for o in manifest["accuracy"]["outputs"]}
    assert gated == {"label": True, "probabilities": False}
    code, _, err = _build(
        capsys, "--model", str(files["mlp"]), "--gate-outputs", "logits", "--cache", cache
    )
    assert code == 2 and "Traceback" not in err
    assert "the gate outputs ['logits'] are not outputs of the model; its outputs are " in err


def _output(name: str, cosine: float, top1: float | None) -> OutputAccuracy:
    return OutputAccuracy(
        name=name, max_abs_diff=0.1, mean_abs_diff=0.01, cosine_similarity=cosine,
        min_cosine_similarity=cosine, top1_agreement=top1,
    )  # fmt: skip


DECODER = AccuracyReport(
    validation_source="given",
    samples=8,
    outputs=[
        _output("logits", 0.999, 1.0),
        _output("present_0_key", 0.95, 0.958),
        _output("last_hidden_state", 0.97, 0.9),
    ],
)


@pytest.mark.parametrize(
    ("names", "chosen", "gated"),
    [
        (["logits", "present_0_key"], None, ["logits"]),
        (["label", "probabilities"], None, ["probabilities"]),
        (["output_probability", "scores", "h"], None, ["output_probability", "scores"]),
        (["y", "z"], None, ["y", "z"]),  # no name says scores: all
        (["logits", "present_0_key"], ["present_0_key"], ["present_0_key"]),
        (["b", "a"], ["a", "b"], ["b", "a"]),  # the model's order
    ],
)
def test_which_outputs_are_gated(names, chosen, gated) -> None:
    assert gated_output_names(names, chosen) == gated


def test_the_gates_judge_the_gated_outputs_only() -> None:
    assert gate_violations(DECODER, max_top1_drop=0.01, min_cosine=0.99) == []
    everything = ["logits", "present_0_key", "last_hidden_state"]
    violations = gate_violations(DECODER, 0.01, 0.99, everything)
    assert len(violations) == 4 and "output 'present_0_key': top-1 drop 0.0420" in violations[2]
    no_classes = AccuracyReport(
        validation_source="given", samples=8, outputs=[_output("logits", 1.0, None)]
    )
    [message] = gate_violations(no_classes, max_top1_drop=0.01)
    assert "no gated output (logits) has a last axis" in message and "--gate-outputs" in message
