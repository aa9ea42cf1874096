"""The shadow's pure decisions, on arrays whose answers are known by construction:

- `compare_request` (a candidate's answer against the serving engine's, per request):
  identical, shifted, argmax flipped in some rows, rank-3 outputs (top-1 per token), a
  1-class last axis (no top-1), all-zero rows, several outputs (worst of them), and the
  disagreements in kind that are mismatches, never crashes: another shape or datatype, a
  missing or extra output, NaN where the other side has a number;
- the one statistics module both it and the build's accuracy report use
  (`output_statistics`): the numbers are the same through either door;
- `Sampler`: exactly `trafficPercent` of any hundred consecutive answered requests;
- `histogram_quantile`: Prometheus' interpolation, on buckets worked by hand;
- `Server-Timing`: written and read back, and what is not ours is skipped.
"""

from __future__ import annotations

import numpy as np
import pytest
from kubeinfer.contract.metric_series import SHADOW_LATENCY_BUCKETS, histogram_quantile
from kubeinfer.runtime.building.accuracy import compare_output
from kubeinfer.runtime.output_statistics import compare_arrays
from kubeinfer.runtime.protocol.v2_types import format_server_timing, parse_server_timing
from kubeinfer.runtime.shadow.comparison import compare_request
from kubeinfer.runtime.shadow.sampling import Sampler

RNG = np.random.default_rng(3)
LOGITS = RNG.standard_normal((4, 10)).astype(np.float32)


def fp32(array: np.ndarray) -> dict[str, tuple[str, np.ndarray]]:
    return {"logits": ("FP32", array)}


def test_identical_answers_have_no_difference_and_agree_everywhere() -> None:
    result = compare_request(fp32(LOGITS), fp32(LOGITS.copy()))
    assert result.mismatch is None
    assert result.max_abs_difference == 0 and result.sum_abs_difference == 0
    assert result.min_cosine == 1.0  # exactly: identical rows
    assert (result.top1_rows, result.top1_agreements) == (4, 4)
    assert result.elements == 40


def test_a_shift_is_measured_as_its_size_and_keeps_the_argmax() -> None:
    result = compare_request(fp32(LOGITS), fp32(LOGITS + 0.25))
    assert result.max_abs_difference == pytest.approx(0.25, abs=1e-6)
    assert result.sum_abs_difference / result.elements == pytest.approx(0.25, abs=1e-6)
    assert result.min_cosine < 1.0
    assert result.top1_agreements == result.top1_rows == 4


def test_argmax_flipped_in_some_rows_counts_those_rows_only() -> None:
    candidate = LOGITS.copy()
    for row in (1, 3):  # move each row's maximum to another class
        winner = int(candidate[row].argmax())
        candidate[row, (winner + 1) % 10] = candidate[row, winner] + 1.0
    result = compare_request(fp32(LOGITS), fp32(candidate))
    assert (result.top1_rows, result.top1_agreements) == (4, 2)


def test_a_rank3_output_counts_top1_per_leading_position() -> None:
    tokens = np.zeros((2, 3, 5), np.float32)  # [batch, tokens, vocab]
    tokens[..., 0] = 1.0
    candidate = tokens.copy()
    candidate[0, 1, 4] = 2.0
    result = compare_request(fp32(tokens), fp32(candidate))
    assert (result.top1_rows, result.top1_agreements) == (6, 5)
    assert result.max_abs_difference == pytest.approx(2.0)


def test_a_single_class_last_axis_has_no_top1() -> None:
    scores = np.arange(4, dtype=np.float32).reshape(4, 1)
    result = compare_request(fp32(scores), fp32(scores * 2))
    assert result.mismatch is None and result.top1_rows == 0
    assert result.max_abs_difference == pytest.approx(3.0)


def test_all_zero_rows_are_identical_and_zero_against_non_zero_shares_nothing() -> None:
    zeros = np.zeros((2, 4), np.float32)
    assert compare_request(fp32(zeros), fp32(zeros.copy())).min_cosine == 1.0
    candidate = zeros.copy()
    candidate[1, 2] = 1.0
    assert compare_request(fp32(zeros), fp32(candidate)).min_cosine == 0.0


def test_several_outputs_report_the_worst_of_them() -> None:
    serving = {"a": ("FP32", LOGITS), "b": ("FP32", np.ones((4, 2), np.float32))}
    candidate = {
        "a": ("FP32", LOGITS + 0.1),
        "b": ("FP32", np.array([[1, 1], [1, -1]] * 2, np.float32)),
    }
    result = compare_request(serving, candidate)
    assert result.max_abs_difference == pytest.approx(2.0)
    assert result.min_cosine == pytest.approx(0.0, abs=1e-12)  # [1,1] against [1,-1]
    assert result.top1_rows == 8 and result.elements == 48


