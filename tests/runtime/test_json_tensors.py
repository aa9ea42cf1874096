"""The strict JSON tensor reader and the bound on what a body may make the server build
(`kubeinfer.runtime.protocol.json_tensors`, and `DecodeLimits` in the Python codec; the
Rust data plane's own is tested in runtime/native/crates/core/src/codec/json).

Covers, as properties: any array of any datatype reads back equal from its flat and its
nested JSON form; a valid request at the model's largest size, flat or nested, written
with or without spaces, never holds more values than `model_json_value_limit` allows (the
bound never refuses a real request); and, as tables, what each datatype refuses, that a
body over the bound is refused before parsing with a 413, and that a declared shape over
the model's largest input is refused before its data is read (a small body is parsed:
its worst case is bounded by its size).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeinfer.runtime.engines.base import V2_TO_NUMPY
from kubeinfer.runtime.protocol.errors import InvalidRequest, RequestTooLarge
from kubeinfer.runtime.protocol.json_tensors import (
    json_value_count,
    model_json_value_limit,
    to_numpy,
)
from kubeinfer.runtime.protocol.tensor_codec import (
    COUNT_VALUES_FROM_BYTES,
    DecodeLimits,
    decode_infer_request,
)

NUMERIC = sorted(d for d in V2_TO_NUMPY if d != "BYTES")  # BYTES: test_bytes_tensors
SHAPES = st.lists(st.integers(0, 4), min_size=1, max_size=4)


def _random_array(datatype: str, shape: list[int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = V2_TO_NUMPY[datatype]
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@settings(max_examples=150, deadline=None)
@given(
    datatype=st.sampled_from(NUMERIC),
    shape=SHAPES,
    nested=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_arrays_read_back_from_flat_and_nested_json(datatype, shape, nested, seed) -> None:
    array = _random_array(datatype, shape, seed)
    data = json.loads(json.dumps(array.tolist() if nested else array.ravel().tolist()))
    if not isinstance(data, list):
        data = [data]
    got = to_numpy(data, shape, math.prod(shape), V2_TO_NUMPY[datatype], datatype, "x")
    np.testing.assert_array_equal(got.reshape(shape), array)


@settings(max_examples=150, deadline=None)
@given(
    items=st.lists(st.lists(st.integers(1, 5), max_size=3), min_size=1, max_size=3),
    max_rows=st.integers(1, 8),
    nested=st.booleans(),
    spaced=st.booleans(),
)
def test_a_valid_request_never_holds_more_values_than_the_bound(
    items, max_rows, nested, spaced
) -> None:
    inputs = []
    for index, item in enumerate(items):
        array = np.zeros((max_rows, *item), np.float32)
        data = array.tolist() if nested else array.ravel().tolist()
        inputs.append({"name": f"in{index}", "datatype": "FP32", "shape": list(array.shape),
                       "data": data, "parameters": {"note": 1}})  # fmt: skip
    body = {"id": "r", "inputs": inputs, "outputs": [{"name": "y"}], "parameters": {"a": 1}}
    text = json.dumps(body, separators=(", ", ": ") if spaced else (",", ":")).encode()
    limit = model_json_value_limit(items, max_rows)
    assert limit is not None and json_value_count(text) <= limit


@pytest.mark.parametrize(
    ("datatype", "values", "message"),
    [
        ("FP32", [1.0, None], "holds null"),
        ("FP32", [1.0, "2"], "holds a string"),
        ("FP32", [1.0, False], "holds a boolean"),
        ("FP16", [1.0, 1e6], "out of FP16's range"),
        ("INT64", [1, 2.5], "takes integers only"),
        ("UINT8", [1, -1], "out of bounds"),
        ("BOOL", [True, 1], "takes booleans only"),
        ("INT8", [1, {"a": 1}], "holds an object"),
    ],
)
def test_each_datatype_refuses_what_it_does_not_take(datatype, values, message) -> None:
    with pytest.raises(InvalidRequest, match=message):
        to_numpy(values, [2], 2, V2_TO_NUMPY[datatype], datatype, "x")


def test_responses_read_null_as_nan() -> None:
    got = to_numpy([1.0, None], [2], 2, np.dtype(np.float32), "FP32", "y", allow_null=True)
    assert got[0] == 1.0 and math.isnan(got[1])


ITEM_SHAPES = ((4,), (4,))
"""A model of two inputs of 4 values a row ("x" FP32, "ids" INT32), at 8 rows."""
LIMITS = DecodeLimits(max_elements=8 * 4, max_json_values=model_json_value_limit(ITEM_SHAPES, 8))


def test_a_large_body_over_the_models_value_bound_is_refused_unparsed() -> None:
    limits = LIMITS
    lists = COUNT_VALUES_FROM_BYTES // 3 + 1  # large enough to be counted
    assert limits.max_json_values is not None and lists > limits.max_json_values
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [' + (
        b"[]," * lists + b"[]]}]}"
    )
    with pytest.raises(RequestTooLarge, match="was not parsed"):
        decode_infer_request(body, None, limits)
    small = body[: body.index(b"[[]") + 1] + b"[]," * 5000 + b"[]]}]}"  # parsed: bounded
    with pytest.raises(InvalidRequest, match="nested data has 5001 rows"):
        decode_infer_request(small, None, limits)


def test_a_shape_over_the_largest_input_is_refused_before_its_data() -> None:
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [9, 4], "data": "not read"}]}
    ).encode()
    with pytest.raises(InvalidRequest, match="declares 36 elements"):
        decode_infer_request(body, None, LIMITS)


def test_a_model_with_a_dynamic_item_dimension_has_no_value_bound() -> None:
    assert model_json_value_limit(((-1,),), 8) is None
