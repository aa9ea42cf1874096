"""BYTES tensors (the Open Inference Protocol's strings) on the wire and in numpy.

In the data plane a BYTES tensor is a numpy object array whose elements are `bytes`
(never `str`: a BYTES element need not be UTF-8 text). Its wire forms:

- binary (Triton's binary tensor extension over REST, and gRPC's `raw_input_contents` /
  `raw_output_contents`): the elements in row-major order, each a 4-byte little-endian
  length followed by that many bytes, as Triton's `serialize_byte_tensor` writes them;
- JSON: a (flat or nested) list of strings, each the element's UTF-8 text, as Triton's
  clients send them; anything but a string is refused;
- gRPC typed contents: `contents.bytes_contents`, one entry per element.

A reader takes exactly the declared element count and refuses a length that runs past
its buffer or bytes left over, naming the tensor: a 400, never a short or padded tensor.

A BYTES input must be UTF-8 text (`check_text`, applied to requests, not to answers):
the models served hold strings as ONNX `tensor(string)`, which ONNX Runtime reads as
Python `str`; bytes that are not UTF-8 could only fail the whole batch later.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from kubeinfer.runtime.protocol.errors import InvalidRequest

BYTES = "BYTES"
_LENGTH = struct.Struct("<I")


def is_bytes_array(array: np.ndarray) -> bool:
    """True for an object array: the data plane's form of a BYTES tensor."""
    return array.dtype.kind == "O"


def as_bytes(element: Any) -> bytes:
    """One element as bytes: `bytes` as it is, `str` as its UTF-8 encoding (what ONNX
    Runtime answers for a string output, and what numpy string arrays hold)."""
    if isinstance(element, bytes):
        return element
    if isinstance(element, str):
        return element.encode("utf-8")
    if isinstance(element, bytearray | memoryview | np.bytes_):
        return bytes(element)
    raise TypeError(f"a BYTES element must be bytes or str, not {type(element).__name__}")


def to_bytes_array(values: Iterable[Any], shape: Sequence[int]) -> np.ndarray:
    """An object array of `shape` holding each value as bytes (`as_bytes`)."""
    flat = [as_bytes(v) for v in values]
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array.reshape(tuple(shape))


def serialize(array: np.ndarray) -> bytes:
    """The binary form: each element, row-major, as a 4-byte little-endian length and
    its bytes."""
    pack = _LENGTH.pack
    parts = []
    for element in array.ravel(order="C"):
        data = as_bytes(element)
        parts.append(pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def serialized_size(array: np.ndarray) -> int:
    """Bytes `serialize(array)` takes, without building it."""
    return sum(_LENGTH.size + len(as_bytes(e)) for e in array.ravel())


def deserialize(buffer: bytes | memoryview, count: int, where: str) -> np.ndarray:
    """`count` elements read from the whole of `buffer` (the binary form), as a 1-D
    object array of bytes; raises InvalidRequest when the buffer holds other than
    exactly `count` length-prefixed elements."""
    view = memoryview(buffer)
    size, offset = len(view), 0
    elements: list[bytes] = []
    for index in range(count):
        if offset + _LENGTH.size > size:
            raise InvalidRequest(
                f"{where}: BYTES data ends after {index} of {count} elements (each element "
                "is a 4-byte little-endian length and that many bytes)"
            )
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        if offset + length > size:
            raise InvalidRequest(
                f"{where}: BYTES element {index} declares {length} bytes; only "
                f"{size - offset} are left"
            )
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != size:
        raise InvalidRequest(
            f"{where}: {size - offset} bytes follow the {count} BYTES elements the shape declares"
        )
    array = np.empty(count, dtype=object)
    array[:] = elements
    return array


def check_text(array: np.ndarray, where: str) -> np.ndarray:
    """`array` when every element is UTF-8 text; else InvalidRequest naming the first
    element that is not."""
    for index, element in enumerate(array.ravel()):
        try:
            element.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidRequest(
                f"{where}: BYTES element {index} is not UTF-8 text ({error.reason} at byte "
                f"{error.start}); string inputs are UTF-8"
            ) from None
    return array


def from_json(values: Sequence[Any], datatype: str, where: str) -> np.ndarray:
    """JSON strings (already flattened) as a 1-D object array of their UTF-8 bytes;
    anything but a string is refused."""
    for value in values:
        if type(value) is not str:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
            raise InvalidRequest(f"{where}: {datatype} data takes strings only; it holds {shown}")
    array = np.empty(len(values), dtype=object)
    try:
        array[:] = [value.encode("utf-8") for value in values]
    except UnicodeEncodeError as error:  # a lone surrogate, which JSON can spell
        raise InvalidRequest(f"{where}: a string is not valid Unicode: {error}") from None
    return array


def to_json(array: np.ndarray, where: str) -> list[str]:
    """The elements, row-major, as JSON strings (their UTF-8 text); raises
    InvalidRequest for an element that is not UTF-8, which only the binary form carries."""
    try:
        return [as_bytes(e).decode("utf-8") for e in array.ravel()]
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"{where} holds bytes that are not UTF-8 text, which JSON cannot carry; ask for "
            "it in binary (the output's binary_data parameter)"
        ) from None


def to_raw(array: np.ndarray) -> bytes:
    """A tensor's binary form: `serialize` for BYTES, else its elements as little-endian
    bytes in row-major order."""
    if is_bytes_array(array):
        return serialize(array)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
