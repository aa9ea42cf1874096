"""The known-answer set a build records beside its engine (`kubeinfer.runtime.known_answers`).

Its probes' inputs, first match wins: a probe set given to the build (`--probe-set`, an
`.npz` in the calibration format); the build's validation samples when they are real
data (the calibration file's held-out tail for int8, the calibration file for fp32 and
fp16, or a `--validation` file), whose reference and engine outputs the accuracy report
already computed; otherwise probes drawn within each input's valid range
(`probe_inputs`). At most `PROBE_COUNT` probes, fewer where their inputs and expected
outputs would take more than `PROBE_BYTES_BUDGET` (a language model's logits over its
vocabulary), at least one.

The expected outputs are the fp32 reference's on the build node; the engine's own answers
to the same probes set each output's tolerance (`comparison.tolerance_for`) with the
engine's precision and its gate. The file is written into the staging directory, so it is
published with the engine, and hashed in the manifest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kubeinfer.runtime.building.accuracy import gated_output_names
from kubeinfer.runtime.building.calibration import Samples, sample_count, write_samples
from kubeinfer.runtime.engine_manifest import KnownAnswerSet, ProbeSource, sha256_file
from kubeinfer.runtime.known_answers import probe_file
from kubeinfer.runtime.known_answers.comparison import tolerance_for

PROBE_COUNT = 16
PROBE_BYTES_BUDGET = 8 * 1024 * 1024

Run = Callable[[Samples], Samples]
"""Runs a model (the reference, or the engine) on samples: outputs by name."""


@dataclass(frozen=True)
class ProbeInputs:
    """Where a build's probes come from: `samples` (None: the first of the validation
    samples, with the outputs the report computed), `source` as the manifest names it, and
    the sha256 of the file they came from."""

    samples: Samples | None
    source: ProbeSource
    source_sha256: str | None = None


@dataclass(frozen=True)
class Gate:
    """The build's accuracy gate, as the tolerances read it."""

    max_top1_drop: float | None
    min_cosine: float | None
    outputs: Sequence[str] | None


def _head(samples: Samples, count: int) -> Samples:
    return {name: array[:count] for name, array in samples.items()}


def _row_bytes(*tensors: Samples) -> int:
    total = 0
    for samples in tensors:
        for array in samples.values():
            row = array[:1]
            strings = row.dtype.kind == "O"
            total += sum(len(str(x)) for x in row.ravel()) if strings else row.nbytes
    return total


def probe_count(inputs: Samples, expected: Samples) -> int:
    """How many of the available probes the set keeps (see the module)."""
    per_probe = max(1, _row_bytes(inputs, expected))
    return max(1, min(PROBE_COUNT, sample_count(inputs), PROBE_BYTES_BUDGET // per_probe))


def answered_probes(
    chosen: ProbeInputs,
    validation: tuple[Samples, Samples, Samples],
    reference: Run,
    engine: Run,
) -> tuple[Samples, Samples, Samples]:
    """The probes' (inputs, expected outputs, the engine's outputs): the validation rows
    as the report ran them, or `chosen.samples` run on the reference and the engine."""
    if chosen.samples is None:
        inputs, expected, built = validation
    else:
        inputs = _head(chosen.samples, PROBE_COUNT)
        expected = reference(inputs)
        built = engine(inputs)
    count = probe_count(inputs, expected)
    return _head(inputs, count), _head(expected, count), _head(built, count)


def record_known_answers(
    directory: Path,
    precision: str,
    gate: Gate,
    chosen: ProbeInputs,
    probes: tuple[Samples, Samples, Samples],
) -> KnownAnswerSet:
    """Writes the set's file into `directory` and returns its manifest entry."""
    inputs, expected, built = probes
    gated = set(gated_output_names(list(expected), gate.outputs))
    tolerances = [
        tolerance_for(
            name,
            precision,
            expected[name],
            np.asarray(built[name]),
            gated=name in gated,
            min_cosine=gate.min_cosine,
            max_top1_drop=gate.max_top1_drop,
        )
        for name in expected
    ]
    path = write_samples(
        directory / probe_file.FILE_NAME,
        probe_file.encode(probe_file.Probes(inputs, expected)),
    )
    return KnownAnswerSet(
        file=path.name,
        sha256=sha256_file(path),
        probes=sample_count(inputs),
        source=chosen.source,
        source_sha256=chosen.source_sha256,
        outputs=tolerances,
    )
