"""The sweep's I/O: the engine to serve (built from an ONNX model through the cache, or
one already built), then for each setting a real `kubeinfer serve` on a free loopback
port, offered the traffic by perf_analyzer (`perf`; a mix of request sizes, which it
cannot send, by our own client, `load`), measured from both sides (the client's
throughput and latencies; the server's CPU, answered requests and batch-size histogram
over the same run, `server_side`), then stopped.

One server per point: every batching setting is fixed when `kubeinfer serve` starts, and
a fresh process also keeps one point's queue from spilling into the next one's window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from kubeinfer.cli.tune import perf
from kubeinfer.cli.tune.frontier import Measurement, Setting
from kubeinfer.cli.tune.load import (
    EncodedRequest,
    LoadGenError,
    encode_json_tensors,
    run_closed_loop,
    run_open_loop,
)
from kubeinfer.cli.tune.server import HOST, ServerFailed, ServerProcess, ServerSpec, free_port
from kubeinfer.cli.tune.server_side import Snapshot, between, snapshot
from kubeinfer.cli.tune.traffic import Arrival, RowsMix, sample_rows

if TYPE_CHECKING:
    from kubeinfer.runtime.engine_manifest import EngineManifest, TensorInfo

MODEL_NAME = "tune"
DISTINCT_REQUESTS_PER_SIZE = 4
"""Distinct request bodies of each size (random data), sent in turn."""
CLOSED_LOOP_SEQUENCE = 64
"""Request sizes drawn from the mix for a closed loop, which its clients cycle through."""


class TuneError(Exception):
    """What `kubeinfer tune` cannot do with its input; the message says why."""


# --------------------------------------------------------------------------- the engine


@dataclass(frozen=True)
class TuneEngine:
    """The engine every point serves: a verified cache entry."""

    digest: str
    cache: Path
    manifest: EngineManifest
    built_now: bool


def prepare_engine(
    model: Path,
    cache: Path | None,
    backend: str,
    precision: str,
    max_batch_size: int,
    progress: Callable[[str], None],
) -> TuneEngine:
    """An ONNX file is built into `cache` (a hit when it is there already) with a batch
    profile up to `max_batch_size`; an engine directory of a cache
    (`CACHE/engines/<hex>`) is resolved and verified where it is, and must accept batches
    of `max_batch_size`."""
    from kubeinfer.runtime.building.engine_build import BUILD_ERRORS, build_engine
    from kubeinfer.runtime.engine_cache import (
        EngineCacheError,
        check_compatible,
        resolve_engine,
    )
    from kubeinfer.runtime.engine_manifest import MANIFEST_FILE

    if model.is_dir():
        if not (model / MANIFEST_FILE).is_file() or model.parent.name != "engines":
            raise TuneError(
                f"{model} is a directory but not an engine of a cache (CACHE/engines/<hex> "
                f"holding {MANIFEST_FILE}); give an ONNX file or such a directory"
            )
        try:
            resolved = resolve_engine(model.parent.parent, f"sha256:{model.name}")
            check_compatible(resolved)
        except EngineCacheError as error:
            raise TuneError(str(error)) from None
        largest = resolved.manifest.key.batch_profile.max
        if max_batch_size > largest:
            raise TuneError(
                f"the engine accepts batches up to {largest}; --max-batch-sizes asks for "
                f"{max_batch_size} (build it with --max-batch-size {max_batch_size})"
            )
        return TuneEngine(resolved.digest, model.parent.parent, resolved.manifest, False)
    if not model.is_file():
        raise TuneError(f"no model at {model}: give an ONNX file or an engine directory")
    if cache is None:
        raise TuneError("building an ONNX model needs a cache directory")
    try:
        result = build_engine(
            str(model), backend, precision, cache, max_batch_size=max_batch_size, progress=progress
        )
    except BUILD_ERRORS as error:
        raise TuneError(f"the engine build failed: {error}") from None
    return TuneEngine(result.digest, cache, result.manifest, not result.cache_hit)


# --------------------------------------------------------------------------- requests


def _input_rows(info: TensorInfo, rows: int, rng: np.random.Generator) -> np.ndarray:
    from kubeinfer.runtime.engines.base import V2_TO_NUMPY

    if info.datatype not in V2_TO_NUMPY:
        raise TuneError(f"input {info.name!r} is {info.datatype}: tune generates numbers only")
    item = info.shape[1:]
    if any(d < 0 for d in item):
        raise TuneError(f"input {info.name!r} has a dynamic dimension besides the batch one")
    dtype = V2_TO_NUMPY[info.datatype]
    shape = (rows, *item)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(dtype)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, size=shape).astype(dtype)  # small: valid ids, indices
    return rng.standard_normal(shape).astype(dtype)


def request_pool(
    manifest: EngineManifest, sizes: Sequence[int], port: int, seed: int
) -> dict[int, list[EncodedRequest]]:
    """For each size, a few distinct JSON requests of random inputs, for one server."""
    rng = np.random.default_rng(seed)
    return {
        rows: [
            encode_json_tensors(
                HOST,
                port,
                MODEL_NAME,
                [(i.name, i.datatype, _input_rows(i, rows, rng)) for i in manifest.inputs],
            )
            for _ in range(DISTINCT_REQUESTS_PER_SIZE)
        ]
        for rows in sorted(set(sizes))
    }


# --------------------------------------------------------------------------- the traffic


@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` clients, each sending its next request when its last one returns."""

    concurrency: int
    mix: RowsMix


