"""The known-answer comparison on arrays whose answer is known (`known_answers.comparison`):
each probe's relative L2 error (a scaled answer, a NaN, equal infinities, a zero row),
labels and text by equality (`str` and `bytes` of one text equal), the tolerance that
follows from the precision, the gate and the engine's own error at build, the verdict
(which output, which probe, how far, against what), and the answer digests replicas are
compared by; and the known-answer file's format round trip, strings included."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.runtime.building.calibration import write_samples
from kubeinfer.runtime.engine_manifest import KnownAnswerTolerance, sha256_file
from kubeinfer.runtime.known_answers import probe_file
from kubeinfer.runtime.known_answers.comparison import (
    BUILD_ERROR_MARGIN,
    PRECISION_FLOOR,
    gate_relative_error,
    judge,
    mismatched,
    relative_errors,
    tolerance_for,
)

EXPECTED = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]], dtype=np.float32)


@pytest.mark.parametrize(
    ("answered", "errors"),
    [
        (EXPECTED, [0.0, 0.0, 0.0]),
        (EXPECTED * 2, [1.0, 1.0, 0.0]),  # twice the answer: the cosine would say 1
        (-EXPECTED, [2.0, 2.0, 0.0]),
        ([[3.0, 4.5], [1.0, 0.0], [0.0, 0.0]], [0.1, 0.0, 0.0]),
        # a zero row is measured against a thousandth of the set's mean norm (2.0)
        ([[3.0, 4.0], [1.0, 0.0], [0.002, 0.0]], [0.0, 0.0, 1.0]),
        ([[3.0, np.nan], [1.0, 0.0], [0.0, 0.0]], [math.inf, 0.0, 0.0]),
        ([[3.0, 4.0], [np.inf, 0.0], [0.0, 0.0]], [0.0, math.inf, 0.0]),
    ],
)
def test_each_probe_is_judged_by_its_relative_l2_error(answered: object, errors: list) -> None:  # type: ignore[type-arg]
    got = relative_errors(EXPECTED, np.asarray(answered, dtype=np.float32))
    np.testing.assert_allclose(got, errors, rtol=1e-6)


def test_equal_infinities_and_nans_are_no_error_and_all_zero_sets_are_absolute() -> None:
    same = np.array([[np.inf, np.nan, 1.0]])
    assert relative_errors(same, same.copy()).tolist() == [0.0]
    zeros = np.zeros((2, 3), dtype=np.float32)
    answered = zeros + np.array([0.0, 0.3, 0.4], dtype=np.float32)
    np.testing.assert_allclose(relative_errors(zeros, answered), [0.5, 0.5], rtol=1e-6)


def test_labels_and_text_are_compared_by_equality_row_by_row() -> None:
    labels = np.array([[3, 1], [4, 4], [9, 2]])
    assert mismatched(labels, np.array([[3, 1], [4, 5], [2, 9]])).tolist() == [False, True, True]
    text = np.array([["sport"], ["news"]], dtype=object)
    answered = np.array([[b"sport"], ["weather"]], dtype=object)  # ONNX Runtime gives str
    assert mismatched(text, answered).tolist() == [False, True]


def test_fp32_tolerance_is_its_floor_and_reduced_precisions_keep_a_margin_over_the_build() -> None:
    reference = np.ones((4, 10), dtype=np.float32)
    fp32 = tolerance_for("logits", "fp32", reference, reference.copy(), gated=True)
    assert fp32.comparison == "relativeError" and fp32.build_error == 0.0
    assert fp32.tolerance == PRECISION_FLOOR["fp32"]
    built = reference * 1.04  # 4 % off on every probe
    int8 = tolerance_for("logits", "int8", reference, built, gated=True)
    assert int8.build_error == pytest.approx(0.04, rel=1e-5)
    assert int8.tolerance == pytest.approx(BUILD_ERROR_MARGIN * 0.04, rel=1e-5)
    small = tolerance_for("logits", "int8", reference, reference * 1.001, gated=True)
    assert small.tolerance == PRECISION_FLOOR["int8"]


def test_a_min_cosine_gate_allows_what_it_let_through_on_the_outputs_it_judged() -> None:
    reference = np.ones((4, 10), dtype=np.float32)
    built = reference * 1.001
    gated = tolerance_for("logits", "int8", reference, built, gated=True, min_cosine=0.98)
    assert gated.tolerance == pytest.approx(gate_relative_error(0.98)) == pytest.approx(0.2)
    other = tolerance_for("hidden", "int8", reference, built, gated=False, min_cosine=0.98)
    assert other.tolerance == PRECISION_FLOOR["int8"]


def test_label_tolerance_is_what_differed_at_build_plus_a_share_for_reduced_precisions() -> None:
    labels = np.arange(16).reshape(16, 1)
    built = labels.copy()
    built[3] = 99
    fp32 = tolerance_for("label", "fp32", labels, built, gated=False)
    assert (fp32.comparison, fp32.build_error, fp32.tolerance) == ("equal", 1.0, 1.0)
    int8 = tolerance_for("label", "int8", labels, built, gated=False)
    assert int8.tolerance == 2.0  # 5 % of 16 probes rounds up to one more
    drop = tolerance_for("label", "int8", labels, built, gated=True, max_top1_drop=0.25)
    assert drop.tolerance == 5.0


def test_an_engine_answering_nan_at_build_gets_no_tolerance() -> None:
    reference = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="NaN or infinity"):
        tolerance_for("logits", "fp32", reference, reference * np.nan, gated=True)


TOLERANCES = [
    KnownAnswerTolerance(
        name="logits", comparison="relativeError", tolerance=0.1, build_error=0.0, gated=True
    ),
    KnownAnswerTolerance(name="label", comparison="equal", tolerance=0, build_error=0, gated=False),
]
PROBES = {
    "logits": np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=np.float32),
    "label": np.array([0, 1, 1]),
}


def test_the_verdict_names_the_output_the_probe_and_the_error_against_its_tolerance() -> None:
    good = judge(TOLERANCES, PROBES, {k: v.copy() for k, v in PROBES.items()}, "sha256:x")
    assert good.passed and good.result == "passed" and good.probes == 3
    assert "3 probes answered within tolerance" in good.reason()
    wrong = {"logits": PROBES["logits"] * [[1.0], [1.5], [1.0]], "label": np.array([0, 1, 0])}
    bad = judge(TOLERANCES, PROBES, wrong, "sha256:x")
    assert not bad.passed and bad.result == "failed"
    logits, label = bad.outputs
    assert (logits.probe, logits.error, logits.passed) == (1, pytest.approx(0.5), False)
    assert logits.error_ratio == pytest.approx(5.0)
    assert (label.probe, label.error, label.error_ratio) == (2, 1.0, math.inf)
    reason = bad.reason()
    assert "output 'logits': probe 1 answered 0.5 from its expected answer" in reason
    assert "over its tolerance 0.1" in reason
    assert "output 'label': 1 probes answered otherwise than expected (first: probe 2)" in reason
    assert bad.to_wire()["outputs"][1]["error"] == 1.0
    nan = judge(TOLERANCES, PROBES, {**wrong, "logits": wrong["logits"] * np.nan})
    assert nan.to_wire()["outputs"][0]["error"] == "inf"  # JSON has no infinity


def test_an_answer_of_another_shape_or_missing_fails_the_verdict() -> None:
    short = judge(TOLERANCES, PROBES, {"logits": PROBES["logits"][:2], "label": PROBES["label"]})
    assert not short.passed and "shape [2, 2], expected [3, 2]" in short.reason()
    missing = judge(TOLERANCES, PROBES, {"logits": PROBES["logits"]})
    assert not missing.passed and "'label': no answer" in missing.reason()


def test_answer_digests_tell_bitwise_equal_answers_from_others() -> None:
    same = judge(TOLERANCES, PROBES, {k: v.copy() for k, v in PROBES.items()})
    again = judge(TOLERANCES, PROBES, {k: v.copy() for k, v in PROBES.items()})
    assert same.answer_digests == again.answer_digests and len(same.answer_digests) == 3
    nudged = {**PROBES, "logits": np.nextafter(PROBES["logits"], np.float32(2))}
    other = judge(TOLERANCES, PROBES, nudged)
    assert other.passed  # within tolerance, yet not the same bits
    assert all(a != b for a, b in zip(other.answer_digests, same.answer_digests, strict=True))


def test_the_known_answer_file_round_trips_strings_losslessly(tmp_path: Path) -> None:
    texts = np.array([["a\x00"], [""], ["naïve"]], dtype=object)  # NUL, empty, UTF-8
    probes = probe_file.Probes(
        {"text": texts, "ids": np.arange(6).reshape(3, 2)},
        {"label": np.array([b"x", b"", b"yz"], dtype=object), "score": np.ones((3, 1))},
    )
    path = write_samples(tmp_path / probe_file.FILE_NAME, probe_file.encode(probes))
    read = probe_file.read(path, sha256_file(path))
    assert read.count == 3
    assert read.inputs["text"].tolist() == [[b"a\x00"], [b""], ["naïve".encode()]]
    assert read.expected["label"].tolist() == [b"x", b"", b"yz"]
    np.testing.assert_array_equal(read.inputs["ids"], np.arange(6).reshape(3, 2))
    with pytest.raises(probe_file.ProbeFileError, match="corrupt or was modified"):
        probe_file.read(path, "0" * 64)
