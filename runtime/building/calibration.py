"""Calibration and validation samples: the `.npz` format, its checks, and demo data.

Format of a calibration (or validation) file: a NumPy `.npz` archive holding exactly one
array per model input, named after the input, each of shape `[samples, ...]` where `...`
is the input's shape without its batch dimension; every array has the same number of
samples, and a dtype the input's dtype can hold (float64 data for a float32 input is
cast; int data for a float input is refused). For the demo MLPs (one input `input` of
shape `[batch, 512]`) 256 samples are an array `input` of shape `[256, 512]`:

    numpy.savez("calibration.npz", input=samples)

For int8 the file is split: the first 80% of samples calibrate the quantiser, the last
20% (at least one) are held out to measure the engine's accuracy against fp32, so the
report is never measured on the data the ranges were fitted to. A separate validation
file replaces the held-out samples in the report (`--validation`); the split stays the
same, so the engine depends only on the calibration file (the cache key has its sha256).

`write_samples` writes `.npz` files byte for byte reproducibly (`numpy.savez` stamps the
current time into the archive, which would change the calibration's sha256 and so the
engine's digest at every run); `write_demo_samples` makes deterministic data for a model.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from kubeinfer.runtime.engine_manifest import TensorInfo
from kubeinfer.runtime.engines.base import NUMPY_TO_V2, V2_TO_NUMPY
from kubeinfer.runtime.engines.onnx_text import non_tensor_message

HOLDOUT_FRACTION = 0.2
SYNTHETIC_SAMPLES = 32
SYNTHETIC_WORDS = np.array(["alpha", "beta gamma", "delta", "the quick brown fox", ""])
Samples = dict[str, np.ndarray]


class CalibrationDataError(ValueError):
    """The calibration or validation data does not fit the model."""


def _type_text(value_type: onnx.TypeProto) -> str:
    """A type as ONNX Runtime writes it: `tensor(float)`, `seq(map(int64,tensor(float)))`."""
    which = value_type.WhichOneof("value")
    if which == "tensor_type":
        name = onnx.TensorProto.DataType.Name(value_type.tensor_type.elem_type).lower()
        return f"tensor({name})"
    if which == "sequence_type":
        return f"seq({_type_text(value_type.sequence_type.elem_type)})"
    if which == "map_type":
        key = onnx.TensorProto.DataType.Name(value_type.map_type.key_type).lower()
        return f"map({key},{_type_text(value_type.map_type.value_type)})"
    return str(which)


def _tensor_info(value: onnx.ValueInfoProto, kind: str) -> TensorInfo:
    if value.type.WhichOneof("value") != "tensor_type":
        text = _type_text(value.type)
        raise CalibrationDataError(
            non_tensor_message(kind, value.name, text)
            or f"{kind} {value.name!r} has type {text}, which is not a tensor"
        )
    tensor = value.type.tensor_type
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    datatype = NUMPY_TO_V2.get(dtype)
    if datatype is None:
        raise CalibrationDataError(f"tensor {value.name!r} has unsupported dtype {dtype}")
    shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    return TensorInfo(name=value.name, datatype=datatype, shape=shape)


def describe_model(model: onnx.ModelProto) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The model's graph inputs (initializers excluded) and outputs."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [_tensor_info(v, "input") for v in model.graph.input if v.name not in initializers]
    return inputs, [_tensor_info(v, "output") for v in model.graph.output]


def check_samples(arrays: Mapping[str, np.ndarray], inputs: list[TensorInfo], what: str) -> Samples:
    """The arrays cast to the inputs' dtypes, or a `CalibrationDataError` that says what is
    wrong in terms of the format above."""
    expected = {i.name for i in inputs}
    if set(arrays) != expected:
        raise CalibrationDataError(
            f"{what} must hold one array per model input {sorted(expected)}, found {sorted(arrays)}"
        )
    samples: Samples = {}
    counts = set()
    for spec in inputs:
        array = np.asarray(arrays[spec.name])
        dtype = V2_TO_NUMPY[spec.datatype]
        item_shape = spec.shape[1:]
        shape_ok = array.ndim == len(spec.shape) and all(
            want in (-1, got) for want, got in zip(item_shape, array.shape[1:], strict=True)
        )
        if not shape_ok:
            wanted = ", ".join("?" if d == -1 else str(d) for d in item_shape)
            raise CalibrationDataError(
                f"{what}: array {spec.name!r} has shape {list(array.shape)}; "
                f"expected [samples, {wanted}]"
            )
        if not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise CalibrationDataError(
                f"{what}: array {spec.name!r} has dtype {array.dtype}; the input is {dtype}"
            )
        samples[spec.name] = np.ascontiguousarray(array, dtype=dtype)
        counts.add(array.shape[0])
    if len(counts) != 1 or 0 in counts:
        raise CalibrationDataError(
            f"{what}: every array needs the same, non-zero number of samples, found {counts}"
        )
    return samples


def load_samples(path: Path, inputs: list[TensorInfo], what: str) -> Samples:
    """Reads and checks an `.npz` file of samples. A `.npy` file (`numpy.save`: one bare
    array, no input names) is refused with the call that writes the right format."""
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise CalibrationDataError(f"{what} {path} is not a readable .npz file: {error}") from error
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        names = ", ".join(f"{i.name}=samples" for i in inputs)
        raise CalibrationDataError(
            f"{what} {path} is a .npy file (one array of shape {list(loaded.shape)}, without "
            f"input names); write an .npz archive with one array per model input instead: "
            f"numpy.savez(path, {names})"
        )
    try:
        with loaded as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise CalibrationDataError(f"{what} {path} is not a readable .npz file: {error}") from error
    return check_samples(arrays, inputs, what)


def sample_count(samples: Samples) -> int:
    return next(iter(samples.values())).shape[0]


def split_holdout(samples: Samples) -> tuple[Samples, Samples]:
    """(calibration, held-out validation): the last 20% (at least one sample) held out."""
    count = sample_count(samples)
    if count < 2:
        raise CalibrationDataError(
            "the calibration file needs at least 2 samples: some calibrate, the rest are "
            "held out to measure accuracy"
        )
    holdout = max(1, round(count * HOLDOUT_FRACTION))
    cut = count - holdout
    return ({k: v[:cut] for k, v in samples.items()}, {k: v[cut:] for k, v in samples.items()})


SYNTHETIC_EXTENT = 8
"""The extent synthetic samples give a named variable axis besides the batch (8 tokens of
a sequence length; a sum such as `past_sequence_length + sequence_length` the sum)."""


def axis_names(model: onnx.ModelProto) -> dict[str, tuple[str | None, ...]]:
    """Each graph input's names for its axes after the batch one (None where unnamed)."""
    return {
        value.name: tuple(d.dim_param or None for d in value.type.tensor_type.shape.dim[1:])
        for value in model.graph.input
    }


