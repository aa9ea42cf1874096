"""The benchmarks' load generator: HTTP from `kubeinfer.cli.tune.load` (`kubeinfer tune`
drives its sweeps with it, and the package never imports tests/), re-exported here so the
benchmarks keep importing `loadgen` (add HTTP features to the package module, not here);
and the gRPC closed loop the serving benchmark compares REST with, which tune does not use.

gRPC: `encode_grpc_infer` serializes a ModelInferRequest once (raw input contents, as
tritonclient sends them), and `run_closed_loop_grpc` sends those bytes on grpc.aio
channels with no (de)serializer on the client, one channel (one HTTP/2 connection) per
client as the HTTP clients each hold one connection: the client's per-request work is
grpc's own, the least a Python gRPC client can do. Its CPU is reported per request like
the HTTP generator's (it costs more than the raw HTTP client, and on a shared 2-core
machine that comes out of the server's share: read the loadgen column).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import numpy as np
from kubeinfer.cli.tune.load import (
    Connection,
    EncodedRequest,
    LoadGenError,
    Response,
    RunResult,
    _Tally,
    _window_hooks,
    encode_binary_infer,
    encode_json_infer,
    open_connection,
    request_once,
    run_closed_loop,
)

_Connection = Connection  # bench_hostile subclasses it under its old name

__all__ = [
    "MODEL_INFER",
    "Connection",
    "EncodedRequest",
    "LoadGenError",
    "Response",
    "RunResult",
    "_Connection",
    "decode_grpc_output",
    "encode_binary_infer",
    "encode_grpc_infer",
    "encode_json_infer",
    "grpc_request_once",
    "open_connection",
    "request_once",
    "run_closed_loop",
    "run_closed_loop_grpc",
]

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def encode_grpc_infer(model: str, input_name: str, item: np.ndarray) -> EncodedRequest:
    """A serialized ModelInferRequest carrying one item (a batch of 1) of FP32 data in
    raw_input_contents; the answer comes raw (the server's default)."""
    from kubeinfer.runtime.grpc_service import open_inference_grpc_pb2 as pb

    batch = np.ascontiguousarray(item.reshape(1, *item.shape), dtype="<f4")
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=input_name, datatype="FP32", shape=batch.shape)
    request.raw_input_contents.append(batch.tobytes())
    raw = request.SerializeToString()
    return EncodedRequest(raw, len(raw))


def decode_grpc_output(body: bytes) -> np.ndarray:
    """The first output of a serialized ModelInferResponse with raw contents."""
    from kubeinfer.runtime.grpc_service import open_inference_grpc_pb2 as pb

    response = pb.ModelInferResponse.FromString(body)
    output = response.outputs[0]
    return np.frombuffer(response.raw_output_contents[0], "<f4").reshape(tuple(output.shape))


async def grpc_request_once(host: str, port: int, raw: bytes) -> bytes:
    """One ModelInfer on a fresh channel (checks); raises grpc's error."""
    import grpc

    async with grpc.aio.insecure_channel(f"{host}:{port}") as channel:
        answer: bytes = await channel.unary_unary(MODEL_INFER)(raw, timeout=30)
        return answer


async def run_closed_loop_grpc(
    host: str,
    port: int,
    requests: Sequence[EncodedRequest],
    clients: int,
    warmup_s: float,
    duration_s: float,
    on_window_start: Callable[[], object] | None = None,
    on_window_end: Callable[[], object] | None = None,
) -> RunResult:
    """`run_closed_loop` over gRPC: `clients` closed-loop clients, each on its own
    channel, sending `requests` (serialized ModelInferRequests) in turn."""
    import grpc

    channels = [grpc.aio.insecure_channel(f"{host}:{port}") for _ in range(clients)]
    for channel in channels:
        await asyncio.wait_for(channel.channel_ready(), 30)
    calls = [channel.unary_unary(MODEL_INFER) for channel in channels]
    start = time.perf_counter()
    window_start = start + warmup_s
    window_end = window_start + duration_s
    tally = _Tally()
    raws = [r.raw for r in requests]
    rows = [r.rows for r in requests]

    async def client(index: int, call: grpc.aio.UnaryUnaryMultiCallable) -> None:
        i = index
        n = len(raws)
        perf = time.perf_counter
        record = tally.latencies.append
        while True:
            t0 = perf()
            if t0 >= window_end:
                return
            try:
                await call(raws[i % n], timeout=60)
                failure = None
            except grpc.aio.AioRpcError as error:
                failure = f"{error.code().name}: {error.details()}"
            t1 = perf()
            sent_rows = rows[i % n]
            i += 1
            in_window = window_start <= t1 < window_end
            if failure is not None:
                tally.error(in_window, failure)
                continue
            if in_window:
                record(t1 - t0)
                tally.rows += sent_rows

    try:
        hook_task = asyncio.ensure_future(
            _window_hooks(window_start, window_end, on_window_start, on_window_end)
        )
        await asyncio.gather(*(client(i, c) for i, c in enumerate(calls)))
        cpu_s = await hook_task
    finally:
        for channel in channels:
            await channel.close()
    return tally.result(clients, duration_s, cpu_s)
