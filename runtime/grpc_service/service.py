"""`inference.GRPCInferenceService` over the data plane: thin, as the HTTP routes are.

Each RPC calls the `DataPlane` method its REST route calls; ModelInfer is admitted
(`DataPlane.admitted`: an unknown model, a full queue or a draining server are refused
before anything else), decoded (`codec.from_model_infer_request`), and from there goes
the one path REST's requests go (`DataPlane.infer_decoded`): batching, deadlines,
the requests metrics, the mirrors. Every `InferenceServerError` becomes its gRPC status
through `errors.grpc_error_parts`, with its message as the details; anything else is
logged and answered INTERNAL, as REST answers a 500.

The request's deadline is the sooner of its `timeout` parameter (or the default) and the
client's gRPC deadline: a request whose client has stopped waiting is dropped from the
queue, never executed. A client that cancels is counted as cancelled, as on REST.

While a quality watch names a slice header, its value is read from the request's
metadata (gRPC's headers, lower case).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import grpc
from kubeinfer.runtime.dataplane import DataPlane
from kubeinfer.runtime.grpc_service import open_inference_grpc_pb2 as pb
from kubeinfer.runtime.grpc_service.codec import (
    ReceivedInfer,
    from_model_infer_request,
    to_model_config_response,
    to_model_infer_response,
    to_model_metadata_response,
    typed_elements,
)
from kubeinfer.runtime.grpc_service.open_inference_grpc_pb2_grpc import (
    GRPCInferenceServiceServicer,
)
from kubeinfer.runtime.protocol.errors import InferenceServerError, InternalError, grpc_error_parts
from kubeinfer.runtime.protocol.v2_types import InferResponse

log = logging.getLogger(__name__)

Answer = TypeVar("Answer")
ModelRequest = pb.ModelReadyRequest | pb.ModelMetadataRequest | pb.ModelConfigRequest

COMPANY_TURNS = 32
"""Quiet event-loop turns in a row a ModelInfer request waits in the batcher, while
nothing runs, for others to join its batch (never past `maxQueueDelayMicroseconds`).
grpc.aio hands RPCs over one at a time: its server loop asks gRPC core for the next call
only once it has started the previous one, and each call's message then comes through
gRPC's poller thread, so concurrent RPCs reach the batcher turns apart, where aiohttp's
reach it in one turn. Without the wait each finds the slot free and runs alone. A turn
of an idle loop is a few microseconds, what a lone request pays per turn; under load a
turn carries other requests' work, so the same count spans the gaps between hand-overs.
The count is measured (docs/benchmarks.md, "gRPC beside REST")."""

TYPED_OFFLOAD_ELEMENTS = 256 * 1024
"""Typed contents of this many elements or more are converted on a codec worker thread
(each element is a Python object to numpy: milliseconds that would hold the event loop);
raw contents are views of the message, never moved."""


async def _abort(context: grpc.aio.ServicerContext, error: InferenceServerError) -> NoReturn:
    code, details, trailing = grpc_error_parts(error)
    await context.abort(grpc.StatusCode[code], details, trailing_metadata=trailing)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


async def _answered(
    context: grpc.aio.ServicerContext, call: Callable[..., Answer], *args: Any
) -> Answer:
    """`call(*args)`, or the RPC aborted with its error's status."""
    try:
        return call(*args)
    except InferenceServerError as error:
        await _abort(context, error)


def _model(request: ModelRequest) -> tuple[str, str | None]:
    """The model name and version (None: any) a request names."""
    return request.name, request.version or None


async def _encode(response: InferResponse) -> pb.ModelInferResponse:
    return to_model_infer_response(response)


class InferenceService(GRPCInferenceServiceServicer):
    """The gRPC service of one data plane."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        ready = await _answered(context, self._dataplane.model_ready, *_model(request))
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        return pb.ServerMetadataResponse(**self._dataplane.server_metadata())

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        metadata = await _answered(context, self._dataplane.model_metadata, *_model(request))
        return to_model_metadata_response(metadata)

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        config = await _answered(context, self._dataplane.model_config, *_model(request))
        return to_model_config_response(config)

    async def ModelInfer(self, received: ReceivedInfer, context: grpc.aio.ServicerContext) -> Any:
        """The request comes with its size on the wire (`server.service_handlers` registers
        `codec.read_infer_request` as its deserializer)."""
        dataplane, request = self._dataplane, received.message
        try:
            with dataplane.admitted(request.model_name, request.model_version or None) as admission:
                admission.stage = "waiting"  # the message is read: decoding, then queued
                dataplane.check_request_bytes(received.wire_bytes, "message")
                admission.company_turns = COMPANY_TURNS
                decoded = await dataplane.offloaded(
                    admission, typed_elements(request) >= TYPED_OFFLOAD_ELEMENTS,
                    from_model_infer_request, request, dataplane.limits,
                )  # fmt: skip
                dataplane.bound_by_client(admission, decoded, context.time_remaining())
                answer, _ = await dataplane.infer_decoded(
                    admission, decoded, _encode, self._slice_value(context)
                )
        except InferenceServerError as error:
            await _abort(context, error)
        except Exception:
            log.exception("Request failed unexpectedly method=ModelInfer")
            await _abort(context, InternalError())
        return answer

    def _slice_value(self, context: grpc.aio.ServicerContext) -> str | None:
        header = self._dataplane.slice_header
        if not header:
            return None
        key = header.lower()
        for name, value in context.invocation_metadata() or ():
            if name == key:
                return value if isinstance(value, str) else None
        return None
