"""BYTES tensors (strings) through the Python REST codec the mirrors speak to their
candidates (`kubeinfer.runtime.protocol.bytes_tensors`, `tensor_codec`; the Rust data
plane's own codecs are tested in runtime/native/crates: core's codec/bytes and codec/json,
server's grpc/codec).

Covers, as properties: any BYTES tensor (empty elements, non-UTF-8 bytes, NUL bytes
included) serializes exactly as tritonclient's `serialize_byte_tensor` does and reads
back from it; a request round-trips through REST JSON (UTF-8 text) and the binary
extension; a response written by the codec reads back through tritonclient's own
deserializer. As tables: every malformed
BYTES form (a length past the buffer, bytes left over, too few elements, a number where
a string belongs) is an `InvalidRequest` naming the tensor; non-UTF-8 output asked for as
JSON is refused with the remedy.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeinfer.runtime.protocol import bytes_tensors
from kubeinfer.runtime.protocol.errors import InvalidRequest
from kubeinfer.runtime.protocol.tensor_codec import (
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
)
from kubeinfer.runtime.protocol.v2_types import InferInput, InferOutput, InferResponse
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

ELEMENTS = st.binary(max_size=12)
TEXT = st.text(max_size=8)


def _tritons(array: np.ndarray) -> bytes:
    """tritonclient's serialized form (an empty array for no elements)."""
    serialized = serialize_byte_tensor(array)
    return serialized.item() if serialized.size else b""


def _array(elements: list[bytes], rows: int) -> np.ndarray:
    return bytes_tensors.to_bytes_array(elements, (rows, len(elements) // rows))


@st.composite
def bytes_arrays(draw, elements=ELEMENTS) -> np.ndarray:
    rows = draw(st.integers(1, 3))
    width = draw(st.integers(0, 3))
    values = draw(st.lists(elements, min_size=rows * width, max_size=rows * width))
    return bytes_tensors.to_bytes_array(values, (rows, width))


@settings(max_examples=100, deadline=None)
@given(array=bytes_arrays())
def test_the_binary_form_is_tritons(array: np.ndarray) -> None:
    raw = bytes_tensors.serialize(array)
    assert raw == _tritons(array)
    assert bytes_tensors.serialized_size(array) == len(raw)
    back = bytes_tensors.deserialize(raw, array.size, "x").reshape(array.shape)
    assert back.tolist() == array.tolist()
    assert all(type(e) is bytes for e in back.ravel())
    theirs = deserialize_bytes_tensor(raw)
    assert [bytes(e) for e in theirs] == list(array.ravel())


def _request(array: np.ndarray, binary: bool) -> tuple[bytes, int | None]:
    entry = {"name": "text", "datatype": "BYTES", "shape": list(array.shape)}
    if not binary:
        entry["data"] = [e.decode() for e in array.ravel()]
        return json.dumps({"inputs": [entry]}).encode(), None
    raw = bytes_tensors.serialize(array)
    entry["parameters"] = {"binary_data_size": len(raw)}
    header = json.dumps({"inputs": [entry]}).encode()
    return header + raw, len(header)


@settings(max_examples=60, deadline=None)
@given(array=bytes_arrays(TEXT.map(str.encode)), binary=st.booleans())
def test_a_rest_request_round_trips_as_json_text_and_binary(array, binary) -> None:
    body, header_length = _request(array, binary)
    [decoded] = decode_infer_request(body, header_length).inputs
    assert decoded.datatype == "BYTES" and decoded.data.shape == array.shape
    assert decoded.data.tolist() == array.tolist()


def test_nested_json_strings_follow_the_shape() -> None:
    body = json.dumps(
        {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [2, 1], "data": [["a"], ["é"]]}]}
    ).encode()
    [decoded] = decode_infer_request(body).inputs
    assert decoded.data.tolist() == [[b"a"], ["é".encode()]]


@settings(max_examples=60, deadline=None)
@given(array=bytes_arrays(), binary=st.booleans())
def test_a_response_reads_back_and_tritonclient_reads_its_binary_form(array, binary) -> None:
    if not binary:  # JSON carries UTF-8 text only
        array = bytes_tensors.to_bytes_array(
            [e.decode("utf-8", "replace").encode() for e in array.ravel()], array.shape
        )
    response = InferResponse("m", "1", None, [InferOutput("label", "BYTES", array, binary)])
    body, header_length = encode_infer_response(response)
    [output] = decode_infer_response(body, header_length).outputs
    assert output.data.tolist() == array.tolist()
    if binary:
        assert header_length is not None
        theirs = deserialize_bytes_tensor(body[header_length:])
        assert [bytes(e) for e in theirs] == list(array.ravel())
    else:
        header = json.loads(body)
        assert header["outputs"][0]["data"] == [e.decode() for e in array.ravel()]


def test_the_mirror_request_carries_strings_binary() -> None:
    array = _array([b"one", b"", "\x00é".encode()], 3)
    body, header_length = encode_infer_request([InferInput("text", "BYTES", array)])
    [decoded] = decode_infer_request(body, header_length).inputs
    assert decoded.data.tolist() == array.tolist()


def test_non_utf8_output_is_refused_as_json_with_the_remedy() -> None:
    array = _array([b"\xff"], 1)
    response = InferResponse("m", "1", None, [InferOutput("label", "BYTES", array, False)])
    with pytest.raises(InvalidRequest, match=r"not UTF-8.*binary_data"):
        encode_infer_response(response)


def _binary_body(raw: bytes, shape: list[int]) -> tuple[bytes, int]:
    entry = {
        "name": "text", "datatype": "BYTES", "shape": shape,
        "parameters": {"binary_data_size": len(raw)},
    }  # fmt: skip
    header = json.dumps({"inputs": [entry]}).encode()
    return header + raw, len(header)


LENGTH = struct.Struct("<I")


@pytest.mark.parametrize(
    ("raw", "shape", "message"),
    [
        (LENGTH.pack(5) + b"abc", [1, 1], "element 0 declares 5 bytes; only 3"),
        (LENGTH.pack(1) + b"a" + b"xx", [1, 1], "2 bytes follow the 1 BYTES elements"),
        (LENGTH.pack(1) + b"a", [1, 2], "ends after 1 of 2 elements"),
        (b"\x01\x00", [1, 1], "ends after 0 of 1"),
    ],
)
def test_malformed_binary_strings_are_invalid(raw: bytes, shape, message: str) -> None:
    with pytest.raises(InvalidRequest, match=f"input 'text'.*{message}"):
        decode_infer_request(*_binary_body(raw, shape))


@pytest.mark.parametrize(
    ("data", "message"),
    [([1], "takes strings only; it holds 1"), ([None], "holds None"), (["a", "b"], "2 elements")],
)
def test_json_strings_are_read_strictly(data, message: str) -> None:
    body = json.dumps(
        {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1, 1], "data": data}]}
    ).encode()
    with pytest.raises(InvalidRequest, match=message):
        decode_infer_request(body)


def test_string_inputs_must_be_utf8_answers_need_not() -> None:
    array = _array([b"ok", b"\xffbad"], 2)
    refused = r"input 'text'.*element 1 is not UTF-8 text"
    with pytest.raises(InvalidRequest, match=refused):
        decode_infer_request(*_request(array, binary=True))
    response = InferResponse("m", "1", None, [InferOutput("label", "BYTES", array, True)])
    [output] = decode_infer_response(*encode_infer_response(response)).outputs
    assert output.data.tolist() == array.tolist()
