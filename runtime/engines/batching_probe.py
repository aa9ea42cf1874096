"""Whether a model batches, found out at load by trying it: `probe_batching(engine)`.

Serving stacks several requests' rows along the first axis and hands each request its
rows of every output. That is right only for a model whose answer to rows run together is
its answers to each row run alone, stacked. A graph's declared shapes do not say so: a
tokenizer in the graph (onnxruntime-extensions' `BertTokenizer`) declares `text: [None]`
and `logits: [batch, 2]`, yet reads two texts as one sentence pair and gives one row. So
the probe runs the model through one of its own execution slots, as serving runs it: row
A alone, row B alone, then A and B together, and compares (`compare_trial`, pure). A model
whose two-row answer is not its one-row answers stacked is served one request per run
(`effective_max_batch_size`).

Trial rows (`trial_rows`): two rows that differ and that any model of the input's
datatype should take. Integers stay in {0, 1}: token ids, attention masks, token type ids
and indices into any axis of two or more are all valid there (a type vocabulary of two
makes a larger id an out-of-range gather). Row A is all ones, row B alternates 1 and 0 (a
single element: 0). Booleans likewise. Floats are two smooth patterns of magnitude below
one. Strings are two English texts of different lengths. Variable axes take the
configured `optShape` (the extents a model is tuned for, consistent between inputs whose
axes are related, as a TensorRT profile needs), else `TRIAL_EXTENT` within the input's
range, one extent per axis name so inputs sharing an axis agree.

Tolerance (`tolerance`): rows run in a batch of two go through other kernels than a
batch of one (MLAS picks GEMM tiles by the row count; a reduction may sum in another
order), so float outputs differ in their last bits, and more after many layers. A model
that mixes rows differs at the scale of its values. Floats therefore compare within
`FLOAT32_RTOL` (fp16: `FLOAT16_RTOL`) of the output's largest magnitude; integers, booleans
and strings compare exactly.

What the probe cannot do is reported, never raised: a one-row trial run that fails (the
model wants values no generic row has) leaves whether it batches unknown, and the model is
served one request per run, the reason in the log and `/v2/batching`; an engine loaded for
one row (maxBatchSize 1) runs one request per run anyway and is not probed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from kubeinfer.contract.runtime_config import InputShape, RuntimeConfig
from kubeinfer.runtime.engines.base import BatchShape, Engine, ExecutionSlot, TensorSpec

TRIAL_EXTENT = 8
"""A variable axis' extent in the trial where no optShape is configured: long enough that
positions differ, short enough to cost nothing."""
TRIAL_TEXTS = (b"the quick brown fox jumps over the lazy dog", b"hello world")
FLOAT32_RTOL = 1e-3
"""Of the output's largest magnitude: far above float32's rounding between batch sizes
(a few units of its 1e-7 resolution per layer), far below what mixing rows does (of the
order of the values themselves)."""
FLOAT16_RTOL = 1e-2
"""fp16 keeps 11 bits: its rounding between batch sizes is about 1e-3 of the scale."""
log = logging.getLogger(__name__)

REASON_LIMIT = 1000
"""Characters of an engine's error kept in a reason (it goes into the log, /v2/batching,
the engine manifest and a status condition)."""


@dataclass(frozen=True)
class BatchingProbe:
    """What the probe found: `batches` True (rows run together are answered as alone),
    False (they are not: `reason` says how), or None (not found out: `reason` says why)."""

    batches: bool | None
    reason: str = ""

    @property
    def one_request_per_run(self) -> bool:
        """Serve one request per run: the model does not batch, or it is not known to."""
        return self.batches is not True

    def to_wire(self) -> dict[str, object]:
        """camelCase JSON (`/v2/batching`, the engine manifest)."""
        return {"batches": self.batches, "reason": self.reason}


def effective_max_batch_size(probe: BatchingProbe, configured: int) -> int:
    """The batcher's maxBatchSize: the configured one for a model that batches, else 1."""
    return configured if probe.batches is True else 1


def with_batching_found(config: RuntimeConfig, probe: BatchingProbe) -> RuntimeConfig:
    """`config` with the maxBatchSize in effect for what the probe found: the configured
    one for a model that batches; 1 otherwise (and no preferred batch size above it)."""
    configured = config.batching.max_batch_size
    effective = effective_max_batch_size(probe, configured)
    if effective == configured:
        return config
    batching = config.batching.model_copy(
        update={"max_batch_size": effective, "preferred_batch_sizes": []}
    )
    return config.model_copy(update={"batching": batching})


