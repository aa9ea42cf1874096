"""Overload and deadlines over HTTP, on the Rust data plane serving the real engine behind
a gate (the `start_serving` fixture: an execution slot held busy):

- a full queue answers 503 with Retry-After and a JSON error, at once;
- a request whose `timeout` parameter (microseconds, as tritonclient sends it) passes in
  the queue gets 504 and never runs;
- both are counted in kubeinfer_requests_total by code;
- readiness is false once draining starts and new requests get 503.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy
from waiting import eventually


def body(timeout_us: int | None = None) -> str:
    request: dict = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.1] * 16}]
    }
    if timeout_us is not None:
        request["parameters"] = {"timeout": timeout_us}
    return json.dumps(request)


class Client:
    def __init__(self, serving, session: aiohttp.ClientSession) -> None:
        self.serving, self.session = serving, session
        self.base = f"http://127.0.0.1:{serving.port}"

    async def infer(self, timeout_us: int | None = None) -> tuple[int, dict[str, str], dict]:
        url = f"{self.base}/v2/models/tiny/infer"
        async with self.session.post(url, data=body(timeout_us)) as answer:
            return answer.status, dict(answer.headers), json.loads(await answer.read())

    async def get(self, path: str) -> int:
        async with self.session.get(self.base + path) as answer:
            await answer.read()
            return answer.status


@pytest.fixture
async def client(start_serving, gated):
    serving = await start_serving(batching=BatchingPolicy(execution_slots=1, max_queue_size=2))
    async with aiohttp.ClientSession() as session:
        try:
            yield Client(serving, session)
        finally:  # a test failed holding the slot: its requests end before the server
            gated.gate.set()


async def hold_the_slot(client: Client, gated) -> asyncio.Task:
    gated.gate.clear()
    task = asyncio.create_task(client.infer())
    await eventually(lambda: gated.running, what="the first request on the engine",
                     every=0.002, in_thread=False)  # fmt: skip
    return task


async def test_a_full_queue_is_a_503_with_retry_after(client: Client, gated) -> None:
    running = await hold_the_slot(client, gated)
    queued = [asyncio.create_task(client.infer()) for _ in range(2)]
    served = client.serving.served
    await eventually(lambda: served.queued() == 2, what="the queue full", every=0.002)
    # With the slot held, anything but a refusal would wait 10 s for the gate.
    refusal = asyncio.create_task(client.infer())
    if not (await asyncio.wait({refusal}, timeout=1))[0]:
        gated.gate.set()  # let everything finish before saying so
        await asyncio.gather(refusal, running, *queued, return_exceptions=True)
        pytest.fail("a request beyond maxQueueSize (2) was not refused within 1 s: it queued")
    status, headers, refused = refusal.result()
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert "queue is full" in refused["error"]
    gated.gate.set()
    for status, _, _ in await asyncio.wait_for(asyncio.gather(running, *queued), 5):
        assert status == 200
    assert served.metric("kubeinfer_requests_total", code="503") == 1
    assert served.metric("kubeinfer_requests_total", code="200") == 3


async def test_a_request_past_its_timeout_is_a_504_and_never_runs(client: Client, gated) -> None:
    running = await hold_the_slot(client, gated)
    status, _, late = await client.infer(timeout_us=30_000)
    assert status == 504
    assert "deadline" in late["error"]
    gated.gate.set()
    assert (await running)[0] == 200
    assert gated.batches == [1]  # only the first request ran
    assert client.serving.served.metric("kubeinfer_requests_total", code="504") == 1


async def test_draining_turns_readiness_off_and_refuses_new_requests(client: Client, gated) -> None:
    running = await hold_the_slot(client, gated)
    drained = client.serving.stop()
    await eventually(
        lambda: client.serving.served.request("GET", "/v2/health/ready")[0] == 503,
        what="the drain",
        every=0.002,
    )
    assert await client.get("/v2/models/tiny/ready") == 503
    status, headers, _ = await client.infer()
    assert status == 503 and "Retry-After" in headers
    gated.gate.set()
    assert await drained == 0
    assert (await running)[0] == 200
