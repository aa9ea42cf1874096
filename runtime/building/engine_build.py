"""Build an engine through the cache: `build_engine(...) -> BuildResult`.

The order is chosen so that bad input never touches the cache and a cache hit does no
work: fetch and check everything the key is made of (model bytes, calibration data), and
compute the key; a hit is verified and returned at once. Only a miss takes the key's
lock, checks again (another builder may have finished meanwhile), builds in a staging
directory, measures the candidate against the fp32 reference, applies the gates, and
publishes. An engine that fails a gate is never published.

The model is every file it is made of (`model_files`: the `.onnx` file and the external
data files it names, as torch writes them), fetched together; the key's model digest
covers them all, and an ONNX Runtime engine keeps its own weights in a data file beside it
when the source did (`EngineManifest.data_files`, verified as the engine file is).

A build refuses what `kubeinfer serve` refuses, so a build Job never succeeds with an
engine whose pods then crash: the source model is loaded as serving loads it
(`engines.onnxruntime.check_servable`: dynamic dimensions besides the batch one, outputs
that do not follow the batch, datatypes without a v2 equivalent) before anything else,
the built engine is loaded through the serving loader before it is published (and tried
with one and two rows, as serving does at start, so that its manifest records whether the
model batches: `EngineManifest.batching`), and a cache hit is checked against this
environment's backend version (`engine_cache.check_compatible`) before it is handed out.

What int8 cannot do (a graph with nothing to quantise: `int8_refusal`) is refused before
anything is built, as bad input.

The gates judge the outputs that hold the scores (`accuracy.gated_output_names`: those
given as `gate_outputs`, else those named like scores, else all); the report marks each
output gated or compared only, and the progress lines say which is which.

Validation samples for the report, first match wins: a given validation file; for int8,
the calibration file's held-out tail (see `calibration`); for fp32/fp16, the calibration
file if one is given; otherwise seeded synthetic inputs (the report says which).

Every engine published carries its known-answer set (`known_answer_set`): probes from a
given probe set, else the first real validation samples, else drawn within each input's
valid range (`probe_inputs`), with the fp32 reference's answers and a tolerance per
output. A cache hit keeps the set its build recorded, as it keeps its accuracy report.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from kubeinfer.runtime.building import calibration as cal
from kubeinfer.runtime.building.accuracy import (
    compare_outputs,
    gate_violations,
    gated_output_names,
)
from kubeinfer.runtime.building.builders import Builder, BuildError, Progress, get_builder
from kubeinfer.runtime.building.known_answer_set import (
    PROBE_COUNT,
    Gate,
    ProbeInputs,
    answered_probes,
    record_known_answers,
)
from kubeinfer.runtime.building.model_fetch import FetchedFile, fetch
from kubeinfer.runtime.building.model_files import FetchedModel, fetch_model
from kubeinfer.runtime.building.probe_inputs import draw_probe_inputs
from kubeinfer.runtime.engine_cache import (
    EngineCache,
    EngineCacheError,
    ResolvedEngine,
    check_compatible,
)
from kubeinfer.runtime.engine_manifest import (
    BACKENDS,
    PRECISIONS,
    AccuracyReport,
    BatchingFound,
    BatchProfile,
    EngineKey,
    EngineManifest,
    TensorInfo,
    sha256_file,
)


class InvalidModelError(ValueError):
    """The model file is not a valid ONNX model."""


class AccuracyGateError(RuntimeError):
    """The engine's accuracy fails a gate; it was not published."""

    def __init__(self, message: str, report: AccuracyReport) -> None:
        super().__init__(message)
        self.report = report


# Everything build_engine raises for bad input or a failed build; the CLI prints these as
# one clear line, anything else is a bug and keeps its traceback.
BUILD_ERRORS: tuple[type[Exception], ...] = (
    ValueError,  # InvalidModelError, FetchError, CalibrationDataError, bad arguments
    BuildError,
    EngineCacheError,
    AccuracyGateError,
    OSError,  # an unwritable or full cache volume: the message names the path
)


def input_bytes_per_row(inputs: list[TensorInfo]) -> int | None:
    """Bytes one batch row of the model's inputs takes as binary tensors (what the
    operator sizes the runtime's request body limit from); None when a dimension other
    than the batch one is dynamic, or a datatype has no fixed size."""
    from kubeinfer.runtime.engines.base import V2_TO_NUMPY

    total = 0
    for tensor in inputs:
        dtype = V2_TO_NUMPY.get(tensor.datatype)
        item = tensor.shape[1:]
        if dtype is None or dtype.kind == "O" or any(d < 0 for d in item):
            return None
        count = 1
        for d in item:
            count *= d
        total += count * dtype.itemsize
    return total


