"""The quality watch's pure parts and its aggregates, in-process:

- KL divergence: logits through a softmax, probabilities as they are (both sides must look
  like probabilities), known values, never negative, floored where the other side has no
  mass; `compare_request` with the trusted side choosing the classes, per class tallies
  adding up to the top-1 rows, and per batch row figures;
- slices: hostile header values become short printable labels; the first maxSlices
  distinct values keep their name, later ones and none are `other`;
- exemplars: the worst rows are kept (disagreement, then KL, then difference), bounded in
  count and bytes, a tie keeps the older, the window evicts with the injected clock, and
  the `.npz` stacks rows per input (or names them one by one) with JSON metadata;
- `QualityAggregates` through a real mirror-free path: role="quality" on every series,
  slices and classes in /metrics and in the status, effective sample rate; the
  controller runs a shadow and a watch at once, each with its own queue.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from kubeinfer.contract.metric_series import OTHER_SLICE
from kubeinfer.contract.runtime_config import (
    MirrorFile,
    MirrorPolicy,
    MirrorTarget,
    QualityWatch,
    RuntimeConfig,
)
from kubeinfer.runtime.shadow.aggregates import ShadowMetrics
from kubeinfer.runtime.shadow.comparison import compare_request
from kubeinfer.runtime.shadow.controller import ShadowController
from kubeinfer.runtime.shadow.divergence import kl_divergence_rows, looks_like_probabilities
from kubeinfer.runtime.shadow.exemplars import (
    METADATA_KEY,
    Exemplar,
    ExemplarBuffer,
    encode_exemplars,
    rank_of,
)
from kubeinfer.runtime.shadow.quality import QualityAggregates
from kubeinfer.runtime.shadow.slices import MAX_SLICE_LABEL_CHARS, SliceNames, slice_label
from kubeinfer.runtime.shadow.target import parse_mirror_content
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

# --------------------------------------------------------------------------- KL divergence


def test_kl_of_logits_is_that_of_their_softmax() -> None:
    trusted = np.array([[2.0, 0.0, -1.0]])
    other = np.array([[0.0, 1.0, 0.5]])
    p = np.exp(trusted) / np.exp(trusted).sum()
    q = np.exp(other) / np.exp(other).sum()
    expected = float((p * np.log(p / q)).sum())
    assert kl_divergence_rows(trusted, other) == pytest.approx([expected])
    assert kl_divergence_rows(trusted + 100, other - 7) == pytest.approx([expected])  # shift


def test_kl_of_probabilities_uses_them_as_they_are() -> None:
    p = np.array([[0.5, 0.5], [0.9, 0.1]])
    q = np.array([[0.25, 0.75], [0.9, 0.1]])
    expected = 0.5 * np.log(0.5 / 0.25) + 0.5 * np.log(0.5 / 0.75)
    assert kl_divergence_rows(p, q) == pytest.approx([expected, 0.0], abs=1e-12)
    # were they taken for logits, the softmax would flatten them and give much less
    assert kl_divergence_rows(p, q)[0] > 2 * kl_divergence_rows(p * 1.01, q * 1.01)[0]


def test_one_side_not_probabilities_reads_both_as_logits() -> None:
    probabilities = np.array([[0.5, 0.5]])
    assert looks_like_probabilities(probabilities)
    assert not looks_like_probabilities(np.array([[0.5, 0.6]]))  # sums to 1.1
    assert not looks_like_probabilities(np.array([[1.2, -0.2]]))  # negative
    assert looks_like_probabilities(np.array([[0.5, 0.5004]]))  # within 1e-3
    mixed = kl_divergence_rows(probabilities, np.array([[0.1, 1.0]]))
    softmax_q = np.exp([0.1, 1.0]) / np.exp([0.1, 1.0]).sum()
    softmax_p = np.exp([0.5, 0.5]) / np.exp([0.5, 0.5]).sum()
    assert mixed == pytest.approx([float((softmax_p * np.log(softmax_p / softmax_q)).sum())])


def test_kl_is_never_negative_and_finite_where_the_other_side_has_no_mass() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 7))
    assert (kl_divergence_rows(logits, logits.copy()) == 0).all()
    assert (kl_divergence_rows(logits, rng.standard_normal((50, 7))) >= 0).all()
    no_mass = kl_divergence_rows(np.array([[0.5, 0.5]]), np.array([[1.0, 0.0]]))
    assert np.isfinite(no_mass).all() and no_mass[0] > 10  # floored, still large


# --------------------------------------------------------------------------- comparison


def fp32(array: np.ndarray) -> dict:
    return {"logits": ("FP32", array.astype(np.float32))}


def test_the_trusted_side_chooses_the_classes_rows_are_tallied_by() -> None:
    serving = np.array([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0], [0, 0, 3.0]])
    reference = np.array([[3.0, 0, 0], [3.0, 0, 0], [0, 0, 3.0], [0, 3.0, 0]])
    quality = compare_request(fp32(serving), fp32(reference), trusted="candidate")
    shadow = compare_request(fp32(serving), fp32(reference))
    assert quality.class_tallies == ((0, 2, 1), (1, 1, 0), (2, 1, 1))
    assert shadow.class_tallies == ((0, 1, 1), (1, 1, 0), (2, 2, 1))
    assert sum(rows for _, rows, _ in quality.class_tallies) == quality.top1_rows == 4
    assert quality.top1_agreements == 2
    assert quality.kl_divergence == pytest.approx(
        float(kl_divergence_rows(reference, serving).mean())
    )
    assert shadow.kl_divergence == pytest.approx(
        float(kl_divergence_rows(serving, reference).mean())
    )
    assert quality.rows is None  # not asked for


def test_per_row_figures_point_at_the_rows_that_disagreed() -> None:
    serving = np.array([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0]])
    reference = serving.copy()
    reference[1] = [0, 0, 5.0]
    result = compare_request(fp32(serving), fp32(reference), trusted="candidate", per_row=True)
    rows = result.rows
    assert rows is not None
    assert rows.disagreements.tolist() == [0, 1, 0]
    assert rows.reference_class is not None and rows.reference_class.tolist() == [0, 2, 2]
    assert rows.max_abs_difference.tolist() == pytest.approx([0.0, 5.0, 0.0])
    assert rows.kl_divergence is not None and rows.kl_divergence[1] > 1
    assert rows.kl_divergence[0] == rows.kl_divergence[2] == 0


def test_outputs_without_classes_have_no_class_figures() -> None:
    scores = np.array([[0.1], [0.7]])
    result = compare_request(fp32(scores), fp32(scores * 2), trusted="candidate", per_row=True)
    assert result.class_tallies == () and result.kl_divergence is None
    assert result.rows is not None and result.rows.reference_class is None
    assert result.rows.max_abs_difference.tolist() == pytest.approx([0.1, 0.7])


# --------------------------------------------------------------------------- slices


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("tenant-a", "tenant-a"),
        (" spaced ", "spaced"),
        ("caf\xe9", "caf_"),
        ("a\nb\x00c", "a_b_c"),
        ('x"} evil{', 'x"} evil{'),  # printable: the exposition escapes quotes itself
        ("x" * 1000, "x" * MAX_SLICE_LABEL_CHARS),
    ],
)
def test_a_header_value_becomes_a_short_printable_label(raw, label) -> None:
    assert slice_label(raw) == label


def test_the_first_max_slices_values_keep_their_name() -> None:
    names = SliceNames(2)
    assert [names.name_of(v) for v in ("a", None, "b", "c", "a", "other", " ")] == [
        "a", OTHER_SLICE, "b", OTHER_SLICE, "a", OTHER_SLICE, OTHER_SLICE,
    ]  # fmt: skip
    flood = {names.name_of(f"v{i}") for i in range(10_000)}
    assert flood == {OTHER_SLICE}


# --------------------------------------------------------------------------- exemplars


def exemplar(value: float, rank: tuple[int, float, float], at: float, nbytes: int = 64):
    return Exemplar(
        inputs={"x": ("FP32", np.full(16, value, np.float32))}, disagreements=rank[0],
        kl_divergence=rank[1], max_abs_difference=rank[2], reference_class=1, slice="a",
        recorded_at_seconds=at, recorded_unix_seconds=1e9 + at, nbytes=nbytes,
    )  # fmt: skip


def offer(buffer: ExemplarBuffer, value: float, rank, at: float, nbytes: int = 64) -> bool:
    return buffer.offer(rank_of(*rank), nbytes, at, lambda: exemplar(value, rank, at, nbytes))


def test_the_worst_rows_are_kept_in_rank_order() -> None:
    buffer = ExemplarBuffer(3, 10_000, 60)
    ranks = {1: (0, 0.5, 1.0), 2: (1, 0.1, 0.1), 3: (0, 0.9, 0.0), 4: (1, 0.2, 0.0),
             5: (0, 0.1, 9.0), 6: (0, 0.9, 0.5)}  # fmt: skip
    kept = [offer(buffer, value, rank, at=value) for value, rank in ranks.items()]
    assert kept == [True, True, True, True, False, True]
    values = [float(e.inputs["x"][1][0]) for e in buffer.current(now=10)]
    assert values == [4, 2, 6]  # disagreement first, then KL, then difference


def test_a_tie_keeps_the_older_and_a_row_not_kept_is_never_built() -> None:
    buffer = ExemplarBuffer(1, 10_000, 60)
    assert offer(buffer, 1, (1, 0.5, 0.5), at=0)
    built = []
    assert not buffer.offer(rank_of(1, 0.5, 0.5), 64, 1, lambda: built.append(1))  # type: ignore[arg-type, func-returns-value]
    assert built == [] and buffer.current(1)[0].inputs["x"][1][0] == 1
    by_bytes = ExemplarBuffer(10, 100, 60)  # full by bytes, not by count
    assert offer(by_bytes, 1, (1, 0.5, 0.5), at=0, nbytes=100)
    assert not offer(by_bytes, 2, (1, 0.5, 0.5), at=1, nbytes=100)
    assert offer(by_bytes, 3, (1, 0.5, 0.6), at=2, nbytes=100)
    assert [e.inputs["x"][1][0] for e in by_bytes.current(2)] == [3]


def test_bytes_bound_the_buffer_and_the_window_evicts() -> None:
    buffer = ExemplarBuffer(10, 200, 60)
    assert offer(buffer, 1, (1, 0.1, 0), at=0, nbytes=100)
    assert offer(buffer, 2, (1, 0.2, 0), at=1, nbytes=100)
    assert offer(buffer, 3, (1, 0.3, 0), at=2, nbytes=100)  # evicts value 1 (the lowest)
    assert [e.inputs["x"][1][0] for e in buffer.current(2)] == [3, 2] and buffer.nbytes == 200
    assert not offer(buffer, 4, (9, 9, 9), at=3, nbytes=201)  # larger than the whole buffer
    assert [e.inputs["x"][1][0] for e in buffer.current(61)] == [3]  # value 2 is 60 s old
    assert buffer.current(62) == []
    assert offer(buffer, 5, (0, 0, 0), at=62)  # an emptied window takes even a good row
    buffer.configure(0, 200, 60)
    assert buffer.current(62) == [] and not offer(buffer, 6, (5, 5, 5), at=62)


def test_exemplars_encode_as_npz_stacked_per_input_with_metadata() -> None:
    rows = [exemplar(1, (1, 0.5, 2.0), 0), exemplar(2, (0, 0.1, 0.5), 1)]
    archive = np.load(io.BytesIO(encode_exemplars(rows)), allow_pickle=False)
    assert archive["x"].shape == (2, 16) and archive["x"][1, 0] == 2
    metadata = json.loads(str(archive[METADATA_KEY]))
    assert [m["disagreements"] for m in metadata] == [1, 0]
    assert metadata[0]["referenceClass"] == 1 and metadata[0]["slice"] == "a"
    assert metadata[0]["inputs"] == {"x": {"datatype": "FP32", "shape": [16]}}
    ragged = [rows[0], exemplar(3, (0, 0, 0), 2)]
    ragged[1].inputs["x"] = ("FP32", np.zeros(4, np.float32))  # type: ignore[index]
    archive = np.load(io.BytesIO(encode_exemplars(ragged)), allow_pickle=False)
    assert sorted(archive.files) == [METADATA_KEY, "exemplar_0__x", "exemplar_1__x"]
    empty = np.load(io.BytesIO(encode_exemplars([])), allow_pickle=False)
    assert empty.files == [METADATA_KEY] and json.loads(str(empty[METADATA_KEY])) == []


# --------------------------------------------------------------------------- aggregates

REFERENCE = MirrorTarget(url="http://reference:8000", model_name="m", candidate_version="1",
                         candidate_digest="sha256:ref", traffic_percent=5)  # fmt: skip


def scrape(registry: CollectorRegistry) -> list:
    text = generate_latest(registry).decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_quality_aggregates_tally_classes_and_slices_under_role_quality() -> None:
    registry = CollectorRegistry()
    now = [100.0]
    watch = QualityWatch(reference=REFERENCE, slice_header="X-Tenant", max_slices=1)
    aggregates = QualityAggregates(watch, "m", "1", ShadowMetrics(registry), clock=lambda: now[0])
    serving = np.array([[3.0, 0, 0], [0, 3.0, 0]], np.float32)
    reference = np.array([[3.0, 0, 0], [3.0, 0, 0]], np.float32)
    inputs = {"x": ("FP32", np.arange(8, dtype=np.float32).reshape(2, 4))}
    comparison = compare_request(fp32(serving), fp32(reference), trusted="candidate",
                                 per_row=True)  # fmt: skip
    aggregates.answered = 40
    for tenant in ("a", "b\n", None):
        aggregates.record_comparison(comparison, 0.01, 0.02, slice_value=tenant, inputs=inputs)
    aggregates.record_outcome("dropped")
    status = aggregates.status()
    assert status["effectiveSampleRate"] == 3 / 40 and status["requests"]["dropped"] == 1
    assert status["classes"] == [
        {"referenceClass": "0", "rows": 6, "agreements": 3, "agreement": 0.5}
    ]
    assert status["slices"] == [
        {"slice": "a", "rows": 2, "agreements": 1, "agreement": 0.5},
        {"slice": "other", "rows": 4, "agreements": 2, "agreement": 0.5},
    ]
    assert status["exemplars"] == 6  # room for 16: the agreeing rows too, ranked last
    samples = scrape(registry)
    assert {s.labels["role"] for s in samples} == {"quality"}
    slice_rows = {s.labels["slice"]: s.value for s in samples
                  if s.name == "kubeinfer_shadow_slice_top1_rows_total"}  # fmt: skip
    assert slice_rows == {"a": 2, "other": 4}
    archive = np.load(io.BytesIO(aggregates.exemplars_npz()), allow_pickle=False)
    assert archive["x"].tolist()[:3] == [[4, 5, 6, 7]] * 3  # the disagreeing row 1 first
    assert archive["x"].tolist()[3:] == [[0, 1, 2, 3]] * 3
    now[0] += watch.window_seconds
    assert aggregates.status()["exemplars"] == 0  # the window passed
    aggregates.close()
    assert scrape(registry) == []  # every series of the watch went with it


def test_the_mirror_file_names_a_shadow_and_a_watch_at_once() -> None:
    content = json.dumps({
        "target": {"url": "http://cand:1", "modelName": "m", "candidateVersion": "2"},
        "qualityWatch": {"reference": {"url": "http://ref:1", "modelName": "m",
                                       "candidateVersion": "1", "trafficPercent": 5},
                         "sliceHeader": "X-Tenant"},
    }).encode()  # fmt: skip
    parsed = parse_mirror_content(content)
    assert parsed.target is not None and parsed.quality_watch is not None
    assert parsed.quality_watch.reference.traffic_percent == 5
    assert parse_mirror_content(b"") == MirrorFile()


async def test_a_shadow_and_a_watch_run_at_once_each_with_its_own_queue() -> None:
    registry = CollectorRegistry()
    config = RuntimeConfig(model_name="m", engine={"onnxPath": "/m.onnx"})
    controller = ShadowController(config, registry)
    # Nothing listens on port 9, and offers come faster than any worker runs: the
    # quality mirror's queue of 1 drops, the shadow's queue of 1000 takes them all.
    policy = MirrorPolicy(max_concurrency=1, max_queue_size=1, timeout_milliseconds=50)
    roomy = MirrorPolicy(max_queue_size=1000)
    shadow = MirrorTarget(url="http://127.0.0.1:9", model_name="m", candidate_version="2",
                          traffic_percent=100, policy=roomy)  # fmt: skip
    reference = REFERENCE.model_copy(update={"url": "http://127.0.0.1:9",
                                             "traffic_percent": 100, "policy": policy})  # fmt: skip
    watch = QualityWatch(reference=reference, slice_header="X-Tenant")
    await controller.apply_file(MirrorFile(target=shadow, quality_watch=watch))
    assert controller.slice_header == "X-Tenant"
    inputs = {"x": ("FP32", np.zeros((1, 4), np.float32))}
    outputs = fp32(np.zeros((1, 3)))
    for _ in range(20):
        controller.offer(inputs, outputs, 0.001, "a")
    quality = controller.quality_status()
    assert quality["answered"] == 20 and quality["requests"]["dropped"] >= 18
    assert controller.status()["requests"]["dropped"] == 0  # the shadow's queue is its own
    await controller.apply_file(MirrorFile(target=shadow))
    assert controller.slice_header is None and not controller.quality_status()["active"]
    assert controller.status()["active"]
    await controller.stop()
    assert not controller.active
