"""JSON tensor data to numpy, strictly, and the bound on what a JSON body may make us build.

Why not `np.asarray(data, dtype)`: it reads `null` as NaN, `"1.5"` and `true` as numbers,
and truncates `1.7` in an INT32 tensor to 1, so a client's mistake became a silently
wrong answer. Here a numeric tensor takes numbers only (an integer tensor integers only,
a BOOL tensor booleans only) and everything else is a 400 naming the first offending
value. The data may be flat (row-major) or nested to match the shape, as the Open
Inference Protocol allows; nesting is checked level by level before any conversion.

Bounded work per byte: parsing JSON makes a Python object per value (a list is ~60 bytes,
a number ~30), so a body of empty lists grows ~20x in memory before anything could compare
it with the model. `json_value_count` counts the values a body can hold (its commas and
opening brackets, in C, without parsing) and the data plane refuses a body holding more
than the model's inputs can take (`model_json_value_limit`) before it is parsed.

Conversions of large tensors go in chunks of `_CHUNK` elements: each numpy call holds the
GIL for about a millisecond, so the event loop (and a liveness probe) gets its turn
between them when decoding runs on a worker thread.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from kubeinfer.runtime.protocol.errors import InvalidRequest

MAX_RANK = 64
"""numpy's own limit; a model never has more dimensions."""

_CHUNK = 1 << 16
_FAST_FROM = 4096
_FLOAT_KINDS = frozenset((int, float))
_INT_KINDS = frozenset((int,))
_BOOL_KINDS = frozenset((bool,))
_HEADER_VALUES = 4096
"""Values a request holds besides its tensors' data: shapes, names, parameters, outputs."""

_WHAT = {
    type(None): "null",
    bool: "a boolean",
    str: "a string",
    float: "a number with a fraction or an exponent",
    int: "an integer",
    list: "a list",
    dict: "an object",
}


def allowed_kinds(dtype: np.dtype) -> frozenset[type]:
    if dtype.kind == "b":
        return _BOOL_KINDS
    if dtype.kind in "iu":
        return _INT_KINDS
    return _FLOAT_KINDS


def _what_datatype_takes(dtype: np.dtype) -> str:
    if dtype.kind == "b":
        return "booleans"
    if dtype.kind in "iu":
        return "integers"
    return "numbers"


def leaves(data: list[Any], shape: Sequence[int], count: int, where: str) -> list[Any]:
    """The values of `data` in row-major order: `data` itself when flat, else its nested
    lists flattened after checking each level's length against the shape."""
    nested = len(shape) >= 2 and bool(data) and type(data[0]) is list
    if not nested:
        if len(data) != count:
            raise InvalidRequest(
                f"{where}: data has {len(data)} elements, shape {list(shape)} needs {count}"
            )
        return data
    level: list[Any] = data
    if len(level) != shape[0]:
        raise InvalidRequest(
            f"{where}: nested data has {len(level)} rows, shape {list(shape)} needs {shape[0]}"
        )
    for depth, dim in enumerate(shape[1:], start=1):
        if not all(type(item) is list and len(item) == dim for item in level):
            raise InvalidRequest(
                f"{where}: nested data does not match shape {list(shape)} at depth {depth} "
                f"(every item there must be a list of {dim})"
            )
        level = list(itertools.chain.from_iterable(level))
    return level


def to_numpy(
    data: list[Any],
    shape: Sequence[int],
    count: int,
    dtype: np.dtype,
    datatype: str,
    where: str,
    *,
    allow_null: bool = False,
) -> np.ndarray:
    """`data` (flat or nested) as an array of `shape` and `dtype`; raises InvalidRequest
    for a value the datatype does not take. `allow_null` reads null as NaN in a float
    tensor (for responses: our own encoder writes NaN and infinities as null)."""
    values = leaves(data, shape, count, where)
    allowed = allowed_kinds(dtype)
    if allow_null and dtype.kind == "f":
        allowed = allowed | {type(None)}
        values = [math.nan if v is None else v for v in values]
    if len(values) <= _CHUNK:
        array = _convert(values, dtype, allowed, datatype, where)
    else:  # in chunks: each numpy call holds the GIL for about a millisecond
        array = np.empty(len(values), dtype=dtype)
        for start in range(0, len(values), _CHUNK):
            chunk = values[start : start + _CHUNK]
            array[start : start + _CHUNK] = _convert(chunk, dtype, allowed, datatype, where)
    if dtype.itemsize < 8 and dtype.kind == "f" and not allow_null and not _finite(array):
        raise InvalidRequest(f"{where}: data holds a value out of {datatype}'s range")
    return array


