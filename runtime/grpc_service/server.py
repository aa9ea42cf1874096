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
from kubeinfer.runtime.grpc_service.open_inference_grpc_pb2_grpc import (
    add_GRPCInferenceServiceServicer_to_server,
)
from kubeinfer.runtime.grpc_service.service import InferenceService

log = logging.getLogger(__name__)


RECEIVE_HEADROOM = 2
"""gRPC's own message limit, in multiples of maxRequestBytes (`InferenceService` refuses
messages between the two)."""


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
        add_GRPCInferenceServiceServicer_to_server(InferenceService(dataplane), self._server)
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
