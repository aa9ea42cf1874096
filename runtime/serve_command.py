"""`kubeinfer serve`: serve one model over the Open Inference Protocol v2 until SIGTERM.

Configuration is a `RuntimeConfig`: from `--config FILE` (YAML or JSON, camelCase, the
form the operator renders into the runtime's ConfigMap), then flags override it field by
field, then the result is validated as a whole, so a bad value is reported the same way
whichever way it came. Nothing heavy is imported until the command runs.

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
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeinfer.contract.runtime_config import RuntimeConfig
    from kubeinfer.runtime.engines.base import Engine
    from kubeinfer.runtime.metrics import GpuMemoryReader

log = logging.getLogger("kubeinfer.serve")

TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4000
"""Kubernetes keeps at most 4096 bytes of a termination message."""


def _sizes(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


# flag, config path (camelCase, dotted), argparse type, help
_FIELD_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--model-name", "modelName", str, "served model name (the {name} in the v2 routes)"),
    ("--model-version", "modelVersion", str, "served model version"),
    ("--host", "host", str, "listen address"),
    ("--port", "httpPort", int, "HTTP port of the v2 API and /metrics"),
    ("--max-batch-size", "batching.maxBatchSize", int, "largest batch, in rows"),
    ("--max-queue-delay-microseconds", "batching.maxQueueDelayMicroseconds", int,
     "longest a request waits for a larger batch (only when that can help)"),
    ("--preferred-batch-sizes", "batching.preferredBatchSizes", _sizes,
     "comma-separated batch sizes the engine runs best at"),
    ("--execution-slots", "batching.executionSlots", int, "batches run concurrently"),
    ("--max-queue-size", "batching.maxQueueSize", int, "queued requests before 503"),
    ("--default-timeout-milliseconds", "batching.defaultTimeoutMilliseconds", int,
     "deadline of a request without a timeout parameter"),
    ("--max-request-bytes", "maxRequestBytes", int,
     "largest request body, inflated (413 beyond, before reading it when declared)"),
    ("--header-read-timeout-seconds", "headerReadTimeoutSeconds", float,
     "a request head must be complete this long after it started"),
    ("--body-read-timeout-seconds", "bodyReadTimeoutSeconds", float,
     "longest pause within a request body (408 beyond)"),
    ("--engine-stuck-liveness-seconds", "engineStuckLivenessSeconds", float,
     "liveness fails when a batch stuck past its deadlines has not returned in this long"),
    ("--drain-grace-period-seconds", "drainGracePeriodSeconds", float,
     "time to answer queued requests after SIGTERM"),
    ("--intra-op-threads", "intraOpThreads", int, "ONNX Runtime intra-op threads"),
    ("--mirror-target-file", "mirrorTargetFile", str,
     "a MirrorFile (YAML/JSON) naming a shadow candidate to mirror answered requests to; "
     "re-read while serving (missing or empty: no mirroring)"),
    ("--mirror-poll-interval-milliseconds", "mirrorPollIntervalMilliseconds", int,
     "how often the mirror target file is re-read"),
)  # fmt: skip


def config_from_args(args: argparse.Namespace) -> RuntimeConfig:
    """The RuntimeConfig from `--config` and the flags; raises ValueError (with every
    problem, one per line) when the file or the result is invalid."""
    import yaml
    from kubeinfer.contract.runtime_config import RuntimeConfig
    from pydantic import ValidationError

    data: dict[str, Any] = {}
    if args.config is not None:
        try:
            loaded = yaml.safe_load(Path(args.config).read_text())
        except OSError as error:
            raise ValueError(f"cannot read {args.config}: {error.strerror or error}") from None
        except yaml.YAMLError as error:
            raise ValueError(f"{args.config}: not valid YAML/JSON: {error}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.config}: expected a mapping of RuntimeConfig fields")
        data = loaded
    for flag, path, _, _ in _FIELD_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is None:
            continue
        *parents, leaf = path.split(".")
        node = data
        for parent in parents:
            node = node.setdefault(parent, {})
            if not isinstance(node, dict):
                raise ValueError(f"{parent} must be a mapping")
        node[leaf] = value
    if args.onnx is not None:  # an engine flag replaces the file's engine section whole
        data["engine"] = {"onnxPath": str(args.onnx)}
    if args.engine is not None:  # a cache digest: `kubeinfer build` prints it
        if args.onnx is not None:
            raise ValueError("give either --onnx or --engine, not both")
        data["engine"] = {"digest": args.engine}
        if args.cache is not None:
            data["engine"]["cacheDirectory"] = str(args.cache)
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


def load_engine_for(config: RuntimeConfig) -> Engine:
    """The engine `config.engine` names, loaded for the batcher's maxBatchSize.

    The one place that turns an `EngineSource` into an `Engine`: an ONNX file goes to ONNX
    Runtime as it is; an engine digest from the cache is resolved here too (the engine
    cache's own code adds that branch)."""
    from kubeinfer.runtime.engines.loader import load_engine

    source = config.engine
    if source.digest is not None:  # resolved and sha256-verified against its manifest
        from kubeinfer.runtime.engine_cache import load_cached_engine

        return load_cached_engine(
            source.cache_directory or "",
            source.digest,
            config.batching.max_batch_size,
            intra_op_threads=config.intra_op_threads,
        )
    assert source.onnx_path is not None
    return load_engine(
        source.onnx_path,
        "onnxruntime",
        config.batching.max_batch_size,
        intra_op_threads=config.intra_op_threads,
    )


def gpu_memory_reader() -> GpuMemoryReader | None:
    """The NVML reader for the GPU memory gauges, or None where there is no GPU (or no
    NVML binding): then the gauges are not exported at all."""
    from kubeinfer.runtime.gpu_memory import GpuMemoryReader

    reader = GpuMemoryReader()
    return reader.read if reader.read() is not None else None


def _fail_to_start(args: argparse.Namespace, message: str, code: int) -> int:
    """Says why serving did not start, on stderr and in the termination message (the
    given path, else the kubelet's default file where it exists)."""
    print(f"kubeinfer serve: {message}", file=sys.stderr)
    path = args.termination_message_path
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
        config = config_from_args(args)
    except ValueError as error:
        return _fail_to_start(args, f"invalid configuration:\n{error}", 2)
    try:
        engine = load_engine_for(config)
    except Exception as error:  # any load failure is a clean exit with its message
        from kubeinfer.runtime.engine_cache import (
            EXIT_ENGINE_INCOMPATIBLE,
            EngineIncompatibleError,
        )

        if isinstance(error, EngineIncompatibleError):
            return _fail_to_start(args, str(error), EXIT_ENGINE_INCOMPATIBLE)
        return _fail_to_start(args, f"cannot load the engine: {error}", 1)

    import asyncio

    from kubeinfer.runtime.http.app import DATAPLANE, create_app
    from kubeinfer.runtime.http.server import serve

    app = create_app(config, engine, gpu_memory=gpu_memory_reader())
    try:
        code = asyncio.run(serve(app, config))
    except BaseException:
        engine.close()
        raise
    if app[DATAPLANE].batcher.stuck_threads:
        # A worker thread is still inside the engine: closing the engine under it could
        # crash, and the interpreter would wait for the thread at exit forever.
        log.error("Exiting with a batch still running on the engine")
        logging.shutdown()
        os._exit(code)
    engine.close()
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over the Open Inference Protocol v2 (HTTP) with dynamic batching",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="RuntimeConfig as YAML or JSON (camelCase)"
    )
    parser.add_argument("--onnx", type=Path, metavar="PATH", help="ONNX model file to serve")
    parser.add_argument(
        "--engine", metavar="DIGEST", help="serve this engine (sha256:...) from --cache"
    )
    parser.add_argument("--cache", type=Path, metavar="DIR", help="the engine cache's root")
    parser.add_argument(
        "--termination-message-path",
        type=Path,
        metavar="PATH",
        help=f"where to write why serving did not start (default: {TERMINATION_LOG}, "
        "when that file exists, as the kubelet creates it)",
    )
    for flag, _, type_, help_ in _FIELD_FLAGS:
        parser.add_argument(flag, type=type_, default=None, help=help_)
    parser.set_defaults(handler=run)
