"""gRPC requests batch as REST's do: with the gated tiny model's one slot held, gRPC
ModelInfer calls that arrive meanwhile queue, and run as one batch once the slot is
free, each answered its own rows (ONNX Runtime's own outputs). The gate, not the clock,
decides what is running and queued. (How the Rust scheduler forms batches is tested in
runtime/native/crates/core/src/batching.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
from kubeinfer.contract.runtime_config import BatchingPolicy
from ports import free_port
from tritonclient.grpc import service_pb2 as pb
from waiting import eventually

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def request_of(x: np.ndarray) -> bytes:
    request = pb.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request.SerializeToString()


def logits_of(raw: bytes) -> np.ndarray:
    answer = pb.ModelInferResponse.FromString(raw)
    [output] = answer.outputs
    return np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(output.shape)


async def test_grpc_calls_queued_while_busy_run_as_one_batch(
    start_serving, gated, tiny_model: Path
) -> None:
    serving = await start_serving(
        grpc_port=free_port(), batching=BatchingPolicy(execution_slots=1, max_queue_size=16)
    )
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    inputs = [np.random.default_rng(seed).standard_normal((1, 16)).astype(np.float32)
              for seed in range(9)]  # fmt: skip
    channels = [grpc.aio.insecure_channel(serving.served.grpc_address) for _ in inputs]
    try:
        calls = [channel.unary_unary(MODEL_INFER) for channel in channels]
        gated.gate.clear()
        first = asyncio.ensure_future(calls[0](request_of(inputs[0]), timeout=30))
        await eventually(lambda: gated.running == 1, what="the slot held", every=0.002)
        waiting = [
            asyncio.ensure_future(call(request_of(x), timeout=30))
            for call, x in zip(calls[1:], inputs[1:], strict=True)
        ]
        await eventually(
            lambda: serving.served.queued() == len(waiting), what="8 queued", every=0.002
        )
        gated.gate.set()
        answers = await asyncio.gather(first, *waiting)
    finally:
        gated.gate.set()
        await asyncio.gather(*(channel.close() for channel in channels))
    assert gated.batches == [1, len(waiting)]
    for x, answer in zip(inputs, answers, strict=True):
        expected = session.run(None, {"input": x})[0]
        np.testing.assert_allclose(logits_of(answer), expected, rtol=1e-5, atol=1e-6)
