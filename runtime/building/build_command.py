"""`kubeinfer build`: build an engine into the content-addressed cache, or pin one.

    kubeinfer build --model URI --backend onnxruntime|tensorrt --precision fp32|fp16|int8
                    [--calibration FILE.npz] [--max-batch-size N] --cache DIR [--json]
                    [--max-top1-drop X] [--min-cosine Y] [--gate-outputs NAME[,NAME...]]
                    [--probe-set FILE.npz]
    kubeinfer build --pin sha256:... --cache DIR [--json]

stdout carries only the result (the digest, or with `--json` the whole manifest, plus a
`cacheHit` field) so scripts and the operator's build Job can read it; one progress line
per stage goes to stderr. With `--termination-message-path` (a Kubernetes Job's
`/dev/termination-log`) a compact JSON object (`digest`, `target`, `backend`,
`precision`, `cacheHit`) is also written there, or on failure the `error:` line, where
the operator reads it from the pod's status; `inputBytesPerRow` (the bytes one row of
the model's inputs takes as binary tensors, absent when an item dimension is dynamic) is
in both, and the operator sizes the runtime's request body limit from it; so are
`batches` (whether the model batches, as a trial run of the built engine found: false
means the runtime serves it one request per run, null that it was not found out) and
`batchingReason` (why), which the operator reports in the InferenceDeployment's status.

The gates judge the outputs that hold the scores: those `--gate-outputs` names, else
those whose name says so (logits, probabilities, scores), else every output; the others
are compared and reported only, and each output in the report says which it was
(`gated`).

When the engine is of a reduced precision (fp16, int8), its accuracy report was measured
on real samples (`--validation`, or the calibration file: its held-out tail for int8;
not synthetic ones) and an output has classes, the termination message also carries
`accuracy`: `{"output": name, "rows": N, "agreements": A, "byClass": {"3": [rows,
agreements], ...}}`, the first such output's top-1 agreement with fp32 overall and per
reference top-1 class, which the operator's quality watch takes as its baseline. The
classes with the most rows come first; the rest, past a 3000-byte budget, fall back to
the overall figure (`accuracy.termination_accuracy`). The manifest (`--json`) has every
class, as the report's `top1Rows` and `top1ByClass`.

Exit codes: 0 with the digest; 2 for bad input, one line saying what is wrong (a model
that `kubeinfer serve` would refuse, such as one with a dynamic dimension besides the
batch one, is bad input: the build refuses it before building); 1 for a failed build or
accuracy gate; 3 when the engine found (`--pin`, or a cache hit) was built by another
backend version than this environment has, the same refusal and code as `kubeinfer
serve`'s; 143 when stopped by SIGTERM. The calibration file's format is documented in
`kubeinfer.runtime.building.calibration`.

Every engine built carries a known-answer set (`kubeinfer.runtime.known_answers`):
probes and the fp32 reference's answers, which `kubeinfer serve` checks the loaded engine
against before it reports ready. `--probe-set` names its inputs (an .npz in the
calibration format); without it they come from the calibration or validation data, or
are drawn within each input's valid range.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeinfer.runtime.engine_manifest import EngineManifest


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build",
        help="build an engine into the cache (or resolve a pinned one) and print its digest",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    _add_model_arguments(parser)
    _add_result_arguments(parser)
    parser.set_defaults(handler=run)


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """What the engine is built from and for: the model, backend, precision, samples."""
    parser.add_argument(
        "--model",
        metavar="URI",
        help="the .onnx file (its external data files beside it) or a folder holding one: "
        "a path, file://, http(s)://, s3:// or gs:// URI",
    )
    parser.add_argument("--model-sha256", metavar="HEX", help="expected sha256 of the .onnx file")
    parser.add_argument("--backend", choices=("onnxruntime", "tensorrt"), default="onnxruntime")
    parser.add_argument("--precision", choices=("fp32", "fp16", "int8"), default="fp32")
    parser.add_argument(
        "--calibration",
        metavar="URI",
        help="int8 calibration samples: an .npz with one [samples, ...] array per input",
    )
    parser.add_argument("--calibration-sha256", metavar="HEX")
    parser.add_argument(
        "--validation", metavar="URI", help="validation samples for the report (.npz)"
    )
    parser.add_argument(
        "--probe-set",
        metavar="URI",
        help="the known-answer probes' inputs (.npz, one [probes, ...] array per input; "
        "default: from the calibration or validation data, else drawn in range)",
    )
    parser.add_argument("--probe-set-sha256", metavar="HEX")
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        metavar="N",
        help="largest batch the engine accepts (its profile spans 1..N; default 32)",
    )


def _add_result_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the engine goes, the gates it must pass, and how the result is told."""
    parser.add_argument("--cache", required=True, metavar="DIR", help="the engine cache root")
    parser.add_argument("--json", action="store_true", help="print the whole manifest")
    parser.add_argument(
        "--pin", metavar="DIGEST", help="resolve and verify sha256:... instead of building"
    )
    parser.add_argument(
        "--max-top1-drop",
        type=float,
        metavar="X",
        help="fail unless at most this share of samples changes its top-1 class vs fp32",
    )
    parser.add_argument(
        "--min-cosine",
        type=float,
        metavar="Y",
        help="fail unless every output's mean cosine similarity to fp32 is at least Y",
    )
    parser.add_argument(
        "--gate-outputs",
        metavar="NAME[,NAME...]",
        type=_names,
        help="the outputs that hold the scores, which the gates judge (default: those "
        "named like logits, probabilities or scores, else all); the others are compared "
        "and reported only",
    )
    parser.add_argument(
        "--termination-message-path",
        metavar="PATH",
        help="also write the result here (a Kubernetes Job's /dev/termination-log) as "
        "compact JSON; fp16/int8 builds measured on real samples add `accuracy`, the top-1 "
        "agreement with fp32 overall and per reference class (rows, agreements)",
    )


