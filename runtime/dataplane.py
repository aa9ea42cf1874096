"""The data plane: live / ready / metadata / infer, independent of any transport.

The HTTP routes and the gRPC service only translate their wire forms to this class and
back (MLServer's DataPlane, KServe's model server): a request is first `admitted` (on its
arrival, before its body is read: an unknown model is a 404 and a server that cannot take
it a 503, without reading a byte of the body), then the transport decodes it (a large one
on a codec worker thread, `offloaded`) and both go the same way from there,
`infer_decoded`, getting back the answer in the transport's own encoding; every failure
comes out as an `InferenceServerError` carrying its status. The request's deadline counts
from its admission, through reading, decoding, queueing and running.

Readiness is the batcher's admission: false before start, from the moment draining
begins, and while a batch is stuck on the engine; liveness is false once a stuck batch
has not returned within `engineStuckLivenessSeconds` (`batching.watchdog`). An engine
that failed its known-answer check at start (`known_answers`) holds readiness false for
good, and its infer requests are refused (503) saying why.

`kubeinfer_requests_in_progress` counts a request from its admission to its end, whatever
that is (an answer, an error, or its client leaving), exactly once; a request refused at
admission is never counted.

A request answered 200 is offered, after its answer is ready, to the mirrors
(`kubeinfer.runtime.shadow`: a shadow candidate, a quality watch's reference) with its
decoded inputs, its outputs, its server time and the raw value of the watch's slice header
(which the transport reads while a watch names one, `slice_header`): an offer never awaits
and never raises, so mirroring adds no wait and no failure here.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kubeinfer.contract.runtime_config import (
    UNSIZED_REQUEST_BYTES,
    RuntimeConfig,
    request_bytes_limit,
)
from kubeinfer.runtime.batching.queue import Admission, Batcher
from kubeinfer.runtime.engines.base import Engine, TensorSpec
from kubeinfer.runtime.known_answers.comparison import Verdict
from kubeinfer.runtime.known_answers.runner import KnownAnswerCheck, log_verdict
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.protocol.codec_pool import CodecPool
from kubeinfer.runtime.protocol.errors import (
    ClientGone,
    DeadlineExceeded,
    InferenceServerError,
    InvalidRequest,
    ModelNotFound,
    NotReady,
    over_request_limit,
)
from kubeinfer.runtime.protocol.json_tensors import model_json_value_limit
from kubeinfer.runtime.protocol.model_config import model_config
from kubeinfer.runtime.protocol.tensor_codec import DecodeLimits
from kubeinfer.runtime.protocol.v2_types import InferOutput, InferRequest, InferResponse
from kubeinfer.runtime.shadow.controller import ShadowController

log = logging.getLogger(__name__)

SERVER_NAME = "kubeinfer"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data",)

Encoded = TypeVar("Encoded")
"""A transport's wire form of an answer (`DataPlane.infer_decoded`)."""
Result = TypeVar("Result")


def _tensor_metadata(specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]


def decode_limits(specs: tuple[TensorSpec, ...], max_rows: int) -> DecodeLimits:
    """What a request to a model with these inputs may make the decoder build: its
    largest input at `max_rows` rows (at its largest allowed shape), and the JSON values
    all its inputs can hold (None where an input's largest shape is unknown)."""
    largest = [spec.largest_item_shape for spec in specs]
    if any(item is None for item in largest):
        return DecodeLimits()
    items = [item for item in largest if item is not None]
    return DecodeLimits(
        max_elements=max_rows * max((math.prod(item) for item in items), default=0),
        max_json_values=model_json_value_limit(items, max_rows),
    )


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


def with_request_limit(config: RuntimeConfig, engine: Engine) -> RuntimeConfig:
    """`config` with `maxRequestBytes` set (`request_limit`)."""
    if config.max_request_bytes is not None:
        return config
    return config.model_copy(update={"max_request_bytes": request_limit(config, engine)})


class AdmittedRequest:
    """`DataPlane.admitted`'s context: ends the request's accounting exactly once, however
    it ends (a class rather than a generator: this runs for every request)."""

    __slots__ = ("_dataplane", "admission")

    def __init__(self, dataplane: DataPlane, admission: Admission) -> None:
        self._dataplane, self.admission = dataplane, admission

    def __enter__(self) -> Admission:
        return self.admission

    def __exit__(self, kind: type | None, error: BaseException | None, _: Any) -> None:
        dataplane, admission = self._dataplane, self.admission
        metrics = dataplane.metrics
        if isinstance(error, InferenceServerError):
            metrics.request_answered(error.status, dataplane.clock() - admission.arrived_at)
        elif isinstance(error, ClientGone):
            metrics.request_cancelled(error.stage)
        elif isinstance(error, asyncio.CancelledError):
            metrics.request_cancelled(admission.stage)
        dataplane.batcher.release(admission)
        metrics.request_finished()


