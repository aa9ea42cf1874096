"""Discrete outputs (labels, token ids, strings) compared by equality: the one statistics
module (`output_statistics`), the shadow comparison (`shadow.comparison`), the quality
watch's aggregates and exemplars, the build's accuracy report.

Covers: an integer or BYTES output's every element is a top-1 position agreeing when
equal, with one-hot cosines and no element difference (a label 3 against 9 is one
disagreement, not a difference of 6); class tallies by the trusted side's value (integers
as themselves, strings as their text), mixed with argmax classes of float outputs in one
order; requests compared together get exactly the figures each gets alone (a property);
per-row figures name the label as the exemplar's class; the quality watch reports string
classes, and its `.npz` stores string inputs as text that loads without pickles; the
accuracy report gives a label output a top-1 agreement and per-label counts.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeinfer.contract.runtime_config import MirrorTarget, QualityWatch
from kubeinfer.runtime.building.accuracy import compare_output
from kubeinfer.runtime.output_statistics import compare_arrays, top1_by_reference_class
from kubeinfer.runtime.shadow.aggregates import ShadowMetrics
from kubeinfer.runtime.shadow.comparison import compare_request, compare_requests
from kubeinfer.runtime.shadow.quality import QualityAggregates
from prometheus_client import CollectorRegistry


def strings(*values: str) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode() for v in values]
    return array


def test_labels_are_compared_by_equality_not_by_distance() -> None:
    statistics = compare_arrays(np.array([3, 4, 5]), np.array([3, 9, 5]))
    assert statistics.discrete and statistics.top1.tolist() == [True, False, True]
    assert statistics.max_abs_difference == 0 and statistics.elements == 0
    assert statistics.cosines.tolist() == [1.0, 0.0, 1.0]
    tokens = compare_arrays(np.array([[1, 2, 3, 4]]), np.array([[1, 2, 0, 4]]))
    assert tokens.top1.tolist() == [True, True, False, True]
    assert tokens.cosines.tolist() == [0.75]  # one-hot cosine: the share equal
    assert top1_by_reference_class(strings("cat", "dog", "cat"), strings("cat", "cat", "cat")) == {
        "cat": (2, 2), "dog": (1, 0)
    }  # fmt: skip


def test_a_string_label_and_probabilities_in_one_request() -> None:
    serving = {
        "label": ("BYTES", strings("cat", "dog", "cat")),
        "probabilities": ("FP32", np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], np.float32)),
    }
    candidate = {
        "label": ("BYTES", strings("cat", "cat", "cat")),
        "probabilities": ("FP32", np.array([[0.9, 0.1], [0.6, 0.4], [0.6, 0.4]], np.float32)),
    }
    result = compare_request(serving, candidate, per_row=True)
    assert result.mismatch is None
    assert (result.top1_rows, result.top1_agreements) == (6, 4)
    assert result.elements == 6  # the probabilities' elements only
    assert result.max_abs_difference == pytest.approx(0.4)
    assert result.class_tallies == ((0, 2, 2), (1, 1, 0), ("cat", 2, 2), ("dog", 1, 0))
    assert result.rows is not None
    assert result.rows.disagreements.tolist() == [0, 2, 0]
    assert result.rows.reference_class.tolist() == ["cat", "dog", "cat"]
    other_type = {**candidate, "label": ("INT64", np.array([0, 0, 0]))}
    assert "datatype INT64" in compare_request(serving, other_type).mismatch


LABELS = st.lists(st.sampled_from(["a", "b", "é", ""]), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.tuples(LABELS, st.integers(0, 2**16)), min_size=1, max_size=4),
    trusted=st.sampled_from(["serving", "candidate"]),
)
def test_requests_compared_together_get_what_each_gets_alone(requests, trusted) -> None:
    serving, answers = [], []
    for labels, seed in requests:
        rng = np.random.default_rng(seed)
        other = [label if rng.random() < 0.6 else "b" for label in labels]
        ids = rng.integers(0, 3, size=(len(labels), 2))
        serving.append({"label": ("BYTES", strings(*labels)), "ids": ("INT64", ids)})
        answers.append({"label": ("BYTES", strings(*other)), "ids": ("INT64", ids % 2)})
    stacked = {
        name: (datatype, np.concatenate([a[name][1] for a in answers]))
        for name, (datatype, _) in answers[0].items()
    }
    together = compare_requests(serving, stacked, trusted=trusted, per_row=True)
    for alone_in, answer, result in zip(serving, answers, together, strict=True):
        alone = compare_request(alone_in, answer, trusted=trusted, per_row=True)
        assert result.class_tallies == alone.class_tallies
        assert (result.top1_rows, result.top1_agreements, result.min_cosine) == (
            alone.top1_rows, alone.top1_agreements, alone.min_cosine
        )  # fmt: skip
        assert result.rows.disagreements.tolist() == alone.rows.disagreements.tolist()
        assert result.rows.reference_class.tolist() == alone.rows.reference_class.tolist()


def test_the_quality_watch_reports_string_classes_and_stores_text_inputs() -> None:
    reference = MirrorTarget(url="http://reference:8000", model_name="m", candidate_version="1")
    aggregates = QualityAggregates(
        QualityWatch(reference=reference), "m", "1", ShadowMetrics(CollectorRegistry())
    )
    inputs = {"text": ("BYTES", strings("a cat", "a dog").reshape(2, 1))}
    serving = {"label": ("BYTES", strings("cat", "cat"))}
    truth = {"label": ("BYTES", strings("cat", "dog"))}
    comparison = compare_request(serving, truth, trusted="candidate", per_row=True)
    aggregates.answered = 1
    aggregates.record_comparison(comparison, 0.01, 0.01, inputs=inputs)
    assert aggregates.status()["classes"] == [
        {"referenceClass": "cat", "rows": 1, "agreements": 1, "agreement": 1.0},
        {"referenceClass": "dog", "rows": 1, "agreements": 0, "agreement": 0.0},
    ]
    archive = np.load(io.BytesIO(aggregates.exemplars_npz()), allow_pickle=False)
    assert archive["text"].tolist() == [["a dog"], ["a cat"]]  # the disagreeing row first
    aggregates.close()


def test_the_accuracy_report_gives_a_label_output_its_agreement_by_label() -> None:
    report = compare_output("label", np.array([1, 1, 2, 7]), np.array([1, 2, 2, 7]))
    assert report.top1_agreement == 0.75 and report.top1_rows == 4
    assert report.max_abs_diff == 0 and report.cosine_similarity == 0.75
    assert {k: (v.rows, v.agreements) for k, v in report.top1_by_class.items()} == {
        "1": (2, 1), "2": (1, 1), "7": (1, 1)
    }  # fmt: skip
    words = compare_output("label", strings("cat", "dog"), strings("cat", "dog"))
    assert words.top1_agreement == 1.0 and set(words.top1_by_class) == {"cat", "dog"}
