"""FOR TESTS ONLY: faults `kubeinfer serve` injects into itself on purpose, so that tests
can show the known-answer check (`kubeinfer.runtime.known_answers`) catching them.

Nothing here runs unless `--testing-faults` (`KUBEINFER_SERVE_TESTING_FAULTS`) is set, a
setting whose name says what it is for; it is empty by default and nothing renders it.
A process with faults logs a warning saying so at start. The setting is a comma-separated
list:

- `perturb-batches=SHARE` (0 to 1): a stand-in for a GPU's silent data corruption in the
  execution slot: that share of the batches the engine runs answer wrong. Batches are
  numbered engine-wide in the order they start, and batch i is perturbed when a draw
  seeded by (`seed`, i) falls below SHARE, so a run is reproducible.
- `perturb-after-batches=N`: the first N batches run clean (a replica that passes its
  check at start and goes wrong later).
- `perturb-lowest-bit`: a perturbed batch's floats have their lowest mantissa bit flipped
  instead (one unit in the last place; labels, booleans and text unchanged): a stand-in
  for a replica of another runtime version, whose kernels sum in another order, answering
  inside every tolerance but not bit for bit as its peers.
- `seed=N`: the draws' seed (0).
- `damage-engine-after-digest-check`: between the cache's verification of the entry and
  the engine's load, the engine file is changed, its size kept: the largest weight
  tensor's elements have a bit flipped (a file changed on the node after its digest was
  checked). In place where the cache is writable; where it is not (a serving pod mounts
  it read-only), in a copy of the entry in the temporary directory, which is what loads.
  ONNX engines only.

A perturbed batch's outputs are changed in every element, in place, as a fault in the
device's memory or arithmetic would leave them: a float's highest mantissa bit flipped
(the value scaled by 2/3 to 3/2, never made infinite or NaN), an integer's lowest bit (a
label 3 becomes 2), a boolean negated, a string's first byte's lowest bit.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from kubeinfer.runtime.engine_cache import AfterDigestCheck, ResolvedEngine
    from kubeinfer.runtime.engines.base import BatchShape, Engine, ExecutionSlot

log = logging.getLogger(__name__)

MANTISSA_TOP_BIT = {2: 1 << 9, 4: 1 << 22, 8: 1 << 51}
"""The highest mantissa bit of an IEEE float by its size in bytes (fp16, fp32, fp64)."""
UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class InjectedFaults:
    """The faults selected (see the module); the default injects none."""

    perturb_batches: float = 0.0
    perturb_after_batches: int = 0
    seed: int = 0
    perturb_lowest_bit: bool = False
    damage_engine_after_digest_check: bool = False

    @property
    def any(self) -> bool:
        return self.perturb_batches > 0 or self.damage_engine_after_digest_check

    def wrap(self, engine: Engine) -> Engine:
        """`engine`, or a `PerturbingEngine` over it when batches are to be perturbed."""
        if self.perturb_batches <= 0:
            return engine
        return PerturbingEngine(engine, self)

    def after_digest_check(self) -> AfterDigestCheck | None:
        """The cache's hook that damages the engine file, when selected."""
        return damage_engine_file if self.damage_engine_after_digest_check else None


def parse_testing_faults(text: str | None) -> InjectedFaults:
    """The faults `text` selects (None or empty: none); ValueError naming the form."""
    if not text or not text.strip():
        return InjectedFaults()
    form = (
        "perturb-batches=SHARE, perturb-after-batches=N, perturb-lowest-bit, seed=N, "
        "damage-engine-after-digest-check (comma-separated)"
    )
    fields: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        name, equals, value = part.partition("=")
        try:
            if name in ("damage-engine-after-digest-check", "perturb-lowest-bit") and not equals:
                fields[name.replace("-", "_")] = True
            elif name == "perturb-batches" and 0 <= float(value) <= 1:
                fields["perturb_batches"] = float(value)
            elif name in ("perturb-after-batches", "seed") and int(value) >= 0:
                fields[name.replace("-", "_")] = int(value)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"--testing-faults: {part!r} is not one of {form}") from None
    faults = InjectedFaults(**fields)
    log.warning("Injecting faults for tests (never in production): %s", text)
    return faults


def _perturbed(batch: int, faults: InjectedFaults) -> bool:
    if batch < faults.perturb_after_batches:
        return False
    seed = hashlib.sha256(f"{faults.seed}:{batch}".encode()).digest()
    return int.from_bytes(seed[:8], "little") / 2**64 < faults.perturb_batches


def perturb(array: np.ndarray, lowest_bit: bool = False) -> np.ndarray:
    """`array` with every element changed (see the module), or with `lowest_bit` every
    float moved by one unit in the last place and nothing else: in place where it is
    writable, else a changed copy."""
    target = array if array.flags.writeable else array.copy()
    if lowest_bit:
        if target.dtype.kind == "f" and target.dtype.itemsize in UNSIGNED:
            bits = target.view(UNSIGNED[target.dtype.itemsize])
            bits ^= bits.dtype.type(1)
        return target
    if target.dtype.kind == "O":
        for index, item in np.ndenumerate(target):
            text = bytes(item)
            target[index] = bytes([text[0] ^ 1]) + text[1:] if text else b"\x01"
    elif target.dtype.kind == "b":
        np.logical_not(target, out=target)
    elif target.dtype.kind == "f" and target.dtype.itemsize in MANTISSA_TOP_BIT:
        bits = target.view(UNSIGNED[target.dtype.itemsize])
        bits ^= bits.dtype.type(MANTISSA_TOP_BIT[target.dtype.itemsize])
    elif target.dtype.kind in "iu":
        bits = target.view(UNSIGNED[target.dtype.itemsize])
        bits ^= bits.dtype.type(1)
    return target