def _synthetic_extent(
    spec: TensorInfo, axis: int, names: Mapping[str, tuple[str | None, ...]]
) -> int:
    """A variable axis' extent in synthetic samples: `SYNTHETIC_EXTENT` per term of its
    name, so axes of one name (or a sum of them) agree; an unnamed one has none."""
    from kubeinfer.runtime.engines.dimensions import sum_terms

    given = names.get(spec.name, ())
    name = given[axis] if axis < len(given) else None
    if name is None:
        raise CalibrationDataError(
            f"input {spec.name!r} has an unnamed dynamic non-batch dimension {spec.shape}; "
            "give samples with --calibration or --validation"
        )
    return sum(t if isinstance(t, int) else SYNTHETIC_EXTENT for t in sum_terms(name))


def synthetic_samples(
    inputs: list[TensorInfo],
    count: int,
    seed: int = 0,
    names: Mapping[str, tuple[str | None, ...]] | None = None,
) -> Samples:
    """Seeded inputs (standard normal for floats, 0/1 for integers, short words for
    strings) for models without data; a variable axis besides the batch takes an extent
    from its name (`names`, `axis_names` of the model; `_synthetic_extent`)."""
    rng = np.random.default_rng(seed)
    samples: Samples = {}
    for spec in inputs:
        item_shape = tuple(
            d if d >= 1 else _synthetic_extent(spec, axis, names or {})
            for axis, d in enumerate(spec.shape[1:])
        )
        dtype = V2_TO_NUMPY[spec.datatype]
        shape = (count, *item_shape)
        if dtype.kind == "O":
            words = rng.choice(SYNTHETIC_WORDS, size=shape)
            samples[spec.name] = np.vectorize(str.encode, otypes=[object])(words)
        elif np.issubdtype(dtype, np.floating):
            samples[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:
            samples[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
    return samples


def write_samples(path: Path, samples: Mapping[str, np.ndarray]) -> Path:
    """Writes an `.npz` whose bytes depend only on the arrays (fixed timestamps, sorted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(samples):
            array_bytes = io.BytesIO()
            np.lib.format.write_array(array_bytes, np.ascontiguousarray(samples[name]))
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(info, array_bytes.getvalue())
    path.write_bytes(buffer.getvalue())
    return path


def write_demo_samples(model_path: Path, path: Path, count: int = 256, seed: int = 0) -> Path:
    """Deterministic calibration/validation data for a (demo) model: `count` seeded
    samples for each input, in the format above."""
    inputs, _ = describe_model(onnx.load(str(model_path), load_external_data=False))
    return write_samples(path, synthetic_samples(inputs, count, seed))
