"""The Python v2 tensor codec (JSON and binary extension) both ways, which the mirrors
speak to their candidates (`kubeinfer.runtime.protocol.tensor_codec`; the Rust data plane
has its own, tested in runtime/native/crates/core/src/codec).

Covers: decode(encode) round-trips every datatype through JSON and binary; every
malformed body is an `InvalidRequest`, never another exception.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeinfer.runtime.engines.base import V2_TO_NUMPY
from kubeinfer.runtime.protocol.errors import InvalidRequest
from kubeinfer.runtime.protocol.tensor_codec import decode_infer_request, encode_infer_response
from kubeinfer.runtime.protocol.v2_types import InferOutput, InferResponse

NUMERIC = sorted(d for d in V2_TO_NUMPY if d != "BYTES")  # BYTES: test_bytes_tensors


def _request_body(tensors: dict[str, np.ndarray], binary: bool) -> tuple[bytes, int | None]:
    """A request as tritonclient would write it (JSON or with the binary extension)."""
    inputs, chunks = [], []
    for name, array in tensors.items():
        entry = {"name": name, "datatype": _v2(array), "shape": list(array.shape)}
        if binary:
            raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = array.ravel().tolist()
        inputs.append(entry)
    header = json.dumps({"id": "r1", "inputs": inputs}).encode()
    return (header + b"".join(chunks), len(header)) if binary else (header, None)


def _v2(array: np.ndarray) -> str:
    return next(k for k, v in V2_TO_NUMPY.items() if v == array.dtype)


arrays = st.sampled_from(NUMERIC).flatmap(
    lambda datatype: st.tuples(
        st.just(datatype),
        st.lists(st.integers(1, 4), min_size=1, max_size=3),
        st.integers(0, 2**32 - 1),
    )
)


@settings(max_examples=80, deadline=None)
@given(spec=arrays, binary=st.booleans())
def test_request_round_trip(spec, binary: bool) -> None:
    datatype, shape, seed = spec
    dtype = V2_TO_NUMPY[datatype]
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
        array = rng.standard_normal(shape).astype(dtype)
    elif dtype.kind == "b":
        array = rng.integers(0, 2, shape).astype(bool)
    else:
        info = np.iinfo(dtype)
        array = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    body, header_length = _request_body({"x": array}, binary)
    request = decode_infer_request(body, header_length)
    assert request.id == "r1"
    [decoded] = request.inputs
    assert decoded.datatype == datatype and decoded.data.dtype == dtype
    np.testing.assert_array_equal(decoded.data, array)


@pytest.mark.parametrize("binary", [False, True])
def test_response_round_trip(binary: bool) -> None:
    logits = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    labels = np.array([[1], [2], [3]], dtype=np.int64)
    body, header_length = encode_infer_response(
        InferResponse(
            "m",
            "1",
            "r",
            [InferOutput("logits", "FP32", logits, binary), InferOutput("l", "INT64", labels)],
        )
    )
    header = json.loads(body if header_length is None else body[:header_length])
    assert header["model_name"] == "m" and header["id"] == "r"
    first, second = header["outputs"]
    assert second["data"] == [1, 2, 3] and second["shape"] == [3, 1]
    if binary:
        assert header_length is not None
        assert first["parameters"]["binary_data_size"] == logits.nbytes
        decoded = np.frombuffer(body[header_length:], np.float32).reshape(first["shape"])
    else:
        assert header_length is None
        decoded = np.array(first["data"], np.float32).reshape(first["shape"])
    np.testing.assert_array_equal(decoded, logits)


GOOD = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b"{", None, "malformed JSON"),
        (b"\xff\xfe", None, "malformed JSON"),
        (b"[]", None, "JSON object"),
        (b'{"inputs": []}', None, "non-empty list"),
        (json.dumps({"inputs": [{**GOOD, "datatype": "BYTES"}]}).encode(), None, "BYTES"),
        (json.dumps({"inputs": [{**GOOD, "shape": [1, -2]}]}).encode(), None, "shape"),
        (json.dumps({"inputs": [{**GOOD, "shape": [True, 2]}]}).encode(), None, "shape"),
        (json.dumps({"inputs": [{**GOOD, "data": [1.0]}]}).encode(), None, "1 elements"),
        (json.dumps({"inputs": [{**GOOD, "data": [[1.0], [2.0, 3.0]]}]}).encode(), None, "nested"),
        (json.dumps({"inputs": [{**GOOD, "data": "ab"}]}).encode(), None, "must be a list"),
        (json.dumps({"inputs": [GOOD], "id": 3}).encode(), None, "id"),
        (json.dumps({"inputs": [GOOD], "parameters": {"timeout": -1}}).encode(), None, "timeout"),
        (json.dumps({"inputs": [GOOD], "outputs": [{"x": 1}]}).encode(), None, "outputs"),
        (b'{"inputs": []}', 99, "outside the body"),
        # binary data sent without Inference-Header-Content-Length
        (json.dumps({"inputs": [{**GOOD, "parameters": {"binary_data_size": 8}}]}).encode()
         + b"12345678", None, "malformed JSON"),
    ],
)  # fmt: skip
def test_malformed_requests_are_invalid(body: bytes, header_length, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        decode_infer_request(body, header_length)


def test_binary_sizes_are_checked() -> None:
    entry = {
        "name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}
    }  # fmt: skip
    header = json.dumps({"inputs": [entry]}).encode()
    with pytest.raises(InvalidRequest, match="runs past the end"):
        decode_infer_request(header + b"1234", len(header))
    with pytest.raises(InvalidRequest, match="no input claims"):
        decode_infer_request(header + b"12345678extra", len(header))
    entry["parameters"]["binary_data_size"] = 4
    header = json.dumps({"inputs": [entry]}).encode()
    with pytest.raises(InvalidRequest, match="does not match shape"):
        decode_infer_request(header + b"1234", len(header))
