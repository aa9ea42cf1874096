"""The data plane: live / ready / metadata / infer, independent of any transport.

The HTTP routes (and a gRPC service, should one come) are thin wrappers over this class:
they pass the raw body and the binary-extension header length in and get bytes back, and
every failure comes out as an `InferenceServerError` carrying its status. Readiness is the
batcher's admission: false before start and from the moment draining begins.

A request answered 200 is offered, after its answer is ready, to the shadow mirror
(`kubeinfer.runtime.shadow`) with its decoded inputs, its outputs and its server time:
an offer never awaits and never raises, so mirroring adds no wait and no failure here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from kubeinfer.runtime.batching.assembler import check_inputs
from kubeinfer.runtime.batching.queue import Batcher
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.engines.base import Engine, TensorSpec
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.protocol.errors import (
    InferenceServerError,
    InvalidRequest,
    ModelNotFound,
    NotReady,
)
from kubeinfer.runtime.protocol.tensor_codec import decode_infer_request, encode_infer_response
from kubeinfer.runtime.protocol.v2_types import InferOutput, InferResponse
from kubeinfer.runtime.shadow.controller import ShadowController

SERVER_NAME = "kubeinfer"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data",)


def _tensor_metadata(specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]


class InferResult(NamedTuple):
    """An answered infer request, as the transport sends it."""

    body: bytes
    header_length: int | None
    """The binary extension's Inference-Header-Content-Length, or None (all JSON)."""
    seconds: float
    """The server's time for the request, the span `kubeinfer_request_duration_seconds`
    observes (the transport reports it in Server-Timing)."""


class DataPlane:
    """One served model (name, version) behind a batcher."""

    def __init__(
        self,
        config: RuntimeConfig,
        engine: Engine,
        batcher: Batcher,
        metrics: RuntimeMetrics,
        clock: Callable[[], float] = time.monotonic,
        shadow: ShadowController | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.batcher = batcher
        self.metrics = metrics
        self.shadow = shadow
        self._clock = clock
        self._output_names = {spec.name for spec in engine.outputs}
        self._output_datatypes = {spec.name: spec.datatype for spec in engine.outputs}

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.batcher.accepting

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

    async def infer(
        self, name: str, version: str | None, body: bytes, header_length: int | None
    ) -> InferResult:
        """Runs one v2 infer request; returns the response body, the binary header length
        and the server time."""
        started = self._clock()
        # Counted from here to the answer, whatever it waits on (the queue, a slot, the
        # event loop on a busy machine): the batcher's queue gauge misses what runs inline
        # and what waits for the loop, so it reads 0 on a saturated runtime of a fast model.
        self.metrics.request_started()
        try:
            (payload, response_header_length), inputs, results = await self._infer(
                name, version, body, header_length
            )
        except InferenceServerError as error:
            self.metrics.request_answered(error.status, self._clock() - started)
            raise
        finally:
            self.metrics.request_finished()
        seconds = self._clock() - started
        self.metrics.request_answered(200, seconds)
        shadow = self.shadow
        if shadow is not None and shadow.active:
            outputs = {n: (self._output_datatypes[n], array) for n, array in results.items()}
            shadow.offer(inputs, outputs, seconds)
        return InferResult(payload, response_header_length, seconds)

    async def _infer(
        self, name: str, version: str | None, body: bytes, header_length: int | None
    ) -> tuple[tuple[bytes, int | None], dict[str, tuple[str, Any]], dict[str, Any]]:
        """(encoded response, decoded inputs as (datatype, array), every output's array)."""
        self._check_model(name, version)
        if not self.batcher.accepting:
            raise NotReady("the model is not ready (starting or shutting down)")
        request = decode_infer_request(body, header_length)
        inputs = {}
        for tensor in request.inputs:
            if tensor.name in inputs:
                raise InvalidRequest(f"input {tensor.name!r} is given twice")
            inputs[tensor.name] = (tensor.datatype, tensor.data)
        rows = check_inputs(self.engine.inputs, inputs, self.config.batching.max_batch_size)
        if request.outputs is None:
            wanted = [(spec.name, None) for spec in self.engine.outputs]
        else:
            wanted = []
            for output in request.outputs:
                if output.name not in self._output_names:
                    raise InvalidRequest(
                        f"unknown output {output.name!r}; the model's outputs are "
                        f"{sorted(self._output_names)}"
                    )
                wanted.append((output.name, output.binary))
        timeout = request.timeout_microseconds
        results = await self.batcher.infer(
            {name: data for name, (_, data) in inputs.items()},
            rows,
            timeout / 1e6 if timeout else None,  # 0 or absent: the default deadline
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
        return encode_infer_response(response), inputs, results