def _finite(array: np.ndarray) -> bool:
    """No inf or NaN (what an FP16 or FP32 value out of range became)."""
    return bool(np.isfinite(array).all())


def _convert(
    values: list[Any], dtype: np.dtype, allowed: frozenset[type], datatype: str, where: str
) -> np.ndarray:
    """`values` as a 1-D array of `dtype`: numpy's own reading when it proves every value
    is of an allowed kind (`_read_fast`), else value by value with the precise error.
    Under `_FAST_FROM` values, checking each one costs less than the fast path's fixed
    cost (a few numpy calls of ~1 us each)."""
    if len(values) >= _FAST_FROM:
        fast = _read_fast(values, dtype)
        if fast is not None:
            return fast
    kinds = set(map(type, values))
    if not kinds <= allowed:
        bad = next(v for v in values if type(v) not in allowed)
        what = _WHAT.get(type(bad), type(bad).__name__)
        shown = repr(bad) if len(repr(bad)) <= 40 else repr(bad)[:40] + "..."
        raise InvalidRequest(
            f"{where}: {datatype} data takes {_what_datatype_takes(dtype)} only; "
            f"it holds {what} ({shown})"
        )
    try:
        with np.errstate(over="ignore"):  # out of range reads as inf: refused by the caller
            return np.array(values, dtype=dtype)
    except (OverflowError, ValueError, TypeError) as error:
        raise InvalidRequest(f"{where}: data is not a valid {datatype} tensor: {error}") from None


def _read_fast(values: list[Any], dtype: np.dtype) -> np.ndarray | None:
    """`values` read by numpy without a dtype, when that proves them right: floats or
    integers for a float tensor, integers in range for an integer one, booleans for a
    BOOL one. numpy reads null and strings as object or text arrays (refused here), but a
    boolean among numbers as 0 or 1, so the few values equal to 0 or 1 are looked at one
    by one. None: not proven (the caller checks value by value, for the precise error).
    About twice as fast as checking every value's type in Python."""
    try:
        inferred = np.array(values)
    except (ValueError, OverflowError):  # ragged, or an integer past 64 bits
        return None
    kind = inferred.dtype.kind
    if dtype.kind == "b":
        return inferred if kind == "b" else None
    if kind not in ("iu" if dtype.kind in "iu" else "fiu") or inferred.ndim != 1:
        return None
    candidates = np.flatnonzero((inferred == 0) | (inferred == 1))
    if any(type(values[i]) is bool for i in candidates):
        return None
    if dtype.kind in "iu" and len(inferred):
        info = np.iinfo(dtype)
        if int(inferred.min()) < info.min or int(inferred.max()) > info.max:
            return None
    with np.errstate(over="ignore"):  # out of range reads as inf: refused by the caller
        return inferred.astype(dtype, copy=False)


def json_value_count(document: bytes | bytearray) -> int:
    """An upper bound on the JSON values (numbers, lists, objects, ...) `document` holds,
    from its commas and opening brackets: counted in C, nothing parsed. Separators inside
    strings count too, which only makes the bound larger."""
    return document.count(b",") + document.count(b"[") + document.count(b"{") + 1


def model_json_value_limit(item_shapes: Sequence[Sequence[int]], max_rows: int) -> int | None:
    """The most JSON values a valid request to a model with these inputs (item shapes, the
    batch dimension left out) can hold, at `max_rows` rows: every element, every list of
    the nested form, and room for the rest of the request. None when an item dimension is
    dynamic (-1): then only the body size limit bounds a body."""
    total = _HEADER_VALUES
    for item in item_shapes:
        if any(d < 0 for d in item):
            return None
        lists, rows = 1, max_rows
        for dim in item:
            lists += rows
            rows *= dim
        total += rows + lists
    return total
