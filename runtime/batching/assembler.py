"""How a batch is made: check a request against the model's inputs, pack requests into an
execution slot's preallocated input views, check that the outputs hold the batch's rows
(`check_output_rows`), and split them back per request.

Pure (numpy only, no asyncio, no engine import): `pack` writes into views the caller
passes in and `split` copies rows out of output views that the slot will overwrite on
its next run, so the only allocations on the hot path are the per-request result arrays
the response needs anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from kubeinfer.runtime.engines.base import TensorSpec
from kubeinfer.runtime.protocol.errors import InvalidRequest, OutputRowsMismatch


def check_inputs(
    specs: Sequence[TensorSpec], inputs: Mapping[str, tuple[str, np.ndarray]], max_rows: int
) -> int:
    """Validates one request's inputs (name -> (datatype, array)) against the model and
    returns its rows (its batch dimension); raises InvalidRequest naming the problem."""
    expected = {spec.name for spec in specs}
    unknown = sorted(set(inputs) - expected)
    if unknown:
        raise InvalidRequest(
            f"unknown input {unknown[0]!r}; the model's inputs are {sorted(expected)}"
        )
    rows = None
    for spec in specs:
        if spec.name not in inputs:
            raise InvalidRequest(f"missing input {spec.name!r}")
        datatype, array = inputs[spec.name]
        if datatype != spec.datatype:
            raise InvalidRequest(
                f"input {spec.name!r} has datatype {datatype}, the model expects {spec.datatype}"
            )
        item_shape = spec.item_shape
        if array.ndim != len(spec.shape) or any(
            want >= 0 and got != want for got, want in zip(array.shape[1:], item_shape, strict=True)
        ):
            expected_shape = ["batch", *(d if d >= 0 else "any" for d in item_shape)]
            raise InvalidRequest(
                f"input {spec.name!r} has shape {list(array.shape)}, "
                f"the model expects {expected_shape}"
            )
        if rows is None:
            rows = array.shape[0]
        elif array.shape[0] != rows:
            raise InvalidRequest(
                f"input {spec.name!r} has {array.shape[0]} rows, other inputs have {rows}"
            )
    assert rows is not None
    if not 1 <= rows <= max_rows:
        raise InvalidRequest(
            f"a request carries {rows} rows along the batch dimension; "
            f"this model accepts 1 to {max_rows}"
        )
    return int(rows)


def pack(
    requests: Sequence[Mapping[str, np.ndarray]], views: Mapping[str, np.ndarray]
) -> list[slice]:
    """Copies each request's inputs, one after the other along dim 0, into the slot's input
    views (already cut to the batch's total rows); returns each request's row range."""
    ranges, start = [], 0
    for request in requests:
        stop = start
        for name, view in views.items():
            array = request[name]
            stop = start + array.shape[0]
            view[start:stop] = array
        ranges.append(slice(start, stop))
        start = stop
    return ranges


def pack_padded(
    requests: Sequence[Mapping[str, np.ndarray]],
    views: Mapping[str, np.ndarray],
    pad_values: Mapping[str, float],
) -> list[slice]:
    """`pack` for a batch whose views may be larger than a request along its variable axes
    (`shapes`' padding): each request's block is filled with its input's pad value, then
    the request is copied into the block's leading corner."""
    ranges, start = [], 0
    for request in requests:
        stop = start
        for name, view in views.items():
            array = request[name]
            stop = start + array.shape[0]
            block = view[start:stop]
            if array.shape == block.shape:
                block[...] = array
            else:
                block.fill(pad_values[name])
                block[tuple(slice(0, d) for d in array.shape)] = array
        ranges.append(slice(start, stop))
        start = stop
    return ranges


def check_output_rows(model: str, outputs: Mapping[str, np.ndarray], rows: int) -> None:
    """Raises `OutputRowsMismatch` unless every output's first axis holds `rows` rows, the
    rows the batch ran (for a model served one request per run, the rows one request
    sent): checked before `split` hands any row out."""
    for name, array in outputs.items():
        output_rows = int(array.shape[0]) if array.ndim else 0
        if output_rows != rows:
            raise OutputRowsMismatch(model, name, rows, output_rows)


Cut = tuple[tuple[str, tuple[slice, ...]], ...]
"""Per output to cut back: its name and the index of one request's own extents past the
rows (`shapes.RequestShape.cut`)."""


def split(
    outputs: Mapping[str, np.ndarray],
    ranges: Sequence[slice],
    cuts: Sequence[Cut] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Each request's rows of every output, copied out (the slot reuses its buffers); with
    `cuts`, each request's outputs cut back to its own extents along padded axes."""
    if cuts is None:
        return [{name: array[rows].copy() for name, array in outputs.items()} for rows in ranges]
    answers = []
    for rows, cut in zip(ranges, cuts, strict=True):
        answer = {name: array[rows].copy() for name, array in outputs.items() if not cut}
        if cut:
            index = dict(cut)
            for name, array in outputs.items():
                part = array[rows]
                answer[name] = (part[index[name]] if name in index else part).copy()
        answers.append(answer)
    return answers
