"""The build's top-1 agreement with fp32 as the operator reads it: `kubeinfer build` of a
real model at int8 writes a termination message that is compact JSON under the 4096 bytes
Kubernetes keeps, whose `accuracy` object (overall and per reference class) agrees with
the manifest's report and with itself, and that the operator's parser takes as the
quality watch's baseline; with 1000 classes the message still fits, keeping the classes
with the most rows. fp32 builds, and builds measured on synthetic inputs, carry none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubeinfer.cli.main import main
from kubeinfer.operator.state.build_attempt import parse_build_report
from kubeinfer.runtime.building.build_command import termination_message
from kubeinfer.runtime.engine_manifest import (
    AccuracyReport,
    ClassAgreement,
    EngineManifest,
    OutputAccuracy,
)

KUBERNETES_MESSAGE_LIMIT_BYTES = 4096


@pytest.fixture(scope="module")
def int8_build(
    models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict, str, Path]:  # type: ignore[type-arg]
    """The termination message (parsed, and as written) and the cache of an int8 build of
    the tiny model ([batch, 16] -> [batch, 10] logits), its validation rows held out of
    the calibration file."""
    root = tmp_path_factory.mktemp("int8")
    message = root / "termination-log"
    code = main([
        "build", "--model", str(models["tiny"]), "--precision", "int8",
        "--calibration", str(models["tiny_calibration"]), "--cache", str(root / "cache"),
        "--termination-message-path", str(message),
    ])  # fmt: skip
    assert code == 0
    text = message.read_text()
    return json.loads(text), text, root / "cache"


def _manifest(cache: Path, digest: str) -> EngineManifest:
    from kubeinfer.runtime.engine_cache import resolve_engine

    return resolve_engine(cache, digest).manifest


def test_an_int8_build_reports_its_agreement_per_class_in_the_termination_message(
    int8_build: tuple[dict, str, Path],  # type: ignore[type-arg]
) -> None:
    document, text, cache = int8_build
    assert len(text.encode()) < KUBERNETES_MESSAGE_LIMIT_BYTES
    assert " " not in text  # compact
    accuracy = document["accuracy"]
    report = _manifest(cache, document["digest"]).accuracy
    assert report is not None and report.validation_source == "held-out"
    logits = report.outputs[0]
    assert accuracy["output"] == logits.name
    assert accuracy["rows"] == logits.top1_rows == report.samples  # one row per sample
    by_class = accuracy["byClass"]
    assert sum(rows for rows, _ in by_class.values()) == accuracy["rows"]  # all 10 fit
    assert sum(agreed for _, agreed in by_class.values()) == accuracy["agreements"]
    assert all(0 <= agreed <= rows for rows, agreed in by_class.values())
    assert accuracy["agreements"] / accuracy["rows"] == pytest.approx(logits.top1_agreement)
    assert logits.top1_by_class is not None
    assert by_class == {k: [c.rows, c.agreements] for k, c in logits.top1_by_class.items()}
    assert set(by_class) <= {str(i) for i in range(10)}


def test_the_operator_reads_the_message_as_the_quality_watchs_baseline(
    int8_build: tuple[dict, str, Path],  # type: ignore[type-arg]
) -> None:
    document, text, _ = int8_build
    baseline = parse_build_report(text).agreement
    assert baseline is not None
    assert (baseline.rows, baseline.agreements) == (
        document["accuracy"]["rows"],
        document["accuracy"]["agreements"],
    )
    assert {k: list(v) for k, v in baseline.by_class.items()} == document["accuracy"]["byClass"]


def test_a_thousand_classes_still_fit_the_message_with_the_most_rows_first(
    int8_build: tuple[dict, str, Path],  # type: ignore[type-arg]
) -> None:
    document, _, cache = int8_build
    manifest = _manifest(cache, document["digest"])
    by_class = {
        str(i): ClassAgreement(rows=1 + (i * 37) % 997, agreements=i % 2) for i in range(1000)
    }
    rows = sum(c.rows for c in by_class.values())
    report = AccuracyReport(
        validation_source="held-out",
        samples=rows,
        outputs=[
            OutputAccuracy(
                name="logits_of_a_thousand_classes", max_abs_diff=0.1, mean_abs_diff=0.01,
                cosine_similarity=0.99, min_cosine_similarity=0.9, top1_rows=rows,
                top1_agreement=500 / rows, top1_by_class=by_class,
            )
        ],
    )  # fmt: skip
    text = termination_message(
        document["digest"], manifest.model_copy(update={"accuracy": report}), False
    )
    assert len(text.encode()) < KUBERNETES_MESSAGE_LIMIT_BYTES
    accuracy = json.loads(text)["accuracy"]
    assert (accuracy["rows"], accuracy["agreements"]) == (rows, 500)
    kept = accuracy["byClass"]
    assert 100 < len(kept) < 1000
    fewest_kept = min(r for r, _ in kept.values())
    assert all(c.rows <= fewest_kept for k, c in by_class.items() if k not in kept)
    assert parse_build_report(text).agreement is not None


@pytest.mark.parametrize(
    ("precision", "data"),
    [
        pytest.param("fp32", "--validation", id="fp32 compared with itself"),
        pytest.param("fp16", None, id="fp16 measured on synthetic inputs"),
    ],
)
def test_builds_that_measured_no_quantisation_on_real_inputs_carry_no_accuracy(
    models: dict[str, Path], tmp_path: Path, precision: str, data: str | None
) -> None:
    message = tmp_path / "termination-log"
    samples = [] if data is None else [data, str(models["tiny_calibration"])]
    code = main([
        "build", "--model", str(models["tiny"]), "--precision", precision, *samples,
        "--cache", str(tmp_path / "cache"), "--termination-message-path", str(message),
    ])  # fmt: skip
    assert code == 0
    document = json.loads(message.read_text())
    assert "accuracy" not in document and document["precision"] == precision
    report = _manifest(tmp_path / "cache", document["digest"]).accuracy
    assert report is not None and report.outputs[0].top1_by_class is not None  # still recorded