@dataclass(frozen=True)
class OpenLoop:
    """Requests sent at their arrival times, whatever the server's pace."""

    arrivals: tuple[Arrival, ...]


Traffic = ClosedLoop | OpenLoop


def traffic_sizes(traffic: Traffic) -> list[int]:
    if isinstance(traffic, ClosedLoop):
        return list(traffic.mix.rows)
    return sorted({a.rows for a in traffic.arrivals})


@dataclass(frozen=True)
class Timing:
    warmup_seconds: float
    duration_seconds: float
    drain_timeout_seconds: float = 10.0


# --------------------------------------------------------------------------- one point


@dataclass(frozen=True)
class ServerOptions:
    """What every point's server shares besides its batching settings."""

    intra_op_threads: int | None = None
    max_queue_size: int | None = None
    ready_timeout_seconds: float = 300.0


def serve_spec(engine: TuneEngine, setting: Setting, options: ServerOptions) -> ServerSpec:
    port = free_port()
    command = [
        sys.executable, "-m", "kubeinfer.cli", "serve",
        "--engine", engine.digest, "--cache", str(engine.cache.resolve()),
        "--model-name", MODEL_NAME, "--host", HOST, "--port", str(port),
        "--max-batch-size", str(setting.max_batch_size),
        "--max-queue-delay-microseconds", str(setting.max_queue_delay_microseconds),
        "--execution-slots", str(setting.execution_slots),
        "--drain-grace-period-seconds", "5",
    ]  # fmt: skip
    if options.intra_op_threads is not None:
        command += ["--intra-op-threads", str(options.intra_op_threads)]
    if options.max_queue_size is not None:
        command += ["--max-queue-size", str(options.max_queue_size)]
    return ServerSpec(
        "kubeinfer", command, port, MODEL_NAME, metrics_url=f"http://{HOST}:{port}/metrics"
    )


def _perf_samples(
    manifest: EngineManifest, rng: np.random.Generator
) -> list[dict[str, np.ndarray]]:
    """Rows of random inputs, one per entry of perf_analyzer's input data."""
    count = DISTINCT_REQUESTS_PER_SIZE * 4
    arrays = {i.name: _input_rows(i, count, rng) for i in manifest.inputs}
    return [{name: array[k] for name, array in arrays.items()} for k in range(count)]


def _by_perf_analyzer(
    engine: TuneEngine, setting: Setting, port: int, traffic: Traffic, timing: Timing,
    workdir: Path, around: Callable[[], object],
) -> Measurement:  # fmt: skip
    """One request size: perf_analyzer offers the traffic (an open loop replays the
    arrivals' gaps) over JSON, three windows making up the measured duration."""
    [rows] = traffic_sizes(traffic)
    if isinstance(traffic, ClosedLoop):
        load = perf.Load(rows=rows, concurrency=traffic.concurrency)
    else:
        workdir.mkdir(parents=True, exist_ok=True)
        schedule = workdir / "intervals.txt"
        schedule.write_text(perf.intervals([a.offset_seconds for a in traffic.arrivals]))
        load = perf.Load(rows=rows, intervals_file=schedule)
    result = perf.run(
        perf.Target(f"{HOST}:{port}", MODEL_NAME, "http", "json"), load,
        _perf_samples(engine.manifest, np.random.default_rng(0)), timing.duration_seconds / 3,
        workdir, timing.warmup_seconds, around,
    )  # fmt: skip
    return Measurement(
        setting, result.window_seconds, result.requests_per_second, result.rows_per_second, 0,
        result.p50_milliseconds, result.p99_milliseconds,
        load_cpu_seconds=result.client_cpu_seconds,
    )  # fmt: skip


