"""The known-answer file's format: one NumPy `.npz` archive beside the engine.

Arrays, each of shape `[probes, ...]`, named after the tensor:

    inputs/<input name>       the probes' inputs, one array per model input
    expected/<output name>    the expected outputs (the fp32 reference's), one per output

A string (BYTES) tensor is stored without pickling, losslessly: its elements' bytes
concatenated as one uint8 array under the tensor's own name, and their lengths, in the
tensor's shape, under `lengths/<inputs|expected>/<name>`. The build writes the arrays
with `building.calibration.write_samples` (byte for byte reproducible); serving reads
the file once, checking the sha256 of the very bytes it parses against the manifest's.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FILE_NAME = "known_answers.npz"
INPUTS, EXPECTED, LENGTHS = "inputs", "expected", "lengths"

Samples = dict[str, np.ndarray]


class ProbeFileError(ValueError):
    """The known-answer file is missing, altered or not in this format."""


@dataclass(frozen=True)
class Probes:
    """The probes' inputs and their expected outputs, by tensor name."""

    inputs: Samples
    expected: Samples

    @property
    def count(self) -> int:
        return int(next(iter(self.inputs.values())).shape[0])


def _encode_one(kind: str, name: str, array: np.ndarray) -> Samples:
    key = f"{kind}/{name}"
    if array.dtype.kind != "O":
        return {key: np.ascontiguousarray(array)}
    items = [item if isinstance(item, bytes) else str(item).encode() for item in array.ravel()]
    lengths = np.array([len(item) for item in items], dtype=np.int64).reshape(array.shape)
    data = np.frombuffer(b"".join(items), dtype=np.uint8)
    return {key: data, f"{LENGTHS}/{key}": lengths}


def encode(probes: Probes) -> Samples:
    """The arrays of the file (see the module) for `probes`."""
    arrays: Samples = {}
    for kind, tensors in ((INPUTS, probes.inputs), (EXPECTED, probes.expected)):
        for name, array in tensors.items():
            arrays.update(_encode_one(kind, name, array))
    return arrays


def _decode_one(arrays: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    lengths = arrays.get(f"{LENGTHS}/{key}")
    if lengths is None:
        return arrays[key]
    data = arrays[key].tobytes()
    ends = np.cumsum(lengths.ravel())
    if ends.size and ends[-1] != len(data):
        raise ProbeFileError(f"{key}: the string lengths do not add up to its bytes")
    starts = ends - lengths.ravel()
    strings = np.empty(ends.size, dtype=object)
    strings[:] = [data[start:end] for start, end in zip(starts, ends, strict=True)]
    return strings.reshape(lengths.shape)


def decode(arrays: Mapping[str, np.ndarray]) -> Probes:
    """The probes held by the file's `arrays`."""
    tensors: dict[str, Samples] = {INPUTS: {}, EXPECTED: {}}
    for key in arrays:
        kind, _, name = key.partition("/")
        if kind in tensors and name:
            tensors[kind][name] = _decode_one(arrays, key)
        elif kind != LENGTHS:
            raise ProbeFileError(f"unexpected array {key!r} in a known-answer file")
    if not tensors[INPUTS] or not tensors[EXPECTED]:
        raise ProbeFileError("a known-answer file needs inputs and expected outputs")
    counts = {a.shape[0] if a.ndim else -1 for t in tensors.values() for a in t.values()}
    if len(counts) != 1 or 0 in counts or -1 in counts:
        raise ProbeFileError(f"every array needs the same number of probes, found {counts}")
    return Probes(tensors[INPUTS], tensors[EXPECTED])


def read(path: Path, sha256: str) -> Probes:
    """The probes in the file at `path`, whose bytes must have this `sha256` (hex)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ProbeFileError(f"cannot read the known-answer file {path}: {error}") from error
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise ProbeFileError(
            f"{path} has sha256 {actual} but its manifest records {sha256}: the known-answer "
            "file is corrupt or was modified"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise ProbeFileError(f"{path} is not a readable .npz file: {error}") from error
    return decode(arrays)
