"""`kubeinfer serve`: serve one model over the Open Inference Protocol v2 until SIGTERM.

Configuration is a `RuntimeConfig`: from `--config FILE` (YAML or JSON, camelCase, the
form the operator renders into the runtime's ConfigMap), then flags override it field by
field, then the result is validated as a whole, so a bad value is reported the same way
whichever way it came. Each flag can also be set by `KUBEINFER_SERVE_<FLAG>`
(`KUBEINFER_SERVE_MAX_BATCH_SIZE=8`); the flag wins (pydantic-settings' CLI source over
its environment source, `ServeSettings`). Nothing heavy is imported until the command runs.

Exit codes: 0 after a clean drain; 2 for an invalid configuration; 1 when the engine
cannot be loaded; 3 (`EXIT_ENGINE_INCOMPATIBLE`, defined beside `EngineIncompatibleError`
in `kubeinfer.runtime.engine_cache`) when the cached engine's manifest names another
backend or backend version than this image has (an engine runs only on the version that
built it: the image was changed without a rebuild, or a pinned engine was built
elsewhere). The operator reads 3 from the pod's container status and reports
EngineIncompatible with the message.

On a failure to start (1, 2 or 3), the one-line `error:` message also goes to the
container's termination message, where the kubelet reports it in the pod's status:
`--termination-message-path`, by default `/dev/termination-log` when that file exists
(the kubelet creates it in every container; elsewhere nothing is written).

An engine from the cache answers its known-answer set before the transports listen
(`kubeinfer.runtime.known_answers`). One that answers wrong does not exit: the process
serves its health, metrics and the verdict, stays live and never becomes ready, and
refuses inference with 503 naming the probe, the output and the error against its
tolerance, so the evidence stays where the operator can read it and a restart cannot
roll the dice again. `--testing-faults` (`KUBEINFER_SERVE_TESTING_FAULTS`) injects faults
for the tests of that path only (`kubeinfer.runtime.testing_faults`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from kubeinfer.runtime import command_settings
from pydantic import ValidationError, field_validator
from pydantic_settings import (
    NoDecode,
    SettingsConfigDict,
)

if TYPE_CHECKING:
    from kubeinfer.contract.runtime_config import RuntimeConfig
    from kubeinfer.runtime.engines.base import Engine
    from kubeinfer.runtime.known_answers.runner import KnownAnswerCheck
    from kubeinfer.runtime.rust_dataplane import GpuMemoryRead
    from kubeinfer.runtime.testing_faults import InjectedFaults

log = logging.getLogger("kubeinfer.serve")

TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4000
"""Kubernetes keeps at most 4096 bytes of a termination message."""


class Into:
    """Marks a `ServeSettings` field that overrides this field of the RuntimeConfig
    (camelCase, dotted)."""

    def __init__(self, path: str) -> None:
        self.path = path


class ServeSettings(command_settings.FlagsThenEnvironment):
    """`kubeinfer serve`'s flags, each also read from `KUBEINFER_SERVE_<FLAG>` (`--max-batch-size`:
    `KUBEINFER_SERVE_MAX_BATCH_SIZE`); a flag wins over its variable. A field marked
    `Into(path)` overrides that field of the `--config` file; unset ones leave it alone."""

    model_config = SettingsConfigDict(
        env_prefix="KUBEINFER_SERVE_",
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        protected_namespaces=(),
        cli_kebab_case=True,
        cli_hide_none_type=True,
    )

    config: Path | None = None
    """RuntimeConfig as YAML or JSON (camelCase)"""
    onnx: Path | None = None
    """ONNX model file to serve"""
    engine: str | None = None
    """serve this engine (sha256:...) from --cache"""
    cache: Path | None = None
    """the engine cache's root"""
    termination_message_path: Path | None = None
    """where to write why serving did not start (default: /dev/termination-log, when that
    file exists, as the kubelet creates it)"""

    model_name: Annotated[str | None, Into("modelName")] = None
    """served model name (the {name} in the v2 routes)"""
    model_version: Annotated[str | None, Into("modelVersion")] = None
    """served model version"""
    host: Annotated[str | None, Into("host")] = None
    """listen address"""
    port: Annotated[int | None, Into("httpPort")] = None
    """HTTP port of the v2 API and /metrics"""
    grpc_port: Annotated[int | None, Into("grpcPort")] = None
    """port of the v2 API over gRPC (inference.GRPCInferenceService); unset: no gRPC"""
    max_batch_size: Annotated[int | None, Into("batching.maxBatchSize")] = None
    """largest batch, in rows"""
    max_queue_delay_microseconds: Annotated[
        int | None, Into("batching.maxQueueDelayMicroseconds")
    ] = None
    """longest a request waits for a larger batch (only when that can help)"""
    preferred_batch_sizes: Annotated[
        list[int] | None, NoDecode, Into("batching.preferredBatchSizes")
    ] = None
    """comma-separated batch sizes the engine runs best at"""
    shape_batching: Annotated[
        Literal["EqualShapes", "PadToBuckets"] | None, Into("batching.shapeBatching")
    ] = None
    """how requests of different shapes share batches: EqualShapes or PadToBuckets"""
    shape_buckets: Annotated[list[int] | None, NoDecode, Into("batching.shapeBuckets")] = None
    """comma-separated extents a padded axis is rounded up to (PadToBuckets; default: powers
    of two)"""
    input_shape: Annotated[list[dict[str, Any]] | None, NoDecode, Into("inputShapes")] = None
    """an input's shape range NAME=MIN:OPT:MAX[:PAD], each shape the axes after the batch
    joined by x (input_ids=1:128:512:0; past=4x0x16:4x64x16:4x256x16); PAD: its padValue;
    repeat for each input with variable axes"""
    execution_slots: Annotated[int | None, Into("batching.executionSlots")] = None
    """batches run concurrently"""
    max_queue_size: Annotated[int | None, Into("batching.maxQueueSize")] = None
    """queued requests before 503"""
    default_timeout_milliseconds: Annotated[
        int | None, Into("batching.defaultTimeoutMilliseconds")
    ] = None
    """deadline of a request without a timeout parameter"""
    max_request_bytes: Annotated[int | None, Into("maxRequestBytes")] = None
    """largest request body, inflated (413 beyond, before reading it when declared); default:
    maxBatchSize rows of the model's largest allowed inputs as JSON"""
    header_read_timeout_seconds: Annotated[float | None, Into("headerReadTimeoutSeconds")] = None
    """a request head must be complete this long after it started"""
    body_read_timeout_seconds: Annotated[float | None, Into("bodyReadTimeoutSeconds")] = None
    """longest pause within a request body (408 beyond)"""
    engine_stuck_liveness_seconds: Annotated[float | None, Into("engineStuckLivenessSeconds")] = (
        None
    )
    """liveness fails when a batch stuck past its deadlines has not returned in this long"""
    drain_grace_period_seconds: Annotated[float | None, Into("drainGracePeriodSeconds")] = None
    """time to answer queued requests after SIGTERM"""
    intra_op_threads: Annotated[int | None, Into("intraOpThreads")] = None
    """ONNX Runtime intra-op threads"""
    mirror_target_file: Annotated[str | None, Into("mirrorTargetFile")] = None
    """a MirrorFile (YAML/JSON) naming a shadow candidate to mirror answered requests to;
    re-read while serving (missing or empty: no mirroring)"""
    mirror_poll_interval_milliseconds: Annotated[
        int | None, Into("mirrorPollIntervalMilliseconds")
    ] = None
    """how often the mirror target file is re-read"""
    testing_faults: str | None = None
    """FOR TESTS ONLY: faults to inject (kubeinfer.runtime.testing_faults), e.g.
    perturb-batches=1,seed=3 or damage-engine-after-digest-check; never set in production"""

    @field_validator("input_shape", mode="before")
    @classmethod
    def _parse_input_shapes(cls, value: Any) -> Any:
        """NAME=MIN:OPT:MAX[:PAD] per flag, or several separated by commas or spaces."""
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            return value
        return [
            parse_input_shape(part) if isinstance(item, str) else item
            for item in value
            for part in (item.replace(",", " ").split() if isinstance(item, str) else [item])
        ]

    @field_validator("preferred_batch_sizes", "shape_buckets", mode="before")
    @classmethod
    def _split_sizes(cls, value: Any) -> Any:
        """`4,8` (one flag or variable, as before) as well as a repeated flag."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            return [part.strip() for item in value for part in str(item).split(",") if part.strip()]
        return value


def parse_input_shape(text: str) -> dict[str, Any]:
    """`input_ids=1:64:128:0` as an InputShape's fields (camelCase); ValueError naming the
    form when it is not one."""
    name, _, ranges = text.partition("=")
    parts = ranges.split(":")
    form = "NAME=MIN:OPT:MAX[:PAD], each shape its axes joined by x"
    if not name or len(parts) not in (3, 4):
        raise ValueError(f"{text!r} is not {form}")
    try:
        shapes = [[int(d) for d in part.split("x")] if part else [] for part in parts[:3]]
        pad = float(parts[3]) if len(parts) == 4 else None
    except ValueError:
        raise ValueError(f"{text!r} is not {form}") from None
    fields: dict[str, Any] = {"name": name, "minShape": shapes[0], "optShape": shapes[1]}
    fields["maxShape"] = shapes[2]
    if pad is not None:
        fields["padValue"] = int(pad) if pad.is_integer() else pad
    return fields


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    """The flags parsed by `kubeinfer serve`'s parser, over `KUBEINFER_SERVE_*`; raises
    ValueError naming each bad flag and its variable."""
    return command_settings.from_args(ServeSettings, args)


def config_from_args(args: argparse.Namespace) -> RuntimeConfig:
    """The RuntimeConfig from `--config` and the flags; raises ValueError (with every
    problem, one per line) when a flag, the file or the result is invalid."""
    return config_from_settings(settings_from_args(args))


def config_from_settings(settings: ServeSettings) -> RuntimeConfig:
    """The RuntimeConfig from `settings.config`'s file with the other settings over it."""
    import yaml
    from kubeinfer.contract.runtime_config import RuntimeConfig

    data: dict[str, Any] = {}
    if settings.config is not None:
        try:
            loaded = yaml.safe_load(settings.config.read_text())
        except OSError as error:
            raise ValueError(f"cannot read {settings.config}: {error.strerror or error}") from None
        except yaml.YAMLError as error:
            raise ValueError(f"{settings.config}: not valid YAML/JSON: {error}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{settings.config}: expected a mapping of RuntimeConfig fields")
        data = loaded
    for name, field in ServeSettings.model_fields.items():
        value = getattr(settings, name)
        into = next((mark.path for mark in field.metadata if isinstance(mark, Into)), None)
        if into is None or value is None:
            continue
        *parents, leaf = into.split(".")
        node = data
        for parent in parents:
            node = node.setdefault(parent, {})
            if not isinstance(node, dict):
                raise ValueError(f"{parent} must be a mapping")
        node[leaf] = value
    if settings.onnx is not None:  # an engine flag replaces the file's engine section whole
        data["engine"] = {"onnxPath": str(settings.onnx)}
    if settings.engine is not None:  # a cache digest: `kubeinfer build` prints it
        if settings.onnx is not None:
            raise ValueError("give either --onnx or --engine, not both")
        data["engine"] = {"digest": settings.engine}
        if settings.cache is not None:
            data["engine"]["cacheDirectory"] = str(settings.cache)
    try:
        config = RuntimeConfig.model_validate(data)
    except ValidationError as error:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in error.errors()
        ]
        raise ValueError("\n".join(problems)) from None
    except ValueError as error:  # a CrossFieldRuleViolation raised outside pydantic
        raise ValueError(str(error)) from None
    _check_mirror_target_file(config.mirror_target_file)
    return config