def _names(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one output name")
    return names


def _progress() -> Callable[[str], None]:
    started = time.monotonic()

    def report(line: str) -> None:
        print(f"[build {time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    return report


class _Terminated(BaseException):
    """SIGTERM during a build (a Job's pod deleted or evicted): raised in the main thread
    so every `finally` on the way out runs (the staging directory and downloads are
    removed) before the process exits 143. A BaseException, so no `except Exception`
    inside a backend takes it for a build error."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Turns SIGTERM into `_Terminated` for the block (main thread only: elsewhere Python
    cannot set handlers, and the caller owns the signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    """One `error:` line on stderr and, for a Job, in its termination message (where the
    operator reads either a digest or the reason the build failed)."""
    print(f"error: {message}", file=sys.stderr)
    if args.termination_message_path:
        Path(args.termination_message_path).write_text(f"error: {message}"[:4000])
    return code


BATCHING_REASON_LIMIT = 300
"""Characters of `batchingReason` in the termination message (its whole is in the manifest),
so the message stays within what Kubernetes keeps beside the accuracy's budget."""


def termination_message(digest: str, manifest: EngineManifest, cache_hit: bool) -> str:
    """The compact JSON a build Job leaves for the operator (see the module docstring):
    a few hundred bytes, plus the `accuracy` object within its own budget, so the whole
    stays under the 4096 bytes Kubernetes keeps."""
    from kubeinfer.runtime.building.accuracy import (
        compact_json,
        measures_quantisation,
        termination_accuracy,
    )
    from kubeinfer.runtime.building.engine_build import input_bytes_per_row

    row_bytes = input_bytes_per_row(manifest.inputs)
    report = manifest.accuracy
    accuracy = (
        termination_accuracy(report)
        if measures_quantisation(manifest.key.precision, report)
        else None
    )
    found = manifest.batching
    batching: dict[str, object] = {} if found is None else {"batches": found.batches}
    if found is not None and found.reason:
        batching["batchingReason"] = found.reason[:BATCHING_REASON_LIMIT]
    summary = {
        "digest": digest,
        "target": manifest.key.target,
        "backend": manifest.key.backend,
        "precision": manifest.key.precision,
        "cacheHit": cache_hit,
        **({} if row_bytes is None else {"inputBytesPerRow": row_bytes}),
        **batching,
        **({} if accuracy is None else {"accuracy": accuracy}),
    }
    return compact_json(summary)


def run(args: argparse.Namespace) -> int:
    if args.pin is not None:
        outcome = _resolve_pinned(args)
    elif args.model is None:
        return _fail(args, "--model is required (or --pin to use an engine already built)", 2)
    else:
        outcome = _build(args)
    if isinstance(outcome, int):  # failed: its exit code, the failure already said
        return outcome
    _print_result(args, *outcome)
    return 0


Outcome = tuple[str, "EngineManifest", bool]
"""The engine's digest, its manifest, and whether it was found in the cache."""


def _resolve_pinned(args: argparse.Namespace) -> Outcome | int:
    """`--pin`: the engine resolved from the cache and checked against this environment."""
    from kubeinfer.runtime.building.engine_build import BUILD_ERRORS
    from kubeinfer.runtime.engine_cache import (
        EXIT_ENGINE_INCOMPATIBLE,
        EngineIncompatibleError,
        check_compatible,
        resolve_engine,
    )

    if args.model is not None:
        return _fail(args, "give either --pin or --model, not both", 2)
    try:
        resolved = resolve_engine(args.cache, args.pin)
        check_compatible(resolved)
    except EngineIncompatibleError as error:
        return _fail(args, str(error), EXIT_ENGINE_INCOMPATIBLE)
    except BUILD_ERRORS as error:
        return _fail(args, str(error), 2)
    return resolved.digest, resolved.manifest, True


def _build(args: argparse.Namespace) -> Outcome | int:
    """`--model`: the engine built (or found) in the cache; each failure its exit code."""
    from kubeinfer.runtime.building.builders import BuildError
    from kubeinfer.runtime.building.engine_build import (
        BUILD_ERRORS,
        AccuracyGateError,
        build_engine,
    )
    from kubeinfer.runtime.engine_cache import EXIT_ENGINE_INCOMPATIBLE, EngineIncompatibleError

    try:
        with _sigterm_unwinds():
            result = build_engine(
                args.model,
                args.backend,
                args.precision,
                args.cache,
                calibration=args.calibration,
                max_batch_size=args.max_batch_size,
                max_top1_drop=args.max_top1_drop,
                min_cosine=args.min_cosine,
                model_sha256=args.model_sha256,
                calibration_sha256=args.calibration_sha256,
                validation=args.validation,
                gate_outputs=args.gate_outputs,
                progress=_progress(),
                probe_set=args.probe_set,
                probe_set_sha256=args.probe_set_sha256,
            )
    except AccuracyGateError as error:
        print(error.report.model_dump_json(by_alias=True, indent=2), file=sys.stderr)
        return _fail(args, str(error), 1)
    except EngineIncompatibleError as error:
        return _fail(args, str(error), EXIT_ENGINE_INCOMPATIBLE)
    except (BuildError, OSError) as error:
        return _fail(args, f"the build failed: {error}; nothing was published", 1)
    except BUILD_ERRORS as error:
        return _fail(args, str(error), 2)
    except _Terminated:
        return _fail(args, "the build was stopped (SIGTERM); nothing was published", 143)
    return result.digest, result.manifest, result.cache_hit


def _print_result(
    args: argparse.Namespace, digest: str, manifest: EngineManifest, hit: bool
) -> None:
    """The digest (or with `--json` the manifest) on stdout, and the termination message."""
    from kubeinfer.runtime.building.engine_build import input_bytes_per_row

    row_bytes = input_bytes_per_row(manifest.inputs)
    sizes = {} if row_bytes is None else {"inputBytesPerRow": row_bytes}
    if args.termination_message_path:
        Path(args.termination_message_path).write_text(termination_message(digest, manifest, hit))
    if args.json:
        report = {**manifest.to_wire(), "cacheHit": hit, **sizes}
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(digest)
