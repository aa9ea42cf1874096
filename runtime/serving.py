"""Serving one model: the data plane assembled once (`assemble`) and both transports run
over it until SIGTERM (`serve_transports`): the composition root of `kubeinfer serve`.

`assemble` is the one place that makes the data plane's parts (the metrics registry, the
batcher, the shadow controller with its quality watch, the codec threads) and joins them
in a `DataPlane`, with the maxBatchSize that what the load found of the model allows
(`engines.batching_probe`: a model that does not batch, or is not known to, is served one
request per run, and the log says so and why); the HTTP app and the gRPC service are each
handed that one object and only translate their wire forms to it (MLServer's
`MLServer.start`, KServe's `ModelServer`). `serve_transports` owns its lifecycle:
started before either transport listens, drained on SIGTERM while both still answer what
was admitted, closed once both have stopped.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.runtime.batching.queue import Batcher
from kubeinfer.runtime.batching.shapes import ShapePlan
from kubeinfer.runtime.dataplane import DataPlane, with_request_limit
from kubeinfer.runtime.engines.base import Engine
from kubeinfer.runtime.engines.batching_probe import BatchingProbe, effective_max_batch_size
from kubeinfer.runtime.http.app import create_app
from kubeinfer.runtime.http.server import HttpServer
from kubeinfer.runtime.known_answers.runner import KnownAnswerCheck
from kubeinfer.runtime.metrics import GpuMemoryReader, RuntimeMetrics
from kubeinfer.runtime.protocol.codec_pool import CodecPool
from kubeinfer.runtime.shadow.controller import ShadowController

log = logging.getLogger(__name__)


class CannotListen(OSError):
    """A port of the configuration cannot be listened on (a start-up error)."""


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


def _say_batching_found(config: RuntimeConfig, probe: BatchingProbe, effective: int) -> None:
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


def assemble(
    config: RuntimeConfig,
    engine: Engine,
    *,
    gpu_memory: GpuMemoryReader | None = None,
    clock: Callable[[], float] = time.monotonic,
    probe: BatchingProbe | None = None,
    known_answers: KnownAnswerCheck | None = None,
) -> DataPlane:
    """The data plane of one model on `engine` (the caller's: never closed here), not yet
    started; `clock` (monotonic) is every part's; `probe` what the load found of whether
    the model batches (None: not probed, served as configured). Raises `UnsupportedModel`
    when the configured shape batching cannot be done on this model
    (`batching.shapes.ShapePlan`)."""
    configured_max_batch_size = config.batching.max_batch_size
    if probe is not None:
        effective = with_batching_found(config, probe)
        _say_batching_found(config, probe, effective.batching.max_batch_size)
        config = effective
    config = with_request_limit(config, engine)
    metrics = RuntimeMetrics(config.model_name, config.model_version, gpu_memory)
    batcher = Batcher(
        engine,
        config.batching,
        clock=clock,
        observer=metrics,
        stuck_liveness_seconds=config.engine_stuck_liveness_seconds,
        slo_p99_latency_milliseconds=config.slo_p99_latency_milliseconds,
        shapes=ShapePlan(engine.inputs, engine.outputs, config.batching, config.input_shapes),
        model_name=config.model_name,
        probe=probe,
        configured_max_batch_size=configured_max_batch_size,
    )
    shadow = ShadowController(config, metrics.registry, clock=clock)
    codec = CodecPool(clock=clock)
    return DataPlane(
        config, engine, batcher, metrics, clock, shadow=shadow, codec=codec,
        known_answers=known_answers,
    )  # fmt: skip


async def serve_transports(
    dataplane: DataPlane,
    *,
    on_started: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Serves `dataplane` over HTTP, and over gRPC when `grpcPort` is set, until
    SIGTERM/SIGINT (or `stop` is set), drains, and returns the exit code (0).

    The gRPC server listens first (a port taken is `CannotListen`); `on_started` gets the
    HTTP port. On the stop: the gRPC server's drain begins (new RPCs refused, those in
    flight answered), the data plane's (`DataPlane.drain`), then the HTTP server's
    (`HttpServer.close`), all within `drainGracePeriodSeconds`."""
    from kubeinfer.runtime.grpc_service.server import GrpcServer

    config = dataplane.config
    grace = config.drain_grace_period_seconds
    stop = stop or asyncio.Event()
    grpc_server = GrpcServer(dataplane) if config.grpc_port is not None else None
    http_server = HttpServer(create_app(dataplane), config)
    grpc_stopping: asyncio.Task[None] | None = None
    await dataplane.start()
    signals = _Signals(stop)
    try:
        if grpc_server is not None:
            try:
                await grpc_server.start()
            except OSError as error:
                raise CannotListen(str(error)) from None
        try:
            port = await http_server.start()
        except OSError as error:
            raise CannotListen(f"HTTP on {config.host}:{config.http_port}: {error}") from None
        if on_started is not None:
            on_started(port)
        await stop.wait()
        started = time.monotonic()
        if grpc_server is not None:
            grpc_stopping = asyncio.create_task(grpc_server.stop(grace))
        await dataplane.drain(grace)
        await http_server.close(started + grace)
        log.info("Drained seconds=%.3f", time.monotonic() - started)
    finally:
        signals.restore()
        await http_server.cleanup()
        log.info("Stopped serving model=%s", config.model_name)
        if grpc_server is not None:  # also when serving failed: it must not outlive it
            await (grpc_stopping or grpc_server.stop(grace))
        await dataplane.close()
    return 0


class _Signals:
    """SIGTERM and SIGINT set `stop` (and a second one does nothing more) until
    `restore`."""

    NUMBERS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        for signum in self.NUMBERS:
            self._loop.add_signal_handler(signum, stop.set)

    def restore(self) -> None:
        for signum in self.NUMBERS:
            self._loop.remove_signal_handler(signum)
