"""The Python parts of serving variable axes besides the batch, as tables (what the Rust
data plane does with them, checking requests, padding, grouping by shape, packing and
cutting, is tested in runtime/native/crates/core/src/batching: shapes, policy, scheduler,
assembly).

Covers: axis names and sums (`engines.dimensions`); configured ranges checked against
the model (a variable axis with no range, a range of the wrong rank, a fixed axis given
another range, an unknown input); the request body limit from the largest allowed
request (`rust_dataplane.largest_request_bytes`), the limit served (`request_limit`: the
configured one, else the model's, else a default) and the buffers' size; the buffer fit
decision and the memory read from cgroup files; `--input-shape`'s form.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from kubeinfer.contract.runtime_config import (
    UNSIZED_REQUEST_BYTES,
    BatchingPolicy,
    EngineSource,
    InputShape,
    RuntimeConfig,
    request_bytes_limit,
)
from kubeinfer.runtime.engines.base import TensorSpec, buffer_bytes
from kubeinfer.runtime.engines.buffer_fit import available_bytes, buffers_problem
from kubeinfer.runtime.engines.dimensions import (
    ShapeConfigError,
    evaluate,
    resolve_ranges,
    sum_terms,
)
from kubeinfer.runtime.rust_dataplane import largest_request_bytes, request_limit
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


# -- limits and memory -----------------------------------------------------------------


def test_the_request_limit_follows_the_largest_allowed_request() -> None:
    inputs, outputs = encoder_specs(high=512)
    assert largest_request_bytes(tuple(inputs), 32) == request_bytes_limit(3 * 512 * 8, 32)
    unbounded = TensorSpec("x", "FP32", (-1, -1), ("n",))
    assert largest_request_bytes((unbounded,), 32) is None
    assert largest_request_bytes((TensorSpec("text", "BYTES", (-1, 1)),), 32) is None
    assert buffer_bytes((*inputs, *outputs), 4) == 4 * (3 * 512 * 8 + 3 * 4 + 512 * 8 * 4)


def test_the_request_limit_is_the_configured_one_else_the_models_else_a_default() -> None:
    inputs, _ = encoder_specs(high=512)
    engine = SimpleNamespace(inputs=tuple(inputs))
    text = SimpleNamespace(inputs=(TensorSpec("text", "BYTES", (-1, 1)),))
    config = RuntimeConfig(model_name="m", engine=EngineSource(onnx_path="m.onnx"),
                           batching=BatchingPolicy(max_batch_size=32))  # fmt: skip
    assert request_limit(config, engine) == largest_request_bytes(tuple(inputs), 32)
    assert request_limit(config, text) == UNSIZED_REQUEST_BYTES
    configured = config.model_copy(update={"max_request_bytes": 4096})
    assert request_limit(configured, engine) == request_limit(configured, text) == 4096


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
