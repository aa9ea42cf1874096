"""The Open Inference Protocol over gRPC (`inference.GRPCInferenceService`), beside REST
on its own port (`grpcPort`, `kubeinfer serve --grpc-port`), on the same data plane.

`open_inference_grpc.proto` is the protocol's .proto, vendored; the `_pb2` modules beside
it are generated from it (`make protos`, checked by `tests/runtime/test_grpc_stubs.py`).
`codec` translates its messages to the data plane's types, `service` is the thin service,
`server` its lifecycle beside the HTTP server's. Named `grpc_service`, not `grpc`, so the
grpc library is never shadowed.
"""
