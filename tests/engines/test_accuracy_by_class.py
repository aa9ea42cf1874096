"""Top-1 agreement per reference class (pure, on arrays whose answer is known by
construction): rows grouped by the fp32 reference's argmax, whatever the candidate says;
every leading position a row; the classes' rows adding up to `top1Rows`; manifests
written before the fields still load; and the termination message's bounded `accuracy`
object: the classes with the most rows first, within its byte budget, even with 1000
classes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from kubeinfer.runtime.building.accuracy import (
    TERMINATION_ACCURACY_BUDGET_BYTES,
    compact_json,
    compare_output,
    compare_outputs,
    measures_quantisation,
    termination_accuracy,
)
from kubeinfer.runtime.engine_manifest import (
    AccuracyReport,
    ClassAgreement,
    OutputAccuracy,
)
from kubeinfer.runtime.output_statistics import top1_by_reference_class
from pydantic import ValidationError


def _one_hot(classes: list[int], width: int) -> np.ndarray:
    """Rows whose argmax is each given class (a clear winner, so no tie decides)."""
    rows = np.full((len(classes), width), 0.1, np.float32)
    rows[np.arange(len(classes)), classes] = 0.9
    return rows


CASES = [
    pytest.param(
        [0, 0, 1, 2, 2, 2],
        [0, 1, 1, 2, 0, 2],
        {0: (2, 1), 1: (1, 1), 2: (3, 2)},
        id="each class counts its own rows and agreements",
    ),
    pytest.param(
        [0, 0, 0, 0],
        [3, 3, 0, 0],
        {0: (4, 2)},
        id="a row goes under the reference's class, not the candidate's",
    ),
    pytest.param(
        [4, 1, 4, 1],
        [4, 1, 4, 1],
        {1: (2, 2), 4: (2, 2)},
        id="only classes the reference chose appear",
    ),
    pytest.param(
        [2, 2, 2],
        [0, 1, 3],
        {2: (3, 0)},
        id="a class the candidate always missed has no agreements",
    ),
]


@pytest.mark.parametrize(("reference", "candidate", "expected"), CASES)
def test_rows_and_agreements_per_reference_class(
    reference: list[int], candidate: list[int], expected: dict[int, tuple[int, int]]
) -> None:
    assert top1_by_reference_class(_one_hot(reference, 5), _one_hot(candidate, 5)) == expected


def test_every_token_of_a_rank3_output_is_a_row() -> None:
    reference = np.zeros((2, 3, 4), np.float32)  # [samples, tokens, vocab]
    reference[0, :, 1] = 1.0  # sample 0: every token class 1
    reference[1, :, 3] = 1.0  # sample 1: every token class 3
    candidate = reference.copy()
    candidate[1, 2] = [0, 0, 1, 0]  # one token of sample 1 changes its argmax
    assert top1_by_reference_class(reference, candidate) == {1: (3, 3), 3: (3, 2)}


def test_shapes_without_classes_have_no_per_class_counts() -> None:
    assert top1_by_reference_class(np.ones((4, 1)), np.ones((4, 1))) is None
    assert top1_by_reference_class(np.arange(5.0), np.arange(5.0)) is None
    result = compare_output("score", np.ones((4, 1), np.float32), np.ones((4, 1), np.float32))
    assert result.top1_rows is None and result.top1_by_class is None


def test_the_report_records_rows_and_classes_consistent_with_the_overall_agreement() -> None:
    reference, candidate = _one_hot([0, 0, 1, 2, 2, 2], 3), _one_hot([0, 1, 1, 2, 0, 2], 3)
    result = compare_output("logits", reference, candidate)
    assert result.top1_rows == 6
    assert result.top1_by_class == {
        "0": ClassAgreement(rows=2, agreements=1),
        "1": ClassAgreement(rows=1, agreements=1),
        "2": ClassAgreement(rows=3, agreements=2),
    }
    assert result.top1_agreement == pytest.approx(4 / 6)
    assert result.to_wire()["top1ByClass"]["2"] == {"rows": 3, "agreements": 2}


def test_a_manifest_written_before_the_per_class_fields_still_loads() -> None:
    old = {
        "name": "logits", "maxAbsDiff": 0.1, "meanAbsDiff": 0.01, "cosineSimilarity": 0.99,
        "minCosineSimilarity": 0.9, "top1Agreement": 0.95,
    }  # fmt: skip
    output = OutputAccuracy.model_validate(old)
    assert output.top1_rows is None and output.top1_by_class is None
    report = AccuracyReport.model_validate(
        {"validationSource": "held-out", "samples": 20, "outputs": [old]}
    )
    assert termination_accuracy(report) is None  # no counts to give: the operator's floors


def test_a_class_with_more_agreements_than_rows_is_refused() -> None:
    with pytest.raises(ValidationError, match="agreements cannot exceed rows"):
        ClassAgreement(rows=2, agreements=3)


def _report(by_class: dict[str, tuple[int, int]], name: str = "logits") -> AccuracyReport:
    rows = sum(r for r, _ in by_class.values())
    agreements = sum(a for _, a in by_class.values())
    return AccuracyReport(
        validation_source="held-out",
        samples=rows,
        outputs=[
            OutputAccuracy(
                name="embedding", max_abs_diff=0.1, mean_abs_diff=0.01,
                cosine_similarity=0.99, min_cosine_similarity=0.9,
            ),
            OutputAccuracy(
                name=name, max_abs_diff=0.1, mean_abs_diff=0.01, cosine_similarity=0.99,
                min_cosine_similarity=0.9, top1_agreement=agreements / rows, top1_rows=rows,
                top1_by_class={
                    k: ClassAgreement(rows=r, agreements=a) for k, (r, a) in by_class.items()
                },
            ),
        ],
    )  # fmt: skip


def test_the_termination_accuracy_is_the_first_output_with_classes_overall_and_per_class() -> None:
    accuracy = termination_accuracy(_report({"0": (2, 1), "1": (1, 1), "2": (3, 2)}))
    assert accuracy == {
        "output": "logits",
        "rows": 6,
        "agreements": 4,
        "byClass": {"0": [2, 1], "1": [1, 1], "2": [3, 2]},
    }


def test_there_is_no_termination_accuracy_without_a_report_or_an_output_with_classes() -> None:
    values = np.ones((3, 1), np.float32)
    assert termination_accuracy(None) is None
    assert termination_accuracy(compare_outputs({"s": values}, {"s": values}, "given")) is None


def test_a_tight_budget_keeps_the_classes_with_the_most_rows() -> None:
    report = _report({"7": (5, 5), "10": (40, 39), "2": (40, 38), "3": (9, 1)})
    whole = termination_accuracy(report)
    assert whole is not None and list(whole["byClass"]) == ["2", "10", "3", "7"]  # ties by index
    two = len(compact_json({**whole, "byClass": {"2": [40, 38], "10": [40, 39]}}))
    third = len(',"3":[9,1]')
    for budget in (two, two + third - 1):  # a byte short of the third class leaves it out
        accuracy = termination_accuracy(report, budget_bytes=budget)
        assert accuracy is not None and accuracy["byClass"] == {"2": [40, 38], "10": [40, 39]}
        assert len(compact_json(accuracy)) <= budget
    assert accuracy["rows"] == 94 and accuracy["agreements"] == 83  # overall: every class
    accuracy = termination_accuracy(report, budget_bytes=two + third)
    assert accuracy is not None and list(accuracy["byClass"]) == ["2", "10", "3"]
    assert len(compact_json(accuracy)) == two + third
    nothing = len(compact_json({**whole, "byClass": {}}))
    assert termination_accuracy(report, budget_bytes=nothing) == {**whole, "byClass": {}}
    assert termination_accuracy(report, budget_bytes=nothing - 1) is None


def test_a_thousand_classes_stay_within_the_budget_most_rows_first() -> None:
    rng = np.random.default_rng(3)
    rows = rng.integers(1, 500, size=1000)
    by_class = {str(i): (int(r), int(rng.integers(0, r + 1))) for i, r in enumerate(rows)}
    accuracy = termination_accuracy(_report(by_class))
    assert accuracy is not None
    size = len(compact_json(accuracy))
    assert TERMINATION_ACCURACY_BUDGET_BYTES - 20 < size <= TERMINATION_ACCURACY_BUDGET_BYTES
    kept = accuracy["byClass"]
    assert 100 < len(kept) < 1000
    smallest_kept = min(r for r, _ in kept.values())
    assert all(by_class[k][0] <= smallest_kept for k in by_class if k not in kept)
    assert all(kept[k] == list(by_class[k]) for k in kept)
    assert accuracy["rows"] == int(rows.sum())
    assert accuracy["agreements"] == sum(a for _, a in by_class.values())
    assert json.loads(compact_json(accuracy)) == accuracy


@pytest.mark.parametrize(
    ("precision", "source", "expected"),
    [
        ("int8", "held-out", True),
        ("fp16", "given", True),
        ("fp32", "given", False),
        ("int8", "synthetic", False),
    ],
)
def test_only_a_reduced_precision_measured_on_real_samples_is_a_baseline(
    precision: str, source: str, expected: bool
) -> None:
    report = _report({"0": (3, 2)}).model_copy(update={"validation_source": source})
    assert measures_quantisation(precision, report) is expected
    assert measures_quantisation(precision, None) is False
