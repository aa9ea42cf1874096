"""Overload and deadlines over HTTP, on the app from `served_app.app_of` with the real engine
behind a gate (an execution slot held busy):

- a full queue answers 503 with Retry-After and a JSON error, at once;
- a request whose `timeout` parameter (microseconds, as tritonclient sends it) passes in
  the queue gets 504 and never runs;
- both are counted in kubeinfer_requests_total by code;
- readiness is false once draining starts and new requests get 503.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubeinfer.contract.runtime_config import BatchingPolicy, EngineSource, RuntimeConfig
from kubeinfer.runtime.http.app import DATAPLANE
from prometheus_client import generate_latest
from served_app import app_of
from waiting import eventually


def body(timeout_us: int | None = None) -> dict:
    request: dict = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.1] * 16}]
    }
    if timeout_us is not None:
        request["parameters"] = {"timeout": timeout_us}
    return request


@pytest.fixture
async def client(gated, tiny_model):
    config = RuntimeConfig(
        model_name="tiny",
        engine=EngineSource(onnx_path=str(tiny_model)),
        batching=BatchingPolicy(execution_slots=1, max_queue_size=2),
    )
    app = app_of(config, gated)
    async with TestClient(TestServer(app)) as test_client:
        try:
            yield test_client
        finally:  # a test failed holding the slot: its handlers end before the server
            gated.gate.set()


async def hold_the_slot(client: TestClient, gated) -> asyncio.Task:
    gated.gate.clear()
    task = asyncio.create_task(client.post("/v2/models/tiny/infer", json=body()))
    await eventually(lambda: gated.running, what="the first request on the engine",
                     every=0.002, in_thread=False)  # fmt: skip
    return task


async def test_a_full_queue_is_a_503_with_retry_after(client, gated) -> None:
    running = await hold_the_slot(client, gated)
    queued = [
        asyncio.create_task(client.post("/v2/models/tiny/infer", json=body())) for _ in range(2)
    ]
    batcher = client.app[DATAPLANE].batcher
    await eventually(
        lambda: batcher.queued == 2, what="the queue full", every=0.002, in_thread=False
    )
    # With the slot held, anything but a refusal would wait 10 s for the gate.
    refusal = asyncio.create_task(client.post("/v2/models/tiny/infer", json=body()))
    if not (await asyncio.wait({refusal}, timeout=1))[0]:
        gated.gate.set()  # let everything finish before saying so
        await asyncio.gather(refusal, running, *queued, return_exceptions=True)
        pytest.fail("a request beyond maxQueueSize (2) was not refused within 1 s: it queued")
    refused = refusal.result()
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "1"
    assert "queue is full" in (await refused.json())["error"]
    gated.gate.set()
    for response in await asyncio.wait_for(asyncio.gather(running, *queued), 5):
        assert response.status == 200
    metrics = generate_latest(client.app[DATAPLANE].metrics.registry).decode()
    assert 'kubeinfer_requests_total{code="503",model="tiny",version="1"} 1.0' in metrics
    assert 'kubeinfer_requests_total{code="200",model="tiny",version="1"} 3.0' in metrics


async def test_a_request_past_its_timeout_is_a_504_and_never_runs(client, gated) -> None:
    running = await hold_the_slot(client, gated)
    late = await client.post("/v2/models/tiny/infer", json=body(timeout_us=30_000))
    assert late.status == 504
    assert "deadline" in (await late.json())["error"]
    gated.gate.set()
    assert (await running).status == 200
    assert gated.batches == [1]  # only the first request ran


async def test_draining_turns_readiness_off_and_refuses_new_requests(client, gated) -> None:
    running = await hold_the_slot(client, gated)
    batcher = client.app[DATAPLANE].batcher
    drain = asyncio.create_task(batcher.drain(10))
    await eventually(lambda: batcher.draining, what="the drain", every=0.002, in_thread=False)
    assert (await client.get("/v2/health/ready")).status == 503
    assert (await client.get("/v2/models/tiny/ready")).status == 503
    refused = await client.post("/v2/models/tiny/infer", json=body())
    assert refused.status == 503 and "Retry-After" in refused.headers
    gated.gate.set()
    assert await drain
    assert (await running).status == 200
