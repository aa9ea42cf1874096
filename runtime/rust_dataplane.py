"""`kubeinfer serve`'s data plane: the model served by the Rust extension
`kubeinfer_dataplane` (runtime/native; docs/architecture.md draws the request path).

The Python side loads the engine, checks its known answers and finds out whether it
batches (`serve_command.load_engine_for`, `known_answers`, `engines.batching_probe`). Then
`server_options` renders the RuntimeConfig into the server's options (`ServerOptions` in
crates/server: camelCase JSON), and `serve` starts `kubeinfer_dataplane.Server` on the
engine, not ready; it is made ready only when the known-answer check allows serving
(`KnownAnswerCheck.serving_allowed`). The server owns every request from its first byte
to its answer (transports, decoding, admission, the queue, batching, metrics) on its own
threads, taking the GIL once per batch to run it on one of the engine's execution slots.
SIGTERM or SIGINT drains it (`drainGracePeriodSeconds`).

The admin routes whose data is Python's are answered by `AdminRoutes`, which the server
calls with the GIL on those routes only (never on an infer request): `GET /v2/known-answers`
and its `POST`, which runs the set again with each probe batch waiting until the Rust
scheduler is idle (`Server.idle`: the lowest priority), and `/v2/shadow`, `/v2/quality`
and `/v2/quality/exemplars`: from the mirrors where a mirror target file is followed
(`rust_mirroring.RustMirrors`: the server samples each answered request and hands a
batch's sampled ones over inside its one GIL crossing), else saying nothing is mirrored.
`GET /v2/batching` is the Rust scheduler's, with what the load found (`batching_found`).
The GPU memory gauges are read through NVML on a thread of their own (`GpuMemoryGauges`)
and set in the server's registry, never on a request's path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubeinfer.contract.runtime_config import (
    UNSIZED_REQUEST_BYTES,
    RuntimeConfig,
    request_bytes_limit,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from kubeinfer.runtime.engines.base import Engine, TensorSpec
    from kubeinfer.runtime.engines.gpu_memory import GpuMemory

    GpuMemoryRead = Callable[[], Iterable[GpuMemory] | None]
    """`GpuMemoryReader.read` (kubeinfer.runtime.engines.gpu_memory): None where there is no GPU."""
    from kubeinfer.runtime.engines.batching_probe import BatchingProbe
    from kubeinfer.runtime.known_answers.comparison import Verdict
    from kubeinfer.runtime.known_answers.runner import KnownAnswerCheck
    from kubeinfer.runtime.rust_mirroring import RustMirrors

log = logging.getLogger("kubeinfer.serve")

PRIORITY_LEVELS = 3
"""Triton's priority levels: a request's `priority` parameter 1 (most urgent) to this,
0 or none the default level; under overload the least urgent queued request is shed
first."""

DEFAULT_PRIORITY_LEVEL = 1
"""The level of a request that names none: the most urgent, so that only work a client
marks as able to wait (levels 2 and 3) is ever shed for it. A default above 1 would make
every queued request sheddable, and a full queue would read and decode the body of every
newcomer (its level is inside it) only to refuse most of them."""

GPU_MEMORY_READ_INTERVAL_SECONDS = 5.0
"""How often the GPU memory gauges are read (NVML; a scrape interval's order)."""

WORKER_THREADS = 2
"""The server's tokio threads (connections, decoding, the scheduler's driver): the
engine's own threads do the compute."""


def batching_options(config: RuntimeConfig, engine: Engine) -> dict[str, Any]:
    """The batching policy as the Rust scheduler takes it (`BatchingConfig`): execution
    slots from the engine's default where the policy sets none, the largest batch bounded
    by the engine's, preferred sizes kept within it, the SLO beside it, and the priority
    levels."""
    policy = config.batching
    max_batch_size = min(policy.max_batch_size, engine.max_batch_size)
    return {
        "policy": policy.policy.value,
        "maxBatchSize": max_batch_size,
        "maxQueueDelayMicroseconds": policy.max_queue_delay_microseconds,
        "preferredBatchSizes": [s for s in policy.preferred_batch_sizes if s <= max_batch_size],
        "executionSlots": policy.execution_slots or engine.default_execution_slots,
        "maxQueueSize": policy.max_queue_size,
        "defaultTimeoutMilliseconds": policy.default_timeout_milliseconds,
        "shapeBatching": policy.shape_batching.value,
        "shapeBuckets": list(policy.shape_buckets),
        "sloMarginPercent": policy.slo_margin_percent,
        "sloP99LatencyMilliseconds": config.slo_p99_latency_milliseconds,
        "priorityLevels": PRIORITY_LEVELS,
        "defaultPriorityLevel": DEFAULT_PRIORITY_LEVEL,
    }


def batching_found(probe: BatchingProbe | None, configured_max_batch_size: int) -> dict[str, Any]:
    """What `GET /v2/batching` adds to the Rust scheduler's status: what the load's probe
    found of whether the model batches (`batchingProbe`: modelBatches and its reason) and
    the maxBatchSize the configuration asked for (`configuredMaxBatchSize`), as
    `ServerOptions` takes them."""
    found: dict[str, Any] = {"configuredMaxBatchSize": configured_max_batch_size}
    if probe is not None:
        found["batchingProbe"] = {"batches": probe.batches, "reason": probe.reason}
    return found


def server_options(
    config: RuntimeConfig,
    engine: Engine,
    probe: BatchingProbe | None = None,
    configured_max_batch_size: int | None = None,
) -> dict[str, Any]:
    """`ServerOptions` for `config` (the batching found already applied,
    `batching_probe.with_batching_found`) on `engine`: the request limit
    (`request_limit`), pad values from the input shapes, what the load found of the
    batching (`batching_found`), and readiness held off until `serve` sets it."""
    configured = configured_max_batch_size or config.batching.max_batch_size

    pad_values = {s.name: s.pad_value for s in config.input_shapes if s.pad_value is not None}
    return {
        "host": config.host,
        "httpPort": config.http_port,
        "grpcPort": config.grpc_port,
        "batching": batching_options(config, engine),
        "maxRequestBytes": request_limit(config, engine),
        "headerReadTimeoutSeconds": config.header_read_timeout_seconds,
        "bodyReadTimeoutSeconds": config.body_read_timeout_seconds,
        "engineStuckLivenessSeconds": config.engine_stuck_liveness_seconds,
        "drainGracePeriodSeconds": config.drain_grace_period_seconds,
        "padValues": pad_values,
        **batching_found(probe, configured),
        "startReady": False,
        "workerThreads": WORKER_THREADS,
    }


def largest_request_bytes(specs: tuple[TensorSpec, ...], max_rows: int) -> int | None:
    """The request body limit a model's inputs call for (`request_bytes_limit`: `max_rows`
    rows at each input's largest shape, as JSON); None when an input has no size in bytes
    (a string input, or a largest shape no range gives)."""
    per_row = 0
    for spec in specs:
        shape = spec.largest_item_shape
        if shape is None or spec.dtype.kind == "O":
            return None
        per_row += math.prod(shape) * spec.dtype.itemsize
    return request_bytes_limit(per_row, max_rows)


def request_limit(config: RuntimeConfig, engine: Engine) -> int:
    """The request body limit: `maxRequestBytes` as configured, else the model's largest
    allowed request (`largest_request_bytes`), else `UNSIZED_REQUEST_BYTES`."""
    if config.max_request_bytes is not None:
        return config.max_request_bytes
    limit = largest_request_bytes(engine.inputs, config.batching.max_batch_size)
    return limit or UNSIZED_REQUEST_BYTES


class CannotServe(Exception):
    """The Rust server could not start (a port taken, options it refuses, a model whose
    shape batching it cannot do): a start-up error, its message saying why."""


def serve(
    config: RuntimeConfig,
    engine: Engine,
    known_answers: KnownAnswerCheck,
    gpu_memory: GpuMemoryRead | None = None,
) -> int:
    """Serves the loaded `engine` (the caller's: closed by the caller) until SIGTERM or
    SIGINT, then drains; returns the exit code (0). The known answers are checked first
    (before readiness: a failure holds it false for good), then whether the model batches
    is found out by trying it (once the engine answered its known answers, which the trial
    runs would not catch). Raises `CannotServe` when the server cannot start."""
    from kubeinfer.runtime.engines.batching_probe import (
        probe_batching,
        say_batching_found,
        with_batching_found,
    )

    checking = time.monotonic()
    known_answers.run()
    probing = time.monotonic()
    probe = probe_batching(engine, config.input_shapes)
    found = with_batching_found(config, probe)
    say_batching_found(config, probe, found.batching.max_batch_size)
    options = server_options(found, engine, probe, config.batching.max_batch_size)
    config = found
    starting = time.monotonic()
    server, admin = start_serving(config, engine, known_answers, options)
    started = time.monotonic()
    _say_buffers(engine, options["batching"]["executionSlots"])
    gpu_gauges = GpuMemoryGauges(server, gpu_memory)
    gpu_gauges.start()
    stop = threading.Event()
    previous = {n: signal.signal(n, lambda *_: stop.set()) for n in _STOP_SIGNALS}
    try:
        allowed = known_answers.serving_allowed
        server.set_ready(allowed, None if allowed else known_answers.hold_reason)
        log.info(
            "Serving through the Rust data plane model=%s port=%d max_batch_size=%d "
            "execution_slots=%d ready=%s known_answers_seconds=%.3f "
            "batching_probe_seconds=%.3f server_start_seconds=%.3f",
            config.model_name, server.http_port, options["batching"]["maxBatchSize"],
            options["batching"]["executionSlots"], known_answers.serving_allowed,
            probing - checking, starting - probing, started - starting,
        )  # fmt: skip
        while not stop.wait(1.0):  # a timed wait, so the signal handler runs promptly
            pass
        log.info("Draining model=%s", config.model_name)
    finally:
        if admin.mirrors is not None:
            admin.mirrors.stop()  # mirrored work cancelled first: it never holds up a drain
        gpu_gauges.stop()
        on_engine = server.shutdown()
        admin.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        log.info("Stopped serving model=%s gil_crossings=%d", config.model_name,
                 _gil_crossings())  # fmt: skip
    if on_engine:
        # A slot's thread is still inside the engine (a stuck batch): closing the engine
        # under it could crash, and the interpreter would wait for it at exit forever.
        log.error("Exiting with a batch still running on the engine")
        logging.shutdown()
        os._exit(0)
    return 0


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def start_serving(
    config: RuntimeConfig,
    engine: Engine,
    known_answers: KnownAnswerCheck,
    options: dict[str, Any],
) -> tuple[Any, AdminRoutes]:
    """The server started on `engine` with `options` (not ready), its admin routes wired
    to it (the idle check, the verdicts published, the latest one at once) and the mirrors
    following the config's target file, if it names one; `CannotServe` saying why not.
    The caller sets readiness, stops the mirrors, shuts the server down and closes the
    admin routes."""
    admin = AdminRoutes(config.model_version, known_answers)
    server = start_server(options, engine, config.model_name, config.model_version, admin)
    admin.idle = server.idle
    admin.publish = lambda verdict: publish_verdict(server, verdict)
    if known_answers.latest is not None:
        admin.publish(known_answers.latest)
    if config.mirror_target_file:
        from kubeinfer.runtime.rust_mirroring import RustMirrors

        admin.mirrors = RustMirrors(config, server)
        admin.mirrors.start()
    return server, admin


def publish_verdict(server: Any, verdict: Verdict) -> None:
    """A run of the known-answer set in the server's metrics, as the contract names them:
    counted by result; a run that checked sets the failing gauge and each output's error
    ratio, and adds its compute (the server adds the model's labels)."""
    server.metric_add("kubeinfer_known_answer_checks", [("result", verdict.result)], 1.0)
    if not verdict.checked:
        return
    server.metric_set("kubeinfer_known_answers_failing", [], 0.0 if verdict.passed else 1.0)
    server.metric_add("kubeinfer_known_answer_seconds", [], verdict.seconds)
    for output in verdict.outputs:
        server.metric_set(
            "kubeinfer_known_answer_error_ratio", [("output", output.name)], output.error_ratio
        )


def _say_buffers(engine: Engine, slots: int) -> None:
    """Logs the memory the execution slots' buffers hold (the server exports it as
    kubeinfer_engine_buffer_bytes)."""
    from kubeinfer.runtime.engines.base import slot_buffer_bytes

    total = slots * slot_buffer_bytes(engine)
    log.info(
        "Allocated engine buffers slots=%d bytes=%d (%.1f MiB) max_batch_size=%d",
        slots, total, total / 2**20, engine.max_batch_size,
    )  # fmt: skip


def _gil_crossings() -> int:
    """Times the server's threads took the GIL (one per batch, one per slot at start)."""
    import kubeinfer_dataplane

    return int(kubeinfer_dataplane.gil_crossings())


def start_server(
    options: dict[str, Any],
    engine: Engine,
    name: str,
    version: str,
    admin: Callable[[str, str], tuple[int, list[tuple[str, str]], bytes]] | None = None,
) -> Any:
    """`kubeinfer_dataplane.Server` on `engine`, listening, its admin routes answered by
    `admin`; `CannotServe` saying why not (the extension not built here, or the server
    refusing to start)."""
    try:
        import kubeinfer_dataplane
    except ImportError as error:
        raise CannotServe(
            f"the Rust data plane is not installed ({error}); build it with "
            "`make dataplane` (maturin develop --release -m "
            "runtime/native/crates/python/Cargo.toml)"
        ) from None
    try:
        return kubeinfer_dataplane.Server(
            json.dumps(options), engine, model_name=name, model_version=version, admin=admin
        )
    except (RuntimeError, ValueError) as error:  # the server's own sentence: say it as is
        raise CannotServe(str(error)) from None


Answer = tuple[int, list[tuple[str, str]], bytes]
"""An admin route's answer as the server takes it: status, headers, body."""

JSON = [("Content-Type", "application/json")]


def _json(body: Any, status: int = 200) -> Answer:
    return status, JSON, json.dumps(body).encode()


class GpuMemoryGauges:
    """Sets kubeinfer_gpu_memory_used_bytes and _total_bytes in the server's registry from
    `read` (NVML), at start and then every `GPU_MEMORY_READ_INTERVAL_SECONDS` on a thread
    of its own; nothing where there is no GPU (`read` None or answering None). A failing
    read is logged once and the gauges keep their last values."""

    def __init__(self, server: Any, read: GpuMemoryRead | None) -> None:
        self._server, self._read = server, read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False

    def start(self) -> None:
        if self._read is None or not self.update():
            return  # no GPU: the gauges are not exported
        self._thread = threading.Thread(target=self._run, name="kubeinfer-gpu", daemon=True)
        self._thread.start()

    def update(self) -> bool:
        """Reads once and sets the gauges; False where there is no GPU to read."""
        assert self._read is not None
        try:
            devices = self._read()
        except Exception as error:  # NVML failing must not take serving down
            if not self._failed:
                log.warning("Cannot read GPU memory through NVML: %s", error)
            self._failed = True
            return True
        if devices is None:
            return False
        for device in devices:
            labels = [("device", str(device.index)), ("name", device.name)]
            self._server.metric_set("kubeinfer_gpu_memory_used_bytes", labels,
                                    float(device.used_bytes))  # fmt: skip
            self._server.metric_set("kubeinfer_gpu_memory_total_bytes", labels,
                                    float(device.total_bytes))  # fmt: skip
        return True

    def _run(self) -> None:
        while not self._stop.wait(GPU_MEMORY_READ_INTERVAL_SECONDS):
            self.update()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class AdminRoutes:
    """The admin routes whose data is Python's, answered for the Rust server
    (`kubeinfer_dataplane.Server(admin=...)`, called on its threads with the GIL, only on
    these routes). The known answers run on demand on an event loop of its own thread, so
    `KnownAnswerCheck.run_when_idle` allows one run at a time;
    `idle` is the server's (`Server.idle`), set once it started."""

    def __init__(self, serving_version: str, known_answers: KnownAnswerCheck) -> None:
        self._serving_version = serving_version
        self._known_answers = known_answers
        self.idle: Callable[[], bool] = lambda: True
        self.publish: Callable[[Verdict], None] = lambda verdict: None
        """Puts a verdict in the server's metrics (`publish_verdict`), set once it started."""
        self.mirrors: RustMirrors | None = None
        """The mirrors, where a mirror target file is followed (`rust_mirroring`)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kubeinfer-admin", daemon=True
        )
        self._thread.start()

    def __call__(self, method: str, path: str) -> Answer:
        if path == "/v2/known-answers":
            return self.known_answers(run=method == "POST")
        mirrors = self.mirrors
        if mirrors is not None and path == "/v2/shadow":
            return _json(mirrors.status())
        if mirrors is not None and path == "/v2/quality":
            return _json(mirrors.quality_status())
        if mirrors is not None and path == "/v2/quality/exemplars":
            return 200, EXEMPLARS_HEADERS, mirrors.quality_exemplars()
        if path == "/v2/shadow":
            from kubeinfer.runtime.shadow.aggregates import inactive_status

            return _json(inactive_status(self._serving_version))
        if path == "/v2/quality":
            from kubeinfer.runtime.shadow.quality import inactive_quality_status

            return _json(inactive_quality_status(self._serving_version))
        if path == "/v2/quality/exemplars":
            from kubeinfer.runtime.shadow.exemplars import encode_exemplars

            return 200, EXEMPLARS_HEADERS, encode_exemplars([])
        return _json({"error": f"no route {method} {path}"}, 404)

    def known_answers(self, run: bool) -> Answer:
        """The verdicts (`known_answers_body`); `run`: the set run again first, each probe
        batch once the server is idle, its verdict logged (`log_verdict`)."""
        from kubeinfer.runtime.known_answers.runner import known_answers_body, log_verdict

        check = self._known_answers
        if run:
            running = check.run_when_idle(lambda: self.idle())
            verdict = asyncio.run_coroutine_threadsafe(running, self._loop).result()
            log_verdict(verdict, "on demand")
            self.publish(verdict)
        return _json(known_answers_body(check))

    def close(self) -> None:
        """Stops the admin loop's thread; the server has stopped calling."""
        self.idle = lambda: True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


EXEMPLARS_HEADERS = [
    ("Content-Type", "application/octet-stream"),
    ("Content-Disposition", 'attachment; filename="exemplars.npz"'),
    ("Cache-Control", "no-store"),
]
"""The headers of `GET /v2/quality/exemplars` (a download, never cached)."""
