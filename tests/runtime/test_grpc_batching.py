"""gRPC requests batch as REST's do: a real `kubeinfer serve --grpc-port` on the tiny model
(fast batches), 32 concurrent gRPC clients in a closed loop are served in batches of
several rows, where each RPC could find the slot free and run alone. (How the Rust
scheduler forms batches is tested in runtime/native/crates/core/src/batching.)
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from ports import free_port
from serve_process import ServeProcess
from tritonclient.grpc import service_pb2 as pb

CLIENTS = 32
REQUESTS_PER_CLIENT = 40
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def batches_and_rows(server: ServeProcess) -> tuple[float, float]:
    return (
        server.metric("kubeinfer_batch_size_count"),
        server.metric("kubeinfer_batch_size_sum"),
    )


async def closed_loop(address: str) -> None:
    """CLIENTS clients, each on its own channel, each sending its next request when its
    last is answered."""
    request = pb.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.full((1, 16), 0.5, "<f4").tobytes())
    raw = request.SerializeToString()
    channels = [grpc.aio.insecure_channel(address) for _ in range(CLIENTS)]

    async def client(channel: grpc.aio.Channel) -> None:
        call = channel.unary_unary(MODEL_INFER)
        for _ in range(REQUESTS_PER_CLIENT):
            answer = pb.ModelInferResponse.FromString(await call(raw, timeout=30))
            assert answer.outputs[0].shape == [1, 10]

    try:
        await asyncio.gather(*(client(channel) for channel in channels))
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))


@pytest.mark.slow
def test_concurrent_grpc_clients_of_a_fast_model_are_served_in_batches(tiny_model: Path) -> None:
    grpc_port = free_port()
    with ServeProcess(
        tiny_model, "tiny", "--grpc-port", str(grpc_port), "--intra-op-threads", "1",
        "--execution-slots", "1", "--max-batch-size", "32",
    ) as server:  # fmt: skip
        asyncio.run(closed_loop(f"127.0.0.1:{grpc_port}"))  # warm: small batches measured fast
        batches_before, rows_before = batches_and_rows(server)
        started = time.monotonic()
        asyncio.run(closed_loop(f"127.0.0.1:{grpc_port}"))
        batches_after, rows_after = batches_and_rows(server)
    rows = rows_after - rows_before
    assert rows == CLIENTS * REQUESTS_PER_CLIENT
    mean_batch = rows / (batches_after - batches_before)
    assert mean_batch >= 3, (
        f"{rows:.0f} requests ran in batches of {mean_batch:.2f} rows on average "
        f"({time.monotonic() - started:.1f} s)"
    )