def _check_mirror_target_file(path: str | None) -> None:
    """The mirror target file may be missing (no shadow yet: the operator writes it when
    one starts), but an empty path or a directory is a mistake in the configuration,
    reported at start rather than as a shadow that never mirrors."""
    if path is None:
        return
    if not path.strip():
        raise ValueError("mirrorTargetFile: must be a file path, not empty")
    if Path(path).is_dir():
        raise ValueError(
            f"mirrorTargetFile: {path} is a directory; name the file in it (the ConfigMap's key)"
        )


def load_engine_for(
    config: RuntimeConfig, faults: InjectedFaults | None = None
) -> tuple[Engine, KnownAnswerCheck]:
    """The engine `config.engine` names, loaded for the batcher's maxBatchSize, and its
    known-answer check (not run yet); `faults` are the tests' (`testing_faults`).

    The one place that turns an `EngineSource` into an `Engine`: an ONNX file goes to ONNX
    Runtime as it is (no build, so no known answers); an engine digest is resolved and
    verified in the cache, and brings the known-answer set its build recorded."""
    from kubeinfer.runtime.engines.loader import load_engine
    from kubeinfer.runtime.known_answers.runner import KnownAnswerCheck, load_known_answers
    from kubeinfer.runtime.testing_faults import InjectedFaults

    faults = faults or InjectedFaults()

    source, rows = config.engine, config.batching.max_batch_size
    if source.digest is not None:  # resolved and sha256-verified against its manifest
        from kubeinfer.runtime.engine_cache import load_cached

        cached = load_cached(
            source.cache_directory or "",
            source.digest,
            rows,
            intra_op_threads=config.intra_op_threads,
            input_shapes=config.input_shapes,
            after_digest_check=faults.after_digest_check(),
        )
        engine, known = (
            faults.wrap(cached.engine),
            load_known_answers(cached.resolved.directory, cached.resolved.manifest),
        )
        missing = "the engine's manifest records no known-answer set (built before they were)"
        return engine, KnownAnswerCheck(engine, known, missing_reason=missing, batch_rows=rows)
    assert source.onnx_path is not None
    engine = load_engine(
        source.onnx_path,
        "onnxruntime",
        rows,
        intra_op_threads=config.intra_op_threads,
        input_shapes=config.input_shapes,
    )
    engine = faults.wrap(engine)
    missing = "an ONNX file served as it is has no known-answer set (serve a built engine)"
    check = KnownAnswerCheck(
        engine, None, missing_reason=missing, missing_expected=True, batch_rows=rows
    )
    return engine, check