@dataclass(frozen=True)
class BuildResult:
    digest: str
    manifest: EngineManifest
    cache_hit: bool
    engine_path: Path


def _quiet(_: str) -> None:
    pass


def _kubeinfer_version() -> str:
    try:
        return importlib.metadata.version("kubeinfer")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _load_model(fetched: FetchedModel) -> onnx.ModelProto:
    """The model's graph (its external data left on disk), checked by ONNX's checker
    with its files in place."""
    try:
        model = onnx.load(str(fetched.path), load_external_data=False)
        onnx.checker.check_model(str(fetched.path))
    except (DecodeError, onnx.checker.ValidationError, ValueError) as error:
        raise InvalidModelError(f"{fetched.uri} is not a valid ONNX model: {error}") from error
    if not model.graph.node:
        raise InvalidModelError(f"{fetched.uri} is not a valid ONNX model: its graph is empty")
    return model


Gates = tuple[float | None, float | None, Sequence[str] | None]
"""(max top-1 drop, min cosine, the outputs they judge: None for the default choice)."""


def _check_gates(
    report: AccuracyReport,
    max_top1_drop: float | None,
    min_cosine: float | None,
    gate_outputs: Sequence[str] | None,
    what: str,
) -> None:
    violations = gate_violations(report, max_top1_drop, min_cosine, gate_outputs)
    if violations:
        raise AccuracyGateError(
            f"{what} fails its accuracy gates: " + "; ".join(violations), report
        )


def _hit(
    resolved: ResolvedEngine, gates: Gates, probes: ProbeInputs, progress: Progress
) -> BuildResult:
    # The digest covers the backend version, so a hit is this version's engine; checked
    # all the same, since handing out another version's engine is a crash loop later.
    check_compatible(resolved)
    if resolved.manifest.accuracy is not None:
        what = f"the cached engine {resolved.digest} (built earlier under other gates)"
        _check_gates(resolved.manifest.accuracy, *gates, what=what)
    recorded = resolved.manifest.known_answers
    if probes.source == "probe-set" and (
        recorded is None or recorded.source_sha256 != probes.source_sha256
    ):
        progress(
            "The cached engine keeps the known-answer set its build recorded "
            f"({'none' if recorded is None else recorded.source}); the probe set given is "
            "not recorded on a cache hit"
        )
    return BuildResult(resolved.digest, resolved.manifest, True, resolved.engine_path)


def build_engine(
    model_uri: str,
    backend: str,
    precision: str,
    cache_dir: str | Path,
    calibration: str | None = None,
    max_batch_size: int = 32,
    max_top1_drop: float | None = None,
    min_cosine: float | None = None,
    model_sha256: str | None = None,
    calibration_sha256: str | None = None,
    validation: str | None = None,
    gate_outputs: Sequence[str] | None = None,
    progress: Progress = _quiet,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    probe_set: str | None = None,
    probe_set_sha256: str | None = None,
) -> BuildResult:
    """Builds (or finds) the engine for these inputs in the cache at `cache_dir`;
    `gate_outputs` names the outputs the gates judge, `probe_set` the known-answer
    set's inputs (see the module)."""
    _check_arguments(backend, precision, max_batch_size, calibration)
    cache = EngineCache(Path(cache_dir))
    fetched: list[FetchedFile | FetchedModel] = []
    try:
        progress(f"Fetching the model {model_uri}")
        model_file = fetch_model(model_uri, cache.scratch_dir, model_sha256)
        fetched.append(model_file)
        data = _gather_samples(
            model_file, precision, calibration, calibration_sha256, validation, cache, fetched
        )
        if probe_set is not None:
            given = fetch(probe_set, cache.scratch_dir, probe_set_sha256)
            fetched.append(given)
            samples = cal.load_samples(given.path, data.inputs, "the probe set")
            data = replace(data, probes=ProbeInputs(samples, "probe-set", given.sha256))
        _say_gated(data.outputs, gate_outputs, model_file.uri, progress)
        builder = get_builder(backend)
        key = EngineKey(
            model_sha256=model_file.sha256,
            backend=backend,
            backend_version=builder.backend_version(),
            precision=precision,
            batch_profile=BatchProfile.up_to(max_batch_size),
            calibration_sha256=data.calibration_sha256 if precision == "int8" else None,
            target=builder.target(),
        )
        gates: Gates = (max_top1_drop, min_cosine, gate_outputs)
        return _build_through_cache(
            cache, builder, model_file.path, key, data, gates, progress, now
        )
    finally:
        for item in fetched:
            item.cleanup()