class DataPlane:
    """One served model (name, version) behind a batcher, and its mirrors: assembled once
    (`kubeinfer.runtime.serving.assemble`) and handed to every transport.

    Lifecycle: `start()` before the first request, `drain(grace)` on SIGTERM (while the
    transports still answer what was admitted), `close()` once they have stopped."""

    def __init__(
        self,
        config: RuntimeConfig,
        engine: Engine,
        batcher: Batcher,
        metrics: RuntimeMetrics,
        clock: Callable[[], float] = time.monotonic,
        shadow: ShadowController | None = None,
        codec: CodecPool | None = None,
        known_answers: KnownAnswerCheck | None = None,
    ) -> None:
        self.config = config = with_request_limit(config, engine)
        self.max_request_bytes = request_limit(config, engine)
        """The largest request body taken (`maxRequestBytes`, or the model's own)."""
        self.engine = engine
        self.batcher = batcher
        self.metrics = metrics
        self.shadow = shadow
        self.codec = codec or CodecPool()
        self.clock = self._clock = clock
        self._output_names = {spec.name for spec in engine.outputs}
        self._output_datatypes = {spec.name: spec.datatype for spec in engine.outputs}
        self.limits = decode_limits(engine.inputs, config.batching.max_batch_size)
        self.known_answers = known_answers
        if known_answers is not None and known_answers.latest is not None:
            metrics.known_answers_checked(known_answers.latest)

    async def start(self) -> None:
        """Starts the batcher (the slots' buffers are allocated here) and the mirrors."""
        await self.batcher.start()
        if self.shadow is not None:
            await self.shadow.start()

    async def drain(self, grace_seconds: float) -> bool:
        """SIGTERM's first step: readiness and admission off at once, mirroring stopped
        (its work in flight cancelled), then every request admitted before answered;
        False when that took longer than `grace_seconds`."""
        drained = asyncio.create_task(self.batcher.drain(grace_seconds))
        await asyncio.sleep(0)  # admission is off from here on
        log.info("Started draining admitted=%d grace_period_seconds=%s",
                 self.batcher.admitted, grace_seconds)  # fmt: skip
        if self.shadow is not None:
            await self.shadow.stop()
        if not await drained:
            log.warning("Drain grace period ran out admitted=%d", self.batcher.admitted)
            return False
        return True

    async def close(self) -> None:
        """Stops the mirrors and the batcher (what is left fails) and the codec's
        threads. The engine is the caller's: it is not closed here."""
        if self.shadow is not None:
            await self.shadow.stop()
        await self.batcher.close()
        self.codec.close()

    def live(self) -> bool:
        return self.batcher.watchdog.live(self._clock())

    def ready(self) -> bool:
        return self.serving_allowed and self.batcher.accepting and not self.batcher.watchdog.stuck

    @property
    def serving_allowed(self) -> bool:
        """False for good once the engine failed its known-answer check at start."""
        return self.known_answers is None or self.known_answers.serving_allowed

    async def check_known_answers(self) -> Verdict | None:
        """Runs the known-answer set again, each probe batch once the batcher is idle
        (the lowest priority), exports the verdict and returns it (None: no check)."""
        if self.known_answers is None:
            return None
        verdict = await self.known_answers.run_when_idle(lambda: self.batcher.idle)
        self.metrics.known_answers_checked(verdict)
        log_verdict(verdict, "on demand")
        return verdict

    @property
    def draining(self) -> bool:
        return self.batcher.draining

    @property
    def slice_header(self) -> str | None:
        """The header (or gRPC metadata key) a quality watch reads each request's slice
        from, while one names it; None: the transport reads none."""
        return self.shadow.slice_header if self.shadow is not None else None

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}

    def _check_model(self, name: str, version: str | None) -> None:
        if name != self.config.model_name:
            raise ModelNotFound(f"model {name!r} is not served here")
        if version is not None and version != self.config.model_version:
            raise ModelNotFound(
                f"model {name!r} has no version {version!r} (served: {self.config.model_version!r})"
            )

    def model_ready(self, name: str, version: str | None = None) -> bool:
        self._check_model(name, version)
        return self.ready()

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        self._check_model(name, version)
        return {
            "name": self.config.model_name,
            "versions": [self.config.model_version],
            "platform": getattr(self.engine, "platform", type(self.engine).__name__),
            "inputs": _tensor_metadata(self.engine.inputs),
            "outputs": _tensor_metadata(self.engine.outputs),
            "parameters": {"max_batch_size": self.config.batching.max_batch_size},
        }

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Triton's model configuration of the model (`protocol.model_config`)."""
        return model_config(self.model_metadata(name, version))

    def admitted(self, name: str, version: str | None) -> AdmittedRequest:
        """Admits an infer request on its arrival, before its body is read (raises 404,
        or 503 when the server cannot take it), and accounts for it until it ends: its
        error's status, or its client leaving (`ClientGone`, or the handler cancelled).
        Use: `with dataplane.admitted(name, version) as admission: ...`."""
        arrived = self._clock()
        try:
            self._check_model(name, version)
            if not self.serving_allowed:
                assert self.known_answers is not None
                raise NotReady(self.known_answers.hold_reason)
            admission = self.batcher.admit(arrived)
        except InferenceServerError as error:
            self.metrics.request_answered(error.status, self._clock() - arrived)
            raise
        self.metrics.request_started()
        return AdmittedRequest(self, admission)

    def check_request_bytes(self, size: int, what: str) -> None:
        """Raises 413 when a request of `size` bytes is over the limit (`what`: the
        request's form on the wire, for the message)."""
        if size > self.max_request_bytes:
            raise over_request_limit(
                f"the request {what} ({size} bytes) is over the limit of "
                f"{self.max_request_bytes} bytes"
            )

    async def offloaded(
        self, admission: Admission, offload: bool, fn: Callable[..., Result], *args: Any
    ) -> Result:
        """`fn(*args)` (a transport's decoding), on a codec worker thread when `offload`
        (a large request: see `codec_pool`), under the request's deadline."""
        if offload:
            return await self.codec.run(admission.deadline, fn, *args)
        return fn(*args)

    def bound_by_client(
        self, admission: Admission, request: InferRequest, remaining_seconds: float | None
    ) -> None:
        """The client's own deadline (gRPC's), `remaining_seconds` from now, becomes the
        request's timeout when it is sooner than its timeout parameter (or the default)."""
        if remaining_seconds is None:
            return
        client = int((self._clock() - admission.arrived_at + remaining_seconds) * 1e6)
        default = self.config.batching.default_timeout_milliseconds * 1000
        own = request.timeout_microseconds or default
        request.timeout_microseconds = max(1, min(own, client))

    async def infer_decoded(
        self,
        admission: Admission,
        request: InferRequest,
        encode: Callable[[InferResponse], Awaitable[Encoded]],
        slice_value: str | None = None,
    ) -> tuple[Encoded, float]:
        """The path of every admitted infer request once its transport has decoded it
        (REST's body, gRPC's message): its inputs checked against the model's, its own
        timeout applied, queued in the batcher, its answer built and encoded by the
        transport's `encode`, counted as answered and offered to the mirrors. Returns the
        encoded answer and the server time (from its arrival)."""
        admission.stage = "waiting"
        inputs = _named_inputs(request)
        rows, shape = self.batcher.shapes.check(inputs, self.config.batching.max_batch_size)
        wanted = self._wanted_outputs(request)
        timeout_seconds = self._start_deadline(admission, request)
        results = await self.batcher.infer(
            {name: data for name, (_, data) in inputs.items()},
            rows,
            timeout_seconds,
            admission=admission,
            shape=shape,
        )
        response = InferResponse(self.config.model_name, self.config.model_version, request.id)
        for output_name, binary in wanted:
            response.outputs.append(
                InferOutput(
                    output_name,
                    self._output_datatypes[output_name],
                    results[output_name],
                    request.binary_data_output if binary is None else binary,
                )
            )
        encoded = await encode(response)
        seconds = self._clock() - admission.arrived_at
        self.metrics.request_answered(200, seconds)
        shadow = self.shadow
        if shadow is not None and shadow.active:
            outputs = {n: (self._output_datatypes[n], array) for n, array in results.items()}
            shadow.offer(inputs, outputs, seconds, slice_value)
        return encoded, seconds

    def _wanted_outputs(self, request: InferRequest) -> list[tuple[str, bool | None]]:
        """The outputs the request asks for (all, by default), each with its own binary
        choice (None: the request's)."""
        if request.outputs is None:
            return [(spec.name, None) for spec in self.engine.outputs]
        wanted = []
        for output in request.outputs:
            if output.name not in self._output_names:
                raise InvalidRequest(
                    f"unknown output {output.name!r}; the model's outputs are "
                    f"{sorted(self._output_names)}"
                )
            wanted.append((output.name, output.binary))
        return wanted

    def _start_deadline(self, admission: Admission, request: InferRequest) -> float | None:
        """Applies the request's own timeout (0 or absent: the default) to its deadline,
        counted from its arrival, and refuses it when that has passed already (while it
        was read and decoded). Returns the timeout in seconds, or None."""
        timeout = request.timeout_microseconds
        timeout_seconds = timeout / 1e6 if timeout else None  # 0 or absent: the default
        if timeout_seconds is not None:
            admission.deadline = admission.arrived_at + timeout_seconds
        now = self._clock()
        if now >= admission.deadline:
            raise DeadlineExceeded(
                f"the request's deadline passed {(now - admission.arrived_at) * 1000:.1f} ms "
                "after it arrived, before it was queued (reading and decoding it); it was "
                "not executed"
            )
        return timeout_seconds


def _named_inputs(request: InferRequest) -> dict[str, tuple[str, Any]]:
    """The request's inputs by name, each as (datatype, data); a name given twice is
    refused."""
    inputs = {}
    for tensor in request.inputs:
        if tensor.name in inputs:
            raise InvalidRequest(f"input {tensor.name!r} is given twice")
        inputs[tensor.name] = (tensor.datatype, tensor.data)
    return inputs
