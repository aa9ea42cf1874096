"""`kubeinfer serve --data-plane rust`: the same model served by the data plane in Rust
(the extension `kubeinfer_dataplane`, runtime/native), in place of the Python one.

The Python side does what it does for the Python data plane up to the transports: the
engine is loaded, its known answers checked and whether it batches found out (the same
code, `serve_command.load_engine_for`, `known_answers`, `engines.batching_probe`). Then
`server_options` renders the RuntimeConfig into the server's options (`ServerOptions` in
crates/server: camelCase JSON), with the batching resolved as the Python batcher resolves
it, and `serve` starts `kubeinfer_dataplane.Server` on the engine, not ready; it is made
ready only when the known-answer check allows serving (`KnownAnswerCheck.serving_allowed`).
The server answers from Rust threads, taking the GIL once per batch to run it on one of the
engine's execution slots. SIGTERM or SIGINT drains it (`drainGracePeriodSeconds`).

The admin routes whose data is Python's are answered by `AdminRoutes`, which the server
calls with the GIL on those routes only (never on an infer request): `GET /v2/known-answers`
and its `POST`, which runs the set again with each probe batch waiting until the Rust
scheduler is idle (`Server.idle`: the lowest priority, as on the Python data plane), and
`/v2/shadow`, `/v2/quality` and `/v2/quality/exemplars`: from the mirrors where a mirror
target file is followed (`rust_mirroring.RustMirrors`: the server samples each answered
request and hands a batch's sampled ones over inside its one GIL crossing), else saying
nothing is mirrored.
`GET /v2/batching` is the Rust scheduler's, with what the load found (`batching_found`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeinfer.contract.runtime_config import RuntimeConfig
    from kubeinfer.runtime.engines.base import Engine
    from kubeinfer.runtime.engines.batching_probe import BatchingProbe
    from kubeinfer.runtime.known_answers.comparison import Verdict
    from kubeinfer.runtime.known_answers.runner import KnownAnswerCheck
    from kubeinfer.runtime.rust_mirroring import RustMirrors

log = logging.getLogger("kubeinfer.serve")

PRIORITY_LEVELS = 1
"""The Python data plane has one priority level: every request is at it."""

WORKER_THREADS = 2
"""The server's tokio threads (connections, decoding, the scheduler's driver): the
engine's own threads do the compute."""


def batching_options(config: RuntimeConfig, engine: Engine) -> dict[str, Any]:
    """The batching policy as the Rust scheduler takes it (`BatchingConfig`): execution
    slots from the engine's default where the policy sets none (as `SlotRunner` does), the
    largest batch bounded by the engine's, preferred sizes kept within it, the SLO beside
    it, and the one priority level."""
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
        "defaultPriorityLevel": PRIORITY_LEVELS,
    }


def batching_found(probe: BatchingProbe | None, configured_max_batch_size: int) -> dict[str, Any]:
    """What `GET /v2/batching` adds to the Rust scheduler's status, as the Python batcher
    does (`Batcher.batching_status`): what the load's probe found of whether the model
    batches (`batchingProbe`: modelBatches and its reason) and the maxBatchSize the
    configuration asked for (`configuredMaxBatchSize`), as `ServerOptions` takes them."""
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
    `serving.with_batching_found`) on `engine`: the request limit resolved as the Python
    data plane resolves it (`dataplane.request_limit`), pad values from the input shapes,
    what the load found of the batching (`batching_found`), and readiness held off until
    `serve` sets it."""
    from kubeinfer.runtime.dataplane import request_limit

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


class CannotServe(Exception):
    """The Rust server could not start (a port taken, options it refuses, a model whose
    shape batching it cannot do): a start-up error, its message saying why."""


def serve(config: RuntimeConfig, engine: Engine, known_answers: KnownAnswerCheck) -> int:
    """Serves the loaded `engine` (the caller's: closed by the caller) through the Rust
    data plane until SIGTERM or SIGINT, then drains; returns the exit code (0). The known
    answers are checked and the batching probed first, as for the Python data plane.
    Raises `CannotServe` when the server cannot start."""
    from kubeinfer.runtime.engines.batching_probe import probe_batching
    from kubeinfer.runtime.serving import _say_batching_found, with_batching_found

    known_answers.run()  # before readiness: a failure holds it false for good
    probe = probe_batching(engine, config.input_shapes)
    found = with_batching_found(config, probe)
    _say_batching_found(config, probe, found.batching.max_batch_size)
    options = server_options(found, engine, probe, config.batching.max_batch_size)
    config = found
    admin = AdminRoutes(config.model_version, known_answers)
    server = start_server(options, engine, config.model_name, config.model_version, admin)
    admin.idle = server.idle
    admin.publish = lambda verdict: publish_verdict(server, verdict)
    if known_answers.latest is not None:
        admin.publish(known_answers.latest)
    _say_buffers(engine, options["batching"]["executionSlots"])
    if config.mirror_target_file:
        from kubeinfer.runtime.rust_mirroring import RustMirrors

        admin.mirrors = RustMirrors(config, server)
        admin.mirrors.start()
    stop = threading.Event()
    previous = {n: signal.signal(n, lambda *_: stop.set()) for n in _STOP_SIGNALS}
    try:
        allowed = known_answers.serving_allowed
        server.set_ready(allowed, None if allowed else known_answers.hold_reason)
        log.info(
            "Serving through the Rust data plane model=%s port=%d max_batch_size=%d "
            "execution_slots=%d ready=%s",
            config.model_name, server.http_port, options["batching"]["maxBatchSize"],
            options["batching"]["executionSlots"], known_answers.serving_allowed,
        )  # fmt: skip
        while not stop.wait(1.0):  # a timed wait, so the signal handler runs promptly
            pass
        log.info("Draining model=%s", config.model_name)
    finally:
        if admin.mirrors is not None:
            admin.mirrors.stop()  # mirrored work cancelled first: it never holds up a drain
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


class AdminRoutes:
    """The admin routes whose data is Python's, answered for the Rust server
    (`kubeinfer_dataplane.Server(admin=...)`, called on its threads with the GIL, only on
    these routes). The known answers run on demand on an event loop of its own thread, so
    `KnownAnswerCheck.run_when_idle` (one run at a time) is the Python data plane's own;
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
        batch once the server is idle, its verdict logged as the Python data plane's."""
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
"""The headers of `GET /v2/quality/exemplars`, the Python data plane's."""