def _check_arguments(
    backend: str, precision: str, max_batch_size: int, calibration: str | None
) -> None:
    """Refuses what no build could make, before anything is fetched (bad input)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if not 1 <= max_batch_size <= 1024:
        raise ValueError(f"max batch size {max_batch_size} must be within 1..1024")
    if precision == "int8" and calibration is None:
        raise ValueError("precision int8 needs calibration data (--calibration FILE.npz)")


def _build_through_cache(
    cache: EngineCache,
    builder: Builder,
    model_path: Path,
    key: EngineKey,
    data: _Samples,
    gates: Gates,
    progress: Progress,
    now: Callable[[], datetime],
) -> BuildResult:
    """The key's engine from the cache, or built under its lock (checking again once the
    lock is held: another builder may have finished meanwhile), gated and published."""
    digest = key.digest()
    if cache.contains(digest):
        progress(f"Cache hit: {digest}")
        return _hit(cache.resolve(digest), gates, data.probes, progress)
    with cache.lock(digest):
        if cache.contains(digest):
            progress(f"Cache hit after waiting for another builder: {digest}")
            return _hit(cache.resolve(digest), gates, data.probes, progress)
        with cache.staging(digest) as staging:
            manifest, report = _build_into(
                builder, model_path, key, staging, data, gates, progress, now
            )
            _check_gates(report, *gates, what=f"the {key.precision} engine (not published)")
            progress(f"Publishing {digest}")
            if not cache.publish(digest, staging, manifest):
                progress("Another builder published this key first; keeping its entry")
    resolved = cache.resolve(digest)
    return BuildResult(digest, resolved.manifest, False, resolved.engine_path)


@dataclass(frozen=True)
class _Samples:
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    calibration: cal.Samples | None
    calibration_sha256: str | None
    validation: cal.Samples
    validation_source: str
    probes: ProbeInputs


def _say_gated(
    outputs: list[TensorInfo], chosen: Sequence[str] | None, uri: str, progress: Progress
) -> None:
    """Checks that the gate outputs are the model's, and says which outputs the gates
    judge and which are compared only."""
    names = [o.name for o in outputs]
    try:
        gated = gated_output_names(names, chosen)
    except ValueError as error:
        raise InvalidModelError(f"{uri}: {error}") from None
    others = [name for name in names if name not in gated]
    progress(f"Gating outputs {gated}" + (f"; comparing only {others}" if others else ""))


def _gather_samples(
    model_file: FetchedModel,
    precision: str,
    calibration: str | None,
    calibration_sha256: str | None,
    validation: str | None,
    cache: EngineCache,
    fetched: list[FetchedFile | FetchedModel],
) -> _Samples:
    """Checks the model, loads and checks the calibration and validation samples, and
    picks the validation set (see the module docstring)."""
    model = _load_model(model_file)
    try:
        inputs, outputs = cal.describe_model(model)
    except cal.CalibrationDataError as error:  # an input or output that is not a tensor
        raise InvalidModelError(f"{model_file.uri} cannot be served: {error}") from None
    fixed = [f"{i.name} {i.shape}" for i in [*inputs, *outputs] if not i.shape or i.shape[0] != -1]
    if fixed:
        raise InvalidModelError(
            f"{model_file.uri}: the first dimension of every input and output must be a "
            f"dynamic batch dimension, but {', '.join(fixed)} is fixed; export the model "
            "with a dynamic batch axis (torch.onnx.export's dynamic_axes / dynamic_shapes)"
        )
    _check_servable(model_file)
    if precision == "int8":
        from kubeinfer.runtime.building.builders.onnxruntime_builder import int8_refusal

        refusal = int8_refusal(model)
        if refusal is not None:
            raise InvalidModelError(f"{model_file.uri}: {refusal}")
    calib_samples = calib_sha = None
    if calibration is not None:
        calib_file = fetch(calibration, cache.scratch_dir, calibration_sha256)
        fetched.append(calib_file)
        calib_samples = cal.load_samples(calib_file.path, inputs, "calibration data")
        calib_sha = calib_file.sha256
    validation_samples, source, probes = None, "synthetic", None
    if validation is not None:
        validation_file = fetch(validation, cache.scratch_dir)
        fetched.append(validation_file)
        validation_samples = cal.load_samples(validation_file.path, inputs, "validation data")
        source, probes = "given", ProbeInputs(None, "validation", validation_file.sha256)
    if precision == "int8":
        assert calib_samples is not None
        # The split does not depend on --validation (unless a lone sample must calibrate),
        # so the engine depends on the calibration file alone, as its key says.
        if validation_samples is None or cal.sample_count(calib_samples) > 1:
            calib_samples, held_out = cal.split_holdout(calib_samples)
            if validation_samples is None:
                validation_samples, source = held_out, "held-out"
    elif validation_samples is None and calib_samples is not None:
        validation_samples, source = calib_samples, "given"
    if validation_samples is None:
        validation_samples = cal.synthetic_samples(
            inputs, cal.SYNTHETIC_SAMPLES, names=cal.axis_names(model)
        )
        probes = ProbeInputs(draw_probe_inputs(model, inputs, PROBE_COUNT), "drawn")
    probes = probes or ProbeInputs(None, "calibration", calib_sha)
    return _Samples(inputs, outputs, calib_samples, calib_sha, validation_samples, source, probes)


def _check_servable(model_file: FetchedModel) -> None:
    """The source model as `kubeinfer serve` would load it (bad input: exit 2)."""
    from kubeinfer.runtime.engines.base import UnsupportedModel
    from kubeinfer.runtime.engines.onnxruntime import check_servable

    try:
        check_servable(model_file.path)
    except UnsupportedModel as error:
        raise InvalidModelError(f"{model_file.uri} cannot be served: {error}") from error


NOT_PROBED_AT_BUILD = (
    "not probed at build: the model's variable input axes take their ranges from the "
    "serving configuration; the runtime probes it at start"
)


def _check_engine_servable(engine_path: Path, key: EngineKey) -> BatchingFound:
    """The built engine loaded through the serving loader, before it is published, and
    whether it batches (`engines.batching_probe`, as serving finds it out at start)."""
    from kubeinfer.runtime.engines.base import EngineError
    from kubeinfer.runtime.engines.batching_probe import BatchingProbe, probe_batching
    from kubeinfer.runtime.engines.loader import load_engine

    try:
        # No shape ranges: they are the serving configuration's, not the engine's.
        engine = load_engine(engine_path, key.backend, key.batch_profile.max, input_shapes=None)
    except EngineError as error:
        raise BuildError(f"the built engine cannot be served: {error}") from error
    try:
        if any(spec.variable for spec in engine.inputs):  # its slots need the ranges
            probe = BatchingProbe(None, NOT_PROBED_AT_BUILD)
        else:
            probe = probe_batching(engine)
    finally:
        engine.close()
    return BatchingFound(batches=probe.batches, reason=probe.reason)


def _say_batching(found: BatchingFound, progress: Progress) -> None:
    if found.batches is True:
        progress("Found the model batches (two different rows run together as alone)")
    elif found.batches is False:
        progress(
            f"Found the model does not batch: it is served one request per run ({found.reason})"
        )
    else:
        progress(f"Whether the model batches is not known ({found.reason})")


def _build_into(
    builder: Builder,
    model_path: Path,
    key: EngineKey,
    staging: Path,
    data: _Samples,
    gates: Gates,
    progress: Progress,
    now: Callable[[], datetime],
) -> tuple[EngineManifest, AccuracyReport]:
    from kubeinfer.runtime.building.builders.onnxruntime_builder import run_model

    # A model that does not batch (or is not known to) is measured as it is served: one
    # sample per run (`rows_per_run`, set once the built engine was tried).
    def reference_run(samples: cal.Samples) -> cal.Samples:
        return run_model(model_path, samples, rows_per_run)

    def engine_run(samples: cal.Samples) -> cal.Samples:
        return builder.run(engine_path, samples, rows_per_run)

    started = time.monotonic()
    engine_path = staging / builder.engine_file
    work_dir = staging / "work"
    work_dir.mkdir()
    builder.build(
        model_path,
        key.precision,
        engine_path,
        data.calibration,
        key.batch_profile,
        work_dir,
        progress,
    )
    build_seconds = time.monotonic() - started
    batching = _check_engine_servable(engine_path, key)
    _say_batching(batching, progress)
    validation, source = data.validation, data.validation_source
    count = cal.sample_count(validation)
    progress(f"Measuring accuracy against fp32 on {count} {source} samples")
    rows_per_run = key.batch_profile.max if batching.batches is True else 1
    reference, candidate = reference_run(validation), engine_run(validation)
    report = compare_outputs(reference, candidate, source, gates[2])
    shutil.rmtree(work_dir)
    probes = answered_probes(
        data.probes, (validation, reference, candidate), reference_run, engine_run
    )
    progress(f"Recording {cal.sample_count(probes[0])} known answers ({data.probes.source})")
    known_answers = record_known_answers(staging, key.precision, Gate(*gates), data.probes, probes)
    manifest = EngineManifest(
        digest=key.digest(),
        key=key,
        engine_file=builder.engine_file,
        engine_sha256=sha256_file(engine_path),
        engine_bytes=engine_path.stat().st_size,
        data_files=builder.data_files(engine_path),
        inputs=data.inputs,
        outputs=data.outputs,
        created_at=now().isoformat(timespec="seconds").replace("+00:00", "Z"),
        builder_versions={
            "kubeinfer": _kubeinfer_version(),
            "numpy": np.__version__,
            **builder.library_versions(),
        },
        build_seconds=round(build_seconds, 3),
        accuracy=report,
        batching=batching,
        known_answers=known_answers,
    )
    return manifest, report