def say_batching_found(config: RuntimeConfig, probe: BatchingProbe, effective: int) -> None:
    """Logs what the probe found and the maxBatchSize served (`config`: as configured)."""
    if probe.batches is True:
        log.info("Found the model batches model=%s max_batch_size=%d",
                 config.model_name, effective)  # fmt: skip
        return
    configured = config.batching.max_batch_size
    if configured == 1:  # asked for: nothing is set aside
        log.info("Serving one request per run model=%s max_batch_size=1 (%s)",
                 config.model_name, probe.reason)  # fmt: skip
        return
    finding = "does not batch" if probe.batches is False else "is not known to batch"
    set_aside = f"; maxBatchSize {configured} set aside" if configured > effective else ""
    log.warning(
        "Serving one request per run: the model %s (%s) model=%s max_batch_size=%d%s",
        finding, probe.reason, config.model_name, effective, set_aside,
    )  # fmt: skip


def tolerance(dtype: np.dtype) -> float | None:
    """The relative tolerance of an output's comparison (of its largest magnitude); None:
    compared exactly (integers, booleans, strings)."""
    if dtype.kind != "f":
        return None
    return FLOAT16_RTOL if dtype.itemsize <= 2 else FLOAT32_RTOL


def trial_rows(spec: TensorSpec, item_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Rows A and B of one input, each of shape (1, *item_shape): different, and valid for
    any model of the input's datatype (see the module)."""
    size = math.prod(item_shape)
    shape = (1, *item_shape)
    dtype = spec.dtype
    if dtype.kind == "O":
        first, second = (np.full(shape, text, dtype=object) for text in TRIAL_TEXTS)
        return first, second
    positions = np.arange(size, dtype=np.float64)
    if dtype.kind == "f":
        first = 0.5 + 0.25 * np.sin(positions + 1.0)
        second = -0.5 + 0.25 * np.cos(positions * 0.7)
    else:  # integers and booleans: {0, 1}
        first = np.ones(size)
        second = (positions % 2 == 0).astype(np.float64) if size > 1 else np.zeros(size)
    return first.astype(dtype).reshape(shape), second.astype(dtype).reshape(shape)


def trial_item_shapes(
    inputs: Sequence[TensorSpec], configured: Sequence[InputShape] = ()
) -> tuple[tuple[int, ...], ...]:
    """Each input's item shape in the trial: its own where fixed; a variable axis takes
    the configured optShape, else `TRIAL_EXTENT` within the input's range, shared by name."""
    opt = {shape.name: tuple(shape.opt_shape) for shape in configured}
    by_name: dict[str, int] = {}
    shapes = []
    for spec in inputs:
        if not spec.variable:
            shapes.append(spec.item_shape)
            continue
        if spec.name in opt and len(opt[spec.name]) == len(spec.item_shape):
            shapes.append(opt[spec.name])
            continue
        names = spec.axis_names or (None,) * len(spec.item_shape)
        item = []
        for axis, extent in enumerate(spec.item_shape):
            if extent >= 0:
                item.append(extent)
                continue
            name = names[axis]
            chosen = by_name.get(name, TRIAL_EXTENT) if name else TRIAL_EXTENT
            low = spec.min_item_shape[axis] if spec.min_item_shape else 1
            high = spec.max_item_shape[axis] if spec.max_item_shape else chosen
            chosen = max(low, min(chosen, high))
            if name:
                by_name.setdefault(name, chosen)
            item.append(chosen)
        shapes.append(tuple(item))
    return tuple(shapes)


Outputs = Mapping[str, np.ndarray]


def compare_trial(
    outputs: Sequence[TensorSpec], alone: Sequence[Outputs], together: Outputs
) -> BatchingProbe:
    """Whether `together` (the outputs of the rows run in one batch) is `alone` (the
    outputs of each row run by itself, one row each) stacked, output by output."""
    for index, answer in enumerate(alone):
        for spec in outputs:
            rows = _rows(answer[spec.name])
            if rows != 1:
                return BatchingProbe(
                    False,
                    f"output {spec.name!r} has {rows} rows for a run of one row (row "
                    f"{'AB'[index]}): it does not follow the batch",
                )
    count = len(alone)
    for spec in outputs:
        array = np.asarray(together[spec.name])
        rows = _rows(array)
        if rows != count:
            return BatchingProbe(
                False, f"output {spec.name!r} has {rows} rows for a run of {count} different rows"
            )
        expected = np.concatenate([np.asarray(a[spec.name]) for a in alone])
        difference = _difference(spec, array, expected)
        if difference is not None:
            return BatchingProbe(
                False,
                f"output {spec.name!r} of {count} different rows run together is not their "
                f"outputs run alone ({difference})",
            )
    return BatchingProbe(True)


def _rows(array: np.ndarray) -> int:
    return int(array.shape[0]) if np.ndim(array) else 0


def _difference(spec: TensorSpec, got: np.ndarray, expected: np.ndarray) -> str | None:
    """How `got` differs from `expected` (None: it does not, within the tolerance)."""
    if got.shape != expected.shape:
        return f"shape {list(got.shape)}, alone {list(expected.shape)}"
    rtol = tolerance(spec.dtype)
    if rtol is None:
        return None if np.array_equal(got, expected) else "different values"
    got64, expected64 = got.astype(np.float64), expected.astype(np.float64)
    finite = np.isfinite(got64) & np.isfinite(expected64)
    same_kind = np.array_equal(np.isnan(got64), np.isnan(expected64)) and np.array_equal(
        got64[~finite & ~np.isnan(got64)], expected64[~finite & ~np.isnan(expected64)]
    )
    if not same_kind:
        return "NaN or infinity where the other has a number"
    if not finite.any():
        return None
    largest = max(float(np.abs(got64[finite]).max()), float(np.abs(expected64[finite]).max()))
    scale = max(largest, float(np.finfo(spec.dtype).tiny))
    worst = float(np.abs(got64[finite] - expected64[finite]).max())
    if worst <= rtol * scale:
        return None
    return f"largest difference {worst:.3g}, tolerance {rtol * scale:.3g}"


def probe_batching(engine: Engine, input_shapes: Sequence[InputShape] | None = ()) -> BatchingProbe:
    """Runs rows A and B alone and together on a slot of `engine` and compares them
    (`compare_trial`); never raises for what the model does (see the module)."""
    if engine.max_batch_size < 2:
        return BatchingProbe(None, "not probed: maxBatchSize 1 runs one request per run already")
    item_shapes = trial_item_shapes(engine.inputs, input_shapes or ())
    rows = [trial_rows(spec, item) for spec, item in zip(engine.inputs, item_shapes, strict=True)]
    shaped = any(spec.variable for spec in engine.inputs)
    shape: BatchShape | None = item_shapes if shaped else None
    first = {spec.name: pair[0] for spec, pair in zip(engine.inputs, rows, strict=True)}
    second = {spec.name: pair[1] for spec, pair in zip(engine.inputs, rows, strict=True)}
    both = {name: np.concatenate([first[name], second[name]]) for name in first}
    try:
        slot = engine.create_slot()
    except Exception as error:  # serving will meet (and report) it when it makes its slots
        return BatchingProbe(None, f"no slot could be made for a trial run: {_said(error)}")
    try:
        try:
            alone = [_run(slot, feed, 1, shape) for feed in (first, second)]
        except Exception as error:  # any backend's own exception types
            return BatchingProbe(
                None, f"a trial run of one row failed, so it is not known: {_said(error)}"
            )
        try:
            together = _run(slot, both, 2, shape)
        except Exception as error:
            return BatchingProbe(False, f"a trial run of two different rows failed: {_said(error)}")
    finally:
        slot.close()
    return compare_trial(engine.outputs, alone, together)


def _run(
    slot: ExecutionSlot, feed: Mapping[str, np.ndarray], rows: int, shape: BatchShape | None
) -> dict[str, np.ndarray]:
    """One run of `feed` on `slot`; the outputs copied (the slot reuses its buffers)."""
    for name, view in slot.input_views(rows, shape).items():
        view[...] = feed[name]
    outputs = slot.run(rows, shape)
    return {name: np.array(array, copy=True) for name, array in outputs.items()}


def _said(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 3] + "..."
