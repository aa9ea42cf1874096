"""The accuracy report's arithmetic (pure, through `kubeinfer.runtime.output_statistics`):
max/mean absolute difference, per-sample cosine similarity, top-1 agreement wherever the
last axis has 2 or more classes (rows = every leading position, so a rank-3 output counts
per token), a NaN the reference did not produce as an error, and the gates
`--max-top1-drop` / `--min-cosine`, on arrays whose answers are known by construction."""

from __future__ import annotations

import numpy as np
import pytest
from kubeinfer.runtime.building.accuracy import compare_output, compare_outputs, gate_violations


def test_identical_outputs_report_no_difference_and_full_agreement() -> None:
    reference = np.random.default_rng(1).standard_normal((8, 5)).astype(np.float32)
    result = compare_output("logits", reference, reference.copy())
    assert result.max_abs_diff == 0 and result.mean_abs_diff == 0
    assert result.cosine_similarity == pytest.approx(1.0)
    assert result.top1_agreement == 1.0


def test_differences_are_measured_over_every_element() -> None:
    reference = np.zeros((2, 3), np.float32) + 1
    candidate = reference.copy()
    candidate[0, 0] += 0.5
    candidate[1, 2] -= 0.25
    result = compare_output("y", reference, candidate)
    assert result.max_abs_diff == pytest.approx(0.5)
    assert result.mean_abs_diff == pytest.approx(0.75 / 6)


def test_cosine_ignores_scale_and_sees_direction() -> None:
    reference = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
    candidate = np.array([[3.0, 0.0], [1.0, -1.0]], np.float32)  # same; orthogonal
    result = compare_output("y", reference, candidate)
    assert result.min_cosine_similarity == pytest.approx(0.0, abs=1e-9)
    assert result.cosine_similarity == pytest.approx(0.5)


def test_a_changed_argmax_lowers_top1_agreement() -> None:
    reference = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.1, 0.9]], np.float32)
    candidate = reference.copy()
    candidate[2] = [0.4, 0.6]
    assert compare_output("p", reference, candidate).top1_agreement == pytest.approx(0.75)


def test_top1_is_left_out_without_a_last_axis_of_two_or_more_classes() -> None:
    regression = np.ones((4, 1), np.float32)
    flat = np.arange(5, dtype=np.float32)  # one value per sample: no class axis
    assert compare_output("r", regression, regression).top1_agreement is None
    assert compare_output("f", flat, flat + 1).top1_agreement is None


def test_top1_of_a_rank3_output_counts_every_leading_position() -> None:
    reference = np.zeros((2, 3, 4), np.float32)  # [samples, tokens, vocab]
    reference[..., 1] = 1.0
    candidate = reference.copy()
    candidate[1, 2] = [0, 0, 0, 1]  # one token of six changes its argmax
    result = compare_output("tokens", reference, candidate)
    assert result.top1_agreement == pytest.approx(5 / 6)


def test_a_nan_the_reference_did_not_produce_is_an_error() -> None:
    reference = np.ones((2, 3), np.float32)
    candidate = reference.copy()
    candidate[1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        compare_output("y", reference, candidate)
    both = reference.copy()
    both[0, 0] = np.nan  # the same NaN on both sides is no difference
    assert compare_output("y", both, both.copy()).max_abs_diff == 0


def test_all_zero_samples_compare_as_equal_and_zero_against_nonzero_as_unrelated() -> None:
    reference = np.zeros((2, 3), np.float32)
    candidate = np.array([[0, 0, 0], [1, 0, 0]], np.float32)
    result = compare_output("z", reference, candidate)
    assert result.cosine_similarity == pytest.approx(0.5)


def test_mismatched_shapes_and_missing_outputs_are_errors() -> None:
    with pytest.raises(ValueError, match="shape"):
        compare_output("y", np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="does not produce outputs"):
        compare_outputs({"a": np.ones((1, 2))}, {"b": np.ones((1, 2))}, "given")


def test_gates_pass_within_limits_and_name_each_violation() -> None:
    reference = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.2], [0.3, 1.0]], np.float32)
    candidate = reference.copy()
    candidate[3] = [1.0, 0.3]  # argmax flips on one sample in four
    report = compare_outputs({"logits": reference}, {"logits": candidate}, "held-out")
    assert gate_violations(report, max_top1_drop=0.25, min_cosine=0.5) == []
    violations = gate_violations(report, max_top1_drop=0.1, min_cosine=0.99)
    assert len(violations) == 2
    assert any("top-1 drop 0.2500" in v and "--max-top1-drop 0.1" in v for v in violations)
    assert any("--min-cosine 0.99" in v for v in violations)


def test_a_top1_gate_on_a_model_without_class_outputs_fails_rather_than_passing_silently() -> None:
    values = np.ones((3, 1), np.float32)
    report = compare_outputs({"score": values}, {"score": values}, "given")
    assert "cannot be measured" in gate_violations(report, max_top1_drop=0.5)[0]