class PerturbingSlot:
    """An execution slot whose selected batches answer wrong (see the module)."""

    def __init__(self, slot: ExecutionSlot, engine: PerturbingEngine) -> None:
        self._slot, self._engine = slot, engine

    def input_views(
        self, batch_size: int, shape: BatchShape | None = None
    ) -> dict[str, np.ndarray]:
        return self._slot.input_views(batch_size, shape)

    def run(self, batch_size: int, shape: BatchShape | None = None) -> dict[str, np.ndarray]:
        batch = next(self._engine.batches)
        outputs = self._slot.run(batch_size, shape)
        if not _perturbed(batch, self._engine.faults):
            return outputs
        self._engine.perturbed += 1
        lowest = self._engine.faults.perturb_lowest_bit
        return {name: perturb(array, lowest) for name, array in outputs.items()}

    def close(self) -> None:
        self._slot.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._slot, name)


class PerturbingEngine:
    """An engine whose slots perturb the selected batches; everything else is the
    wrapped engine's."""

    def __init__(self, engine: Engine, faults: InjectedFaults) -> None:
        self._engine, self.faults = engine, faults
        self.batches = itertools.count()
        self.perturbed = 0
        """How many batches were perturbed so far."""

    @property
    def inputs(self) -> Any:
        return self._engine.inputs

    @property
    def outputs(self) -> Any:
        return self._engine.outputs

    @property
    def max_batch_size(self) -> int:
        return self._engine.max_batch_size

    @property
    def default_execution_slots(self) -> int:
        return self._engine.default_execution_slots

    def create_slot(self) -> PerturbingSlot:
        return PerturbingSlot(self._engine.create_slot(), self)

    def close(self) -> None:
        self._engine.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


_FLIPS = {"FLOAT": 4, "FLOAT16": 2, "DOUBLE": 8, "INT8": 1, "UINT8": 1}
"""The weight types the damage flips a bit of, by their size in bytes."""


def _largest_weight(model: Any, engine_path: Path) -> tuple[Path, int, int, int] | None:
    """(file, offset, length, element size) of the model's largest weight tensor of a
    type in `_FLIPS`, inline or in an external data file."""
    import onnx

    best, engine_bytes = None, engine_path.read_bytes()
    for tensor in model.graph.initializer:
        size = _FLIPS.get(onnx.TensorProto.DataType.Name(tensor.data_type))
        if size is None:
            continue
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            where = (
                engine_path.parent / entries["location"],
                int(entries.get("offset", 0)),
                int(entries.get("length", 0)),
            )
        elif tensor.raw_data:
            where = (engine_path, engine_bytes.find(tensor.raw_data), len(tensor.raw_data))
        else:
            continue
        if where[1] >= 0 and where[2] >= size and (best is None or where[2] > best[2]):
            best = (*where, size)
    return best


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)  # False on a read-only mount, for root too (EROFS)


def damage_engine_file(
    resolved: ResolvedEngine, writable: Callable[[Path], bool] = _writable
) -> ResolvedEngine | None:
    """Flips a bit of every element of the engine's largest weight tensor, in its file in
    place, or in a copy of the entry when the cache is read-only: then the copy is the
    entry to load (see the module)."""
    import onnx

    if resolved.manifest.key.backend != "onnxruntime":
        raise ValueError("damage-engine-after-digest-check damages ONNX engines only")
    copied = None
    if not writable(resolved.engine_path):
        directory = Path(tempfile.mkdtemp(prefix="kubeinfer-damaged-")) / resolved.directory.name
        shutil.copytree(resolved.directory, directory)
        copied = replace(
            resolved, directory=directory,
            engine_path=directory / resolved.engine_path.relative_to(resolved.directory),
        )  # fmt: skip
        resolved = copied
    model = onnx.load(str(resolved.engine_path), load_external_data=False)
    found = _largest_weight(model, resolved.engine_path)
    if found is None:
        raise ValueError(f"{resolved.engine_path} has no weight tensor to damage")
    path, offset, length, size = found
    with path.open("r+b") as handle:
        handle.seek(offset)
        data = np.frombuffer(handle.read(length - length % size), dtype=UNSIGNED[size]).copy()
        data ^= data.dtype.type(MANTISSA_TOP_BIT.get(size, 1 << 5))  # an int8's bit 5: 32
        handle.seek(offset)
        handle.write(data.tobytes())
    log.warning(
        "Damaged the engine file after its digest check (a test fault) path=%s offset=%d "
        "bytes=%d copy=%s", path, offset, length, copied is not None,
    )  # fmt: skip
    return copied
