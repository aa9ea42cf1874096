"""The pure parts of serving variable axes besides the batch, as tables.

Covers: axis names and sums (`engines.dimensions`); configured ranges checked against
the model (a variable axis with no range, a range of the wrong rank, a fixed axis given
another range, an unknown input); `ShapePlan.check`: a request outside its range is a 400
naming the range, axes of one name that disagree (and a sum that does not add up) are a
400, each request's batch shape under EqualShapes (its own) and PadToBuckets (rounded up
to the next bucket, powers of two by default, never past the axis' maximum, a sum's last
term lowered to fit its axis), the cut back to the request's own extents; padding refused
where it would be unsafe (nothing padded, an input given a padValue whose axis another
input does not pad, a decoder's past, an output axis named after no input axis); the
policy's grouping of queued requests by batch shape; packing with pad values and
splitting with cuts; the request body limit from the largest allowed request; the
buffer fit decision and the memory read from cgroup files; `--input-shape`'s form.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kubeinfer.contract.runtime_config import (
    BatchingPolicy,
    InputShape,
    ShapeBatching,
    request_bytes_limit,
)
from kubeinfer.runtime.batching.assembler import pack_padded, split
from kubeinfer.runtime.batching.policy import Flush, Pending, next_decision
from kubeinfer.runtime.batching.shapes import ShapePlan
from kubeinfer.runtime.buffer_memory import available_bytes, buffers_problem
from kubeinfer.runtime.dataplane import largest_request_bytes
from kubeinfer.runtime.engines.base import TensorSpec, UnsupportedModel, buffer_bytes
from kubeinfer.runtime.engines.dimensions import (
    ShapeConfigError,
    evaluate,
    resolve_ranges,
    sum_terms,
)
from kubeinfer.runtime.protocol.errors import InvalidRequest
from kubeinfer.runtime.serve_command import parse_input_shape

SEQ, PAST, TOTAL = (
    "sequence_length",
    "past_sequence_length",
    "past_sequence_length + sequence_length",
)
TEXT = ("input_ids", "attention_mask", "token_type_ids")


def ranged(
    name: str, datatype: str, item: tuple, names: tuple, low: tuple, high: tuple
) -> TensorSpec:
    return TensorSpec(name, datatype, (-1, *item), names, low, high)


def encoder_specs(high: int = 128) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs = [ranged(n, "INT64", (-1,), (SEQ,), (1,), (high,)) for n in TEXT]
    outputs = [
        TensorSpec("logits", "FP32", (-1, 3)),
        TensorSpec("last_hidden_state", "FP32", (-1, -1, 8), (SEQ, None), None, (high, 8)),
    ]
    return inputs, outputs


def decoder_specs() -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs = [
        ranged("input_ids", "INT64", (-1,), (SEQ,), (1,), (64,)),
        ranged("attention_mask", "INT64", (-1,), (TOTAL,), (1,), (80,)),
        ranged("past_0_key", "FP32", (2, -1, 4), (None, PAST, None), (2, 0, 4), (2, 64, 4)),
    ]
    outputs = [
        TensorSpec("logits", "FP32", (-1, -1, 10), (SEQ, None), None, (64, 10)),
        TensorSpec("present_0_key", "FP32", (-1, 2, -1, 4), (None, TOTAL, None), None, (2, 80, 4)),
    ]
    return inputs, outputs


def padding(*names: str, value: float = 0) -> list[InputShape]:
    return [
        InputShape(name=n, min_shape=[1], opt_shape=[1], max_shape=[1], pad_value=value)
        for n in names
    ]


def plan(specs, strategy=ShapeBatching.PAD_TO_BUCKETS, padded=TEXT, buckets=()) -> ShapePlan:
    policy = BatchingPolicy(shape_batching=strategy, shape_buckets=list(buckets))
    return ShapePlan(*specs, policy, padding(*padded))


def text_request(rows: int, length: int) -> dict:
    return {n: ("INT64", np.ones((rows, length), np.int64)) for n in TEXT}


def decoder_request(length: int, past: int, total: int | None = None) -> dict:
    return {
        "input_ids": ("INT64", np.ones((1, length), np.int64)),
        "attention_mask": (
            "INT64",
            np.ones((1, past + length if total is None else total), np.int64),
        ),
        "past_0_key": ("FP32", np.ones((1, 2, past, 4), np.float32)),
    }


# -- names, sums and ranges ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "terms"),
    [
        (SEQ, (SEQ,)),
        (TOTAL, (PAST, SEQ)),
        ("a + 1 + b", ("a", 1, "b")),
        ("2*n", ("2*n",)),
        ("unk__3", ("unk__3",)),
    ],
)
def test_an_axis_name_is_a_sum_of_names_and_numbers_or_itself(name, terms) -> None:
    assert sum_terms(name) == terms


def test_a_sum_is_read_whole_first_then_added_up() -> None:
    assert evaluate(TOTAL, {TOTAL: 9, PAST: 1, SEQ: 1}) == 9
    assert evaluate(TOTAL, {PAST: 5, SEQ: 3}) == 8
    assert evaluate("a + 1", {"a": 2}) == 3
    assert evaluate(TOTAL, {SEQ: 3}) is None


@pytest.mark.parametrize(
    ("configured", "message"),
    [
        ([], r"input 'ids' has variable axes besides the batch \(\['sequence_length'\]\)"),
        (
            [InputShape(name="ids", min_shape=[1, 1], opt_shape=[1, 1], max_shape=[2, 2])],
            "has 2 axes; the input has 1",
        ),
        (
            [InputShape(name="other", min_shape=[1], opt_shape=[1], max_shape=[1])],
            "names 'other', which is not an input",
        ),
    ],
)
def test_ranges_that_do_not_fit_the_model_are_refused(configured, message) -> None:
    with pytest.raises(ShapeConfigError, match=message):
        resolve_ranges([("ids", (-1,), (SEQ,))], configured)


def test_a_fixed_axis_takes_the_models_size_only() -> None:
    past = [("past", (2, -1), (None, PAST))]
    good = InputShape(name="past", min_shape=[2, 0], opt_shape=[2, 8], max_shape=[2, 64])
    assert resolve_ranges(past, [good]) == {"past": ((2, 0), (2, 64))}
    bad = InputShape(name="past", min_shape=[1, 0], opt_shape=[2, 8], max_shape=[4, 64])
    with pytest.raises(
        ShapeConfigError, match=r"axis 1 is fixed at 2 by the model, but its range is 1\.\.4"
    ):
        resolve_ranges(past, [bad])
    assert resolve_ranges([("x", (3,), ())], []) == {"x": ((3,), (3,))}


# -- checking requests -------------------------------------------------------------------


def test_a_request_outside_its_range_is_a_400_naming_the_range() -> None:
    shapes = plan(encoder_specs(), ShapeBatching.EQUAL_SHAPES, padded=())
    with pytest.raises(
        InvalidRequest,
        match=r"'input_ids' has shape \[2, 129\]; this model accepts \[batch, 1..128\]",
    ):
        shapes.check(text_request(2, 129), 8)
    past = plan(decoder_specs(), ShapeBatching.EQUAL_SHAPES, padded=())
    with pytest.raises(InvalidRequest, match=r"accepts \[batch, 2, 0..64, 4\]"):
        past.check(decoder_request(1, 65), 8)


def test_axes_of_one_name_must_agree() -> None:
    shapes = plan(encoder_specs(), ShapeBatching.EQUAL_SHAPES, padded=())
    request = dict(text_request(1, 9), token_type_ids=("INT64", np.ones((1, 8), np.int64)))
    with pytest.raises(
        InvalidRequest,
        match=r"'token_type_ids' has 8 along its axis 1 \(sequence_length\), input 'attention_m",
    ):
        shapes.check(request, 8)
    decoder = plan(decoder_specs(), ShapeBatching.EQUAL_SHAPES, padded=())
    with pytest.raises(
        InvalidRequest, match=r"'attention_mask' has 9 .* the other inputs make that 8"
    ):
        decoder.check(decoder_request(3, 5, total=9), 8)


def test_equal_shapes_batch_a_request_at_its_own_shape() -> None:
    shapes = plan(encoder_specs(), ShapeBatching.EQUAL_SHAPES, padded=())
    rows, shape = shapes.check(text_request(2, 9), 8)
    assert rows == 2 and shape is not None
    assert (shape.batch_shape, shape.cut) == (((9,), (9,), (9,)), ())


@pytest.mark.parametrize(
    ("length", "buckets", "padded_to"),
    [
        (1, (), 1), (3, (), 4), (9, (), 16), (16, (), 16), (100, (), 128), (128, (), 128),
        (9, (16, 64), 16), (17, (16, 64), 64), (65, (16, 64), 128), (100, (16, 64, 512), 128),
    ],
)  # fmt: skip
def test_padding_rounds_up_to_the_next_bucket_never_past_the_maximum(
    length, buckets, padded_to
) -> None:
    _, shape = plan(encoder_specs(), buckets=buckets).check(text_request(1, length), 8)
    assert shape is not None and shape.batch_shape == ((padded_to,),) * 3
    cut = dict(shape.cut)
    if padded_to == length:
        assert cut == {}
    else:  # only the output named after the padded axis is cut, to the request's length
        assert cut == {"last_hidden_state": (slice(None), slice(0, length), slice(0, 8))}


def test_a_decoder_pads_its_new_tokens_only_and_its_sums_last_term() -> None:
    shapes = plan(decoder_specs(), padded=("input_ids", "attention_mask"))
    assert shapes.padded == {SEQ}
    _, shape = shapes.check(decoder_request(3, 5), 8)
    assert shape is not None
    assert shape.batch_shape == ((4,), (9,), (2, 5, 4))  # 3 -> 4 tokens; mask 5 + 4
    assert dict(shape.cut) == {
        "logits": (slice(None), slice(0, 3), slice(0, 10)),
        "present_0_key": (slice(None), slice(0, 2), slice(0, 8), slice(0, 4)),
    }
    # The mask's axis allows 80: 60 past tokens and 18 new ones go to 80, not 60 + 32.
    _, near_the_end = shapes.check(decoder_request(18, 60), 8)
    assert near_the_end is not None and near_the_end.batch_shape[:2] == ((20,), (80,))


@pytest.mark.parametrize(
    ("specs", "padded", "message"),
    [
        (encoder_specs(), (), "PadToBuckets pads nothing"),
        (
            encoder_specs(),
            ("input_ids", "attention_mask"),
            "'attention_mask' has a padValue, but none",
        ),
        (
            decoder_specs(),
            ("input_ids", "attention_mask", "past_0_key"),
            "'past_0_key' has a padValue",
        ),
        (
            (encoder_specs()[0], [TensorSpec("tokens", "FP32", (-1, -1), ("unk__1",), None, None)]),
            TEXT,
            r"output 'tokens' axis 1 \(unk__1\) is named after no input axis",
        ),
    ],
)
def test_unsafe_padding_is_refused_at_start(specs, padded, message) -> None:
    with pytest.raises(UnsupportedModel, match=message):
        plan(specs, padded=padded)


def test_a_model_without_variable_axes_has_no_shapes() -> None:
    specs = ([TensorSpec("x", "FP32", (-1, 4))], [TensorSpec("y", "FP32", (-1, 2))])
    shapes = ShapePlan(*specs, BatchingPolicy(shape_batching=ShapeBatching.PAD_TO_BUCKETS))
    assert shapes.check({"x": ("FP32", np.zeros((3, 4), np.float32))}, 8) == (3, None)


# -- grouping, packing, splitting -------------------------------------------------------


def pending(shape, rows: int = 1, at: float = 0.0) -> Pending:
    return Pending(rows, at, 100.0, shape=shape)


A, B = ((16,),), ((32,),)


@pytest.mark.parametrize(
    ("queue", "flush"),
    [
        ([None, None, None], Flush(3, 3)),
        ([A, A, A], Flush(3, 3)),
        ([A, B, A], Flush(2, 2, members=(0, 2))),
        ([B, A, A, B], Flush(2, 2, members=(0, 3))),
        ([A, B], Flush(1, 1, members=(0,))),
    ],
)
def test_a_batch_takes_the_oldest_requests_shape_and_the_others_keep_their_places(
    queue, flush
) -> None:
    decision = next_decision(
        BatchingPolicy(max_batch_size=8), [pending(s) for s in queue], 1, 0, 1.0
    )
    assert decision.action == flush


def test_a_batch_of_one_shape_stops_at_max_batch_size() -> None:
    queue = [pending(A, rows=3), pending(B), pending(A, rows=3), pending(A, rows=3)]
    decision = next_decision(BatchingPolicy(max_batch_size=6), queue, 1, 0, 1.0)
    assert decision.action == Flush(2, 6, members=(0, 2))


def test_requests_of_another_shape_waiting_flush_at_once() -> None:
    """A slot busy, a better size ahead: one shape alone would wait, two do not."""
    policy = BatchingPolicy(max_batch_size=8, max_queue_delay_microseconds=10_000)
    alone = next_decision(policy, [pending(A), pending(A)], 1, 1, 0.001)
    assert not isinstance(alone.action, Flush)
    mixed = next_decision(policy, [pending(A), pending(B)], 1, 1, 0.001)
    assert mixed.action == Flush(1, 1, members=(0,))


def test_packing_pads_each_block_and_splitting_cuts_it_back() -> None:
    views = {"ids": np.full((3, 8), -7, np.int64), "mask": np.full((3, 8), -7, np.int64)}
    short = {"ids": np.array([[1, 2, 3]]), "mask": np.array([[1, 1, 1]])}
    full = {"ids": np.arange(16).reshape(2, 8), "mask": np.ones((2, 8), np.int64)}
    ranges = pack_padded([short, full], views, {"ids": 0, "mask": 0})
    assert ranges == [slice(0, 1), slice(1, 3)]
    assert views["ids"][0].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]
    assert views["mask"][0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    np.testing.assert_array_equal(views["ids"][1:], full["ids"])
    outputs = {
        "hidden": np.arange(3 * 8 * 2).reshape(3, 8, 2),
        "logits": np.arange(6).reshape(3, 2),
    }
    cut = (("hidden", (slice(None), slice(0, 3), slice(0, 2))),)
    first, second = split(outputs, ranges, [cut, ()])
    np.testing.assert_array_equal(first["hidden"], outputs["hidden"][0:1, :3])
    np.testing.assert_array_equal(second["hidden"], outputs["hidden"][1:3])
    assert first["hidden"].flags.c_contiguous and first["logits"].tolist() == [[0, 1]]


# -- limits and memory -----------------------------------------------------------------


def test_the_request_limit_follows_the_largest_allowed_request() -> None:
    inputs, outputs = encoder_specs(high=512)
    assert largest_request_bytes(tuple(inputs), 32) == request_bytes_limit(3 * 512 * 8, 32)
    unbounded = TensorSpec("x", "FP32", (-1, -1), ("n",))
    assert largest_request_bytes((unbounded,), 32) is None
    assert largest_request_bytes((TensorSpec("text", "BYTES", (-1, 1)),), 32) is None
    assert buffer_bytes((*inputs, *outputs), 4) == 4 * (3 * 512 * 8 + 3 * 4 + 512 * 8 * 4)


def test_buffers_that_do_not_fit_say_what_to_lower() -> None:
    assert buffers_problem(100 * 2**20, 2, 32, available=None) is None
    assert buffers_problem(100 * 2**20, 2, 32, available=200 * 2**20) is None
    problem = buffers_problem(100 * 2**20, 2, 32, available=150 * 2**20)
    assert problem is not None
    assert "need 200 MiB (2 execution slot(s) of 100 MiB: a batch of 32 rows" in problem
    assert (
        "only 150 MiB" in problem
        and "lower maxBatchSize, executionSlots or the inputs' maxShape" in problem
    )


def test_available_memory_is_the_smaller_of_the_cgroups_room_and_the_hosts(tmp_path: Path) -> None:
    cgroup, meminfo = tmp_path / "cgroup", tmp_path / "meminfo"
    cgroup.mkdir()
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:    4096 kB\n")
    assert available_bytes(cgroup, meminfo) == 4096 * 1024
    (cgroup / "memory.max").write_text("3000000\n")
    (cgroup / "memory.current").write_text("1000000\n")
    assert available_bytes(cgroup, meminfo) == 2_000_000
    (cgroup / "memory.max").write_text("max\n")
    assert available_bytes(cgroup, meminfo) == 4096 * 1024
    assert available_bytes(tmp_path / "none", tmp_path / "none") is None


def test_available_memory_reads_a_cgroup_v1_limit_too(tmp_path: Path) -> None:
    """A node on cgroup v1 shows its containers `memory/memory.limit_in_bytes` (an
    unlimited one a page counter's maximum), no `memory.max`."""
    cgroup, meminfo = tmp_path / "cgroup", tmp_path / "meminfo"
    (cgroup / "memory").mkdir(parents=True)
    meminfo.write_text("MemAvailable:    4096 kB\n")
    (cgroup / "memory" / "memory.limit_in_bytes").write_text("3000000\n")
    (cgroup / "memory" / "memory.usage_in_bytes").write_text("1000000\n")
    assert available_bytes(cgroup, meminfo) == 2_000_000
    (cgroup / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert available_bytes(cgroup, meminfo) == 4096 * 1024


def fields(name: str, low: list, opt: list, high: list, pad: float | None = None) -> dict:
    found = {"name": name, "minShape": low, "optShape": opt, "maxShape": high}
    return found if pad is None else found | {"padValue": pad}


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("input_ids=1:64:128:0", fields("input_ids", [1], [64], [128], pad=0)),
        ("past=4x0x16:4x64x16:4x256x16", fields("past", [4, 0, 16], [4, 64, 16], [4, 256, 16])),
        ("x=1:2:3:-0.5", fields("x", [1], [2], [3], pad=-0.5)),
    ],
)
def test_input_shape_flags_read_as_input_shapes(text, fields) -> None:
    assert parse_input_shape(text) == fields


@pytest.mark.parametrize(
    "text", ["input_ids", "input_ids=1:64", "=1:2:3", "x=1:a:3", "x=1:2:3:4:5"]
)
def test_a_malformed_input_shape_flag_names_the_form(text) -> None:
    with pytest.raises(ValueError, match="NAME=MIN:OPT:MAX"):
        parse_input_shape(text)
