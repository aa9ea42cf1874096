"""`kubeinfer serve`'s Rust data plane in the test's own process: the extension's server
(`kubeinfer_dataplane.Server`) started on an engine of the test's, as
`rust_dataplane.serve` starts it (`server_options`, `start_serving`: the server with its
Python admin routes and mirrors), made ready, and shut down (drained) when the test is done.

For tests that must hold the engine itself (a `GatedEngine` whose gate decides what is
running and queued, a slot that counts its calls) or that send thousands of requests
without a process start each: everything else sees it as a client would, over HTTP (and
gRPC where the config names a port), /metrics scraped as text. Nothing here reaches into
the server: what it has queued or running is read from its own gauges.

`rust_dataplane.serve` itself also checks the known answers, probes the batching and
waits for SIGTERM; the process tests (`serve_process.ServeProcess`) cover those.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.runtime.engines.base import Engine
from kubeinfer.runtime.engines.gpu_memory import GpuMemory
from kubeinfer.runtime.known_answers.runner import KnownAnswerCheck
from kubeinfer.runtime.rust_dataplane import AdminRoutes, server_options, start_serving
from prometheus_client.parser import text_string_to_metric_families
from serve_process import LoopbackHttp

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def require_extension() -> None:
    """Fails (never skips) where the extension is not built: `make test` builds it."""
    try:
        import kubeinfer_dataplane  # noqa: F401
    except ImportError as error:
        pytest.fail(f"the extension kubeinfer_dataplane is not built ({error}): make dataplane")


class RustServed(LoopbackHttp):
    """A started Rust server on the test's engine: its ports, and a client's view of it."""

    def __init__(
        self, server: Any, config: RuntimeConfig, options: dict[str, Any], admin: AdminRoutes
    ) -> None:
        self.server, self.config, self.options, self.admin = server, config, options, admin
        self.port: int = server.http_port
        self.grpc_port: int | None = config.grpc_port
        self.batches_on_engine: int | None = None
        """Set by `shutdown`: the batches its drain left on the engine (a stuck one)."""

    @property
    def grpc_address(self) -> str:
        assert self.grpc_port is not None, "the config names no grpcPort"
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def infer_path(self) -> str:
        return f"/v2/models/{self.config.model_name}/infer"

    def get_json(self, path: str) -> Any:
        status, _, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def exposition(self) -> str:
        """`GET /metrics` as text."""
        status, _, body = self.request("GET", "/metrics")
        assert status == 200, body
        return body.decode()

    def metrics(self) -> Samples:
        """Every sample of a scrape: (name, sorted labels) -> value."""
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(self.exposition())
            for sample in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the served model's (0 when absent)."""
        model = {"model": self.config.model_name, "version": self.config.model_version}
        key = tuple(sorted({**model, **labels}.items()))
        return self.metrics().get((name, key), 0.0)

    def gauges(self) -> dict[str, float]:
        """The served model's gauges by name."""
        model = {"model": self.config.model_name, "version": self.config.model_version}
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(self.exposition())
            if family.type == "gauge"
            for sample in family.samples
            if sample.labels == model
        }

    def queued(self) -> float:
        """Requests waiting in the batch queue (`kubeinfer_queue_depth`)."""
        return self.metric("kubeinfer_queue_depth")

    def in_progress(self) -> float:
        """Requests received and not yet answered (`kubeinfer_requests_in_progress`)."""
        return self.metric("kubeinfer_requests_in_progress")

    def set_ready(self, ready: bool, reason: str | None = None) -> None:
        self.server.set_ready(ready, reason)

    def shutdown(self) -> int:
        """Drains (what was admitted answered within drainGracePeriodSeconds) and stops;
        blocks; returns the batches still on the engine. Later calls return 0."""
        left = self.server.shutdown()
        if self.batches_on_engine is None:
            self.batches_on_engine = left
            self.admin.close()
        return left


@contextmanager
def rust_served(
    config: RuntimeConfig,
    engine: Engine,
    *,
    known_answers: KnownAnswerCheck | None = None,
    ready: bool = True,
) -> Iterator[RustServed]:
    """The Rust server on `engine` (the caller's: never closed here) with `config`, on
    an HTTP port the server picks (`RustServed.port`; the config's own is not used), made
    ready (`ready` False: left not ready, as a failed known-answer check leaves it). The
    known answers default to an ONNX file's: none recorded. Mirrors are followed where the
    config names a mirror target file. Shut down on leaving, if the test did not."""
    require_extension()
    if known_answers is None:
        known_answers = KnownAnswerCheck(
            engine, None, missing_reason="served by the tests", missing_expected=True
        )
        known_answers.run()
    options = {**server_options(config, engine), "httpPort": 0}
    server, admin = start_serving(config, engine, known_answers, options)
    served = RustServed(server, config, options, admin)
    try:
        if ready:
            served.set_ready(True)
        yield served
    finally:
        if admin.mirrors is not None:
            admin.mirrors.stop()
        served.shutdown()


@contextmanager
def gpu_runtime(model: Path, name: str, readings: Sequence[GpuMemory]) -> Iterator[RustServed]:
    """The Rust server on the ONNX model `model`, served as `name`, its GPU memory gauges
    set from fixed `readings` as NVML's would set them (`rust_dataplane.GpuMemoryGauges`):
    a GPU pod's /metrics, where there is no GPU."""
    from kubeinfer.contract.runtime_config import EngineSource
    from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
    from kubeinfer.runtime.rust_dataplane import GpuMemoryGauges

    config = RuntimeConfig(
        model_name=name, engine=EngineSource(onnx_path=str(model)), host="127.0.0.1"
    )
    engine = OnnxRuntimeEngine(model, 8, intra_op_threads=1)
    try:
        with rust_served(config, engine) as served:
            gauges = GpuMemoryGauges(served.server, lambda: list(readings))
            gauges.start()
            try:
                yield served
            finally:
                gauges.stop()
    finally:
        engine.close()
