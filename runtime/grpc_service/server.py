"""The gRPC server's lifecycle beside the HTTP server's (`serving.serve_transports` runs
both over one data plane): started on `grpcPort` before the HTTP server, stopped when the
drain begins.

Options: a message may be as large as an HTTP body (`maxRequestBytes`: the service refuses
larger ones with RESOURCE_EXHAUSTED naming the limit, and gRPC itself, before they are
read, those past twice the limit); answers are not
limited (a full batch of outputs may be large); SO_REUSEPORT is off, so a second server
on the same port fails to start rather than silently sharing the port's connections.

The drain (`stop`, when SIGTERM has begun the HTTP server's): new RPCs are refused at
once (gRPC's GOAWAY: clients reconnect elsewhere, as Kubernetes' endpoints have already
dropped the pod as unready), while those in flight are answered, within
`drainGracePeriodSeconds` like REST's. Their requests were admitted by the same batcher,
whose drain waits for them too.
"""

from __future__ import annotations

import logging

import grpc
from kubeinfer.runtime.dataplane import DataPlane
from kubeinfer.runtime.grpc_service import open_inference_grpc_pb2 as pb
from kubeinfer.runtime.grpc_service.codec import read_infer_request
from kubeinfer.runtime.grpc_service.open_inference_grpc_pb2_grpc import (
    add_GRPCInferenceServiceServicer_to_server,
)
from kubeinfer.runtime.grpc_service.service import InferenceService

log = logging.getLogger(__name__)


RECEIVE_HEADROOM = 2
"""gRPC's own message limit, in multiples of maxRequestBytes (`InferenceService` refuses
messages between the two)."""


class _Registration:
    """Stands in for the server in the generated registration, to keep its handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _: object) -> None:
        pass

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.service, self.handlers = service, dict(handlers)


def service_handlers(servicer: InferenceService) -> tuple[str, dict[str, grpc.RpcMethodHandler]]:
    """The generated handlers of `inference.GRPCInferenceService`, ModelInfer's with a
    deserializer that keeps the message's size on the wire (`codec.ReceivedInfer`)."""
    registration = _Registration()
    add_GRPCInferenceServiceServicer_to_server(servicer, registration)
    handlers = registration.handlers
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer,
        request_deserializer=read_infer_request,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )
    return registration.service, handlers


def listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    """`inference.GRPCInferenceService` of one data plane on `config.grpc_port`."""

    def __init__(self, dataplane: DataPlane) -> None:
        assert dataplane.config.grpc_port is not None
        self._config = dataplane.config
        self._server = grpc.aio.server(
            options=[
                # Room past the limit, so the service refuses most messages over it in
                # its own words (which limit, how to raise it); gRPC's own refusal
                # ("Received message larger than max") only those past twice the limit.
                ("grpc.max_receive_message_length", RECEIVE_HEADROOM * dataplane.max_request_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        service, handlers = service_handlers(InferenceService(dataplane))
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),)
        )
        self._server.add_registered_method_handlers(service, handlers)
        self.port: int | None = None

    async def start(self) -> int:
        """Binds and starts serving; returns the port. Raises OSError when the port
        cannot be bound."""
        address = listen_address(self._config.host, self._config.grpc_port or 0)
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError as error:  # grpc says "Failed to bind to address ..."
            raise OSError(f"cannot listen on {address} (gRPC): {error}") from None
        await self._server.start()
        log.info("Started serving gRPC model=%s address=%s", self._config.model_name, address)
        return self.port

    async def stop(self, grace_seconds: float) -> None:
        """Refuses new RPCs and answers those in flight, for at most `grace_seconds`."""
        await self._server.stop(grace_seconds)
        log.info("Stopped serving gRPC model=%s", self._config.model_name)