def _by_own_client(
    engine: TuneEngine, setting: Setting, port: int, traffic: Traffic, timing: Timing,
    around: Callable[[], object],
) -> Measurement:  # fmt: skip
    """Several request sizes: our own client (`load`), the hooks at its window's edges."""
    pool = request_pool(engine.manifest, traffic_sizes(traffic), port, seed=0)
    if isinstance(traffic, ClosedLoop):
        sizes = sample_rows(traffic.mix, CLOSED_LOOP_SEQUENCE, np.random.default_rng(1))
        requests = [pool[rows][i % DISTINCT_REQUESTS_PER_SIZE] for i, rows in enumerate(sizes)]
        run = asyncio.run(
            run_closed_loop(
                HOST, port, requests, traffic.concurrency, timing.warmup_seconds,
                timing.duration_seconds, around, around,
            )
        )  # fmt: skip
    else:
        order = sorted(pool)
        requests = [r for rows in order for r in pool[rows]]
        first = {rows: order.index(rows) * DISTINCT_REQUESTS_PER_SIZE for rows in order}
        schedule = [
            (a.offset_seconds, first[a.rows] + n % DISTINCT_REQUESTS_PER_SIZE)
            for n, a in enumerate(traffic.arrivals)
        ]
        run = asyncio.run(
            run_open_loop(
                HOST, port, requests, schedule, timing.warmup_seconds, timing.duration_seconds,
                timing.drain_timeout_seconds, on_window_start=around, on_window_end=around,
            )
        )  # fmt: skip
    return Measurement(
        setting, run.window_s, run.throughput, run.completed_rows / run.window_s, run.errors,
        run.percentile_ms(50), run.percentile_ms(99), load_cpu_seconds=run.client_cpu_s,
        error_sample=run.error_samples[0] if run.error_samples else None,
    )  # fmt: skip


def _failed(setting: Setting, timing: Timing, why: str) -> Measurement:
    nan = math.nan
    return Measurement(setting, timing.duration_seconds, 0.0, 0.0, 0, nan, nan, failure=why)


def measure_point(
    engine: TuneEngine,
    setting: Setting,
    traffic: Traffic,
    timing: Timing,
    options: ServerOptions,
    log_dir: Path,
) -> Measurement:
    """Serves the engine with `setting`, offers it the traffic, measures the window."""
    spec = serve_spec(engine, setting, options)
    snapshots: list[Snapshot] = []
    try:
        with ServerProcess(spec, log_dir, options.ready_timeout_seconds) as server:
            assert server.process is not None
            pid = server.process.pid

            def around() -> None:
                snapshots.append(snapshot([pid], spec.metrics_url))

            if len(traffic_sizes(traffic)) == 1:
                workdir = log_dir / f"perf-analyzer-{spec.port}"
                measured = _by_perf_analyzer(
                    engine, setting, spec.port, traffic, timing, workdir, around
                )
            else:
                measured = _by_own_client(engine, setting, spec.port, traffic, timing, around)
    except ServerFailed as error:
        lines = str(error).strip().splitlines()
        return _failed(setting, timing, f"{lines[0]} {lines[-1] if len(lines) > 1 else ''}")
    except perf.PerfAnalyzerFailed as error:
        return _failed(setting, timing, str(error))
    except (LoadGenError, OSError) as error:
        return _failed(setting, timing, f"the load broke off: {error}")
    side = between(*snapshots[-2:]) if len(snapshots) >= 2 else None
    answered = measured.requests_per_second > 0 or measured.errors > 0
    return dataclasses.replace(
        measured,
        requests_per_cpu_second=side.requests_per_cpu_second if side else None,
        mean_batch_rows=side.mean_batch_rows if side else None,
        failure=None if answered else "no request was answered in the window",
    )