def gpu_memory_reader() -> GpuMemoryRead | None:
    """The NVML reader for the GPU memory gauges, or None where there is no GPU (or no
    NVML binding): then the gauges are not exported at all."""
    from kubeinfer.runtime.engines.gpu_memory import GpuMemoryReader

    reader = GpuMemoryReader()
    return reader.read if reader.read() is not None else None


def _fail_to_start(path: Path | None, message: str, code: int) -> int:
    """Says why serving did not start, on stderr and in the termination message (the
    given path, else the kubelet's default file where it exists)."""
    print(f"kubeinfer serve: {message}", file=sys.stderr)
    if path is None and Path(TERMINATION_LOG).is_file():
        path = Path(TERMINATION_LOG)
    if path is not None:
        one_line = message.strip().replace(":\n", ": ").replace("\n", "; ")
        text = f"error: {one_line}"[:TERMINATION_MESSAGE_LIMIT]
        try:
            Path(path).write_text(text)
        except OSError as error:
            print(f"kubeinfer serve: cannot write {path}: {error}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = settings_from_args(args)
    except ValueError as error:  # a bad flag: its own value may still name the path
        raw = getattr(args, "termination_message_path", None)
        path = Path(raw) if isinstance(raw, str) and raw else None
        return _fail_to_start(path, f"invalid configuration:\n{error}", 2)
    path = settings.termination_message_path
    from kubeinfer.runtime.testing_faults import parse_testing_faults

    try:
        config = config_from_settings(settings)
        faults = parse_testing_faults(settings.testing_faults)
    except ValueError as error:
        return _fail_to_start(path, f"invalid configuration:\n{error}", 2)
    loading = time.monotonic()
    try:
        engine, known_answers = load_engine_for(config, faults)
    except Exception as error:  # any load failure is a clean exit with its message
        from kubeinfer.runtime.engine_cache import (
            EXIT_ENGINE_INCOMPATIBLE,
            EngineIncompatibleError,
        )

        if isinstance(error, EngineIncompatibleError):
            return _fail_to_start(path, str(error), EXIT_ENGINE_INCOMPATIBLE)
        return _fail_to_start(path, f"cannot load the engine: {error}", 1)
    # A cold start's breakdown (docs/scale-to-zero.md) reads this line and the next.
    log.info("Engine loaded in %.3f s model=%s", time.monotonic() - loading, config.model_name)
    return _serve(config, engine, known_answers, path)


def _serve(
    config: RuntimeConfig, engine: Engine, known_answers: KnownAnswerCheck, path: Path | None
) -> int:
    """Serves the loaded engine through the Rust data plane (`rust_dataplane.serve`) until
    SIGTERM and its drain, once the slots' buffers are known to fit in memory; the engine
    is closed here."""
    from kubeinfer.runtime.engines.base import slot_buffer_bytes
    from kubeinfer.runtime.engines.buffer_fit import available_bytes, buffers_problem
    from kubeinfer.runtime.rust_dataplane import CannotServe, serve

    slots = config.batching.execution_slots or engine.default_execution_slots
    problem = buffers_problem(
        slot_buffer_bytes(engine), slots, engine.max_batch_size, available_bytes()
    )
    try:
        if problem is not None:
            return _fail_to_start(path, f"cannot serve the model: {problem}", 1)
        return serve(config, engine, known_answers, gpu_memory_reader())
    except CannotServe as error:
        return _fail_to_start(path, str(error), 1)
    finally:
        engine.close()


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over the Open Inference Protocol v2 (HTTP, gRPC) with dynamic batching",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command_settings.attach(parser, ServeSettings, run)