@pytest.mark.parametrize(
    ("candidate", "reason"),
    [
        ({"logits": ("FP32", LOGITS[:, :5])}, "shape [4, 5]"),
        ({"logits": ("FP16", LOGITS.astype(np.float16))}, "datatype FP16"),
        ({}, "'logits' is missing"),
        ({"logits": ("FP32", LOGITS), "extra": ("FP32", LOGITS)}, "'extra' is not an output"),
        ({"logits": ("FP32", np.where(LOGITS > 1, np.nan, LOGITS))}, "NaN"),
    ],
    ids=["shape", "datatype", "missing", "extra", "nan"],
)
def test_disagreements_in_kind_are_mismatches_not_crashes(candidate, reason) -> None:
    result = compare_request(fp32(LOGITS), candidate)
    assert result.mismatch is not None and reason in result.mismatch
    assert result.top1_rows == 0 and result.elements == 0


def test_the_same_nan_on_both_sides_is_no_difference() -> None:
    with_nan = LOGITS.copy()
    with_nan[0, 0] = np.nan
    result = compare_request(fp32(with_nan), fp32(with_nan.copy()))
    assert result.mismatch is None and result.max_abs_difference == 0
    assert result.min_cosine == 1.0


def test_the_accuracy_report_and_the_shadow_share_one_statistics_module() -> None:
    candidate = LOGITS + RNG.standard_normal(LOGITS.shape).astype(np.float32) * 0.3
    statistics = compare_arrays(LOGITS, candidate)
    report = compare_output("logits", LOGITS, candidate)
    shadow = compare_request(fp32(LOGITS), fp32(candidate))
    assert report.max_abs_diff == shadow.max_abs_difference == statistics.max_abs_difference
    assert report.min_cosine_similarity == shadow.min_cosine == statistics.cosines.min()
    assert report.top1_agreement == shadow.top1_agreements / shadow.top1_rows
    assert report.mean_abs_diff == pytest.approx(shadow.sum_abs_difference / shadow.elements)


@pytest.mark.parametrize("percent", [1, 7, 10, 33, 50, 99, 100])
def test_the_sampler_takes_exactly_the_share_of_every_hundred(percent: int) -> None:
    sampler = Sampler(percent)
    taken = [sampler.take() for _ in range(1000)]
    assert taken[0]  # the first request is compared at once
    for start in range(0, 901, 37):  # any window of 100 consecutive requests
        assert sum(taken[start : start + 100]) == percent


def test_the_sampler_refuses_a_share_outside_0_to_100() -> None:
    with pytest.raises(ValueError):
        Sampler(101)


INF = float("inf")


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # rank 99 of 100 lies in (2, 4], 49 of its 50: 2 + 2 * 49/50
        (0.99, [(1, 0), (2, 50), (4, 100), (INF, 100)], 3.96),
        # the lowest bucket starts at 0: rank 5 of its 10
        (0.5, [(1, 10), (2, 10), (INF, 10)], 0.5),
        # a rank in the +Inf bucket answers the highest finite bound
        (0.99, [(1, 10), (2, 10), (INF, 20)], 2.0),
        # order does not matter, and a count lower than the bucket below is raised to it:
        # (1, 4), (2, 4), (+Inf, 4), so rank 2 lies in the first bucket
        (0.5, [(INF, 4), (2, 3), (1, 4)], 0.5),
        (0.5, [(1, 0), (INF, 0)], None),  # no observations
        (0.5, [(1, 3), (2, 4)], None),  # no +Inf bucket
        (0.5, [(INF, 4)], None),  # a single bucket
    ],
)
def test_histogram_quantile_interpolates_as_prometheus_does(q, buckets, expected) -> None:
    got = histogram_quantile(q, buckets)
    assert got == (None if expected is None else pytest.approx(expected))


def test_the_shadow_latency_buckets_are_12_percent_apart_from_a_quarter_ms_to_16_s() -> None:
    bounds = np.asarray(SHADOW_LATENCY_BUCKETS)
    assert bounds[0] == 2.0**-12 and bounds[-1] == 16.0
    np.testing.assert_allclose(bounds[1:] / bounds[:-1], 2 ** (1 / 6))


def test_server_timing_is_written_in_ms_and_read_back_in_seconds() -> None:
    assert format_server_timing(0.0123456) == "infer;dur=12.346"
    assert parse_server_timing(format_server_timing(0.0123456)) == pytest.approx(0.012346)
    assert parse_server_timing('cache;desc="hit", infer;desc="x";dur=2.5') == 0.0025
    for unreadable in (None, "", "db;dur=3", "infer", "infer;dur=abc", "infer;dur=-1"):
        assert parse_server_timing(unreadable) is None
