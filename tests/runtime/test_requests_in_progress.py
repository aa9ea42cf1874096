"""`kubeinfer_requests_in_progress`: the inference requests the data plane has admitted
and not yet answered, the autoscaler's load signal (`requests_in_progress_per_replica`), read as a
scrape reads it, from the server's own /metrics.

Covers, on the Rust data plane serving the real ONNX Runtime engine behind the gate
(`conftest.GatedEngine`, the `start_serving` fixture) on one execution slot: a request held
on the slot and the ones queued behind it are counted from their start to their answer
(while they are held, the gauge is the queued plus in-flight requests); requests answered
with an error while others are held (400: inputs the model does not take; 404: no such
model; 503: the queue is full) and one whose client went away while it was queued are
counted only until they end, so the gauge goes back to the held count after each; the one
that went away never runs and is counted cancelled at its stage (`waiting`); once
everything is answered it reads 0.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy
from waiting import eventually

INFER = "/v2/models/tiny/infer"
GAUGES = ("kubeinfer_requests_in_progress", "kubeinfer_queue_depth", "kubeinfer_inflight_requests")
ANSWERED = "still counted after every answer came: a scrape must not lag the answers"


def body(width: int = 16) -> dict:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, width],
                        "data": [0.1] * width}]}  # fmt: skip


class Runtime:
    """The served gated model and a client of it; every request sent in the background is
    awaited at teardown, so a failed test leaves no task behind."""

    def __init__(self, serving, session: aiohttp.ClientSession, gated) -> None:
        self.serving, self.session, self.gated = serving, session, gated
        self.served = serving.served
        self.sent: list[asyncio.Task] = []

    def send(self, path: str = INFER, request_body: dict | None = None) -> asyncio.Task[int]:
        """POSTs in the background; the task's result is the HTTP status."""
        task = asyncio.create_task(self.post(path, request_body or body()))
        self.sent.append(task)
        return task

    async def post(self, path: str, request_body: dict) -> int:
        url = f"http://127.0.0.1:{self.serving.port}{path}"
        async with self.session.post(url, data=json.dumps(request_body)) as response:
            await response.read()
            return response.status

    async def scraped(self) -> tuple[float, ...]:
        """(requests in progress, queued, in flight), from GET /metrics."""
        gauges = await asyncio.to_thread(self.served.gauges)
        return tuple(gauges[name] for name in GAUGES)

    async def hold_three(self) -> list[asyncio.Task[int]]:
        """One request running on the held slot, two queued behind it (the queue's limit)."""
        self.gated.gate.clear()
        held = [self.send()]
        await eventually(
            lambda: self.gated.running == 1, what="the first request on the slot", every=0.002
        )
        held += [self.send(), self.send()]
        await eventually(lambda: self.served.queued() == 2, what="two requests queued", every=0.002)
        return held


@pytest.fixture
async def runtime(start_serving, gated, request):
    # Two queue places by default: three requests fill the slot and the queue. A test that
    # needs a place left for one more (admission counts requests being read or decoded
    # too, so a full queue refuses even a malformed request with 503) asks for three.
    queue_size = getattr(request, "param", 2)
    serving = await start_serving(
        batching=BatchingPolicy(execution_slots=1, max_queue_size=queue_size)
    )
    async with aiohttp.ClientSession() as session:
        runtime = Runtime(serving, session, gated)
        try:
            yield runtime
        finally:
            gated.gate.set()
            await asyncio.gather(*runtime.sent, return_exceptions=True)


async def test_requests_are_in_progress_from_their_start_to_their_answer(runtime, gated) -> None:
    assert await runtime.scraped() == (0, 0, 0)
    held = await runtime.hold_three()
    assert await runtime.scraped() == (3, 2, 1)
    gated.gate.set()
    assert await asyncio.gather(*held) == [200] * 3
    assert gated.batches == [1, 2]
    assert await runtime.scraped() == (0, 0, 0), ANSWERED


@pytest.mark.parametrize(
    ("path", "request_body", "status", "runtime"),
    [
        (INFER, body(width=15), 400, 3),  # the model takes 16 columns
        ("/v2/models/other/infer", body(), 404, 3),
        (INFER, body(), 503, 2),  # the queue already holds its 2
    ],
    indirect=["runtime"],
)
async def test_a_request_answered_with_an_error_is_no_longer_in_progress(
    runtime, gated, path: str, request_body: dict, status: int
) -> None:
    held = await runtime.hold_three()
    try:  # answered while the slot is held: a request let into the queue would wait 10 s
        answered = await asyncio.wait_for(runtime.post(path, request_body), 1)
    except TimeoutError:
        pytest.fail(f"no {status} within 1 s while the slot is held: the request was queued")
    assert answered == status
    assert await runtime.scraped() == (3, 2, 1)
    gated.gate.set()
    assert await asyncio.gather(*held) == [200] * 3
    assert await runtime.scraped() == (0, 0, 0), ANSWERED


async def test_a_request_whose_client_went_away_is_no_longer_in_progress(runtime, gated) -> None:
    served = runtime.served
    gated.gate.clear()
    running = runtime.send()
    await eventually(lambda: gated.running == 1, what="the first request on the slot", every=0.002)
    payload = json.dumps(body()).encode()
    _, writer = await asyncio.open_connection("127.0.0.1", runtime.serving.port)
    writer.write(
        f"POST {INFER} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    await eventually(lambda: served.queued() == 1, what="the second request queued", every=0.002)
    assert await runtime.scraped() == (2, 1, 1)
    writer.transport.abort()  # gone while queued: a reset, its answer never read
    await eventually(
        lambda: served.in_progress() == 1, what="the request gone from progress", every=0.002
    )
    gated.gate.set()
    assert await running == 200
    assert gated.batches == [1]  # the request that went away never ran
    assert await runtime.scraped() == (0, 0, 0), ANSWERED
    assert served.metric("kubeinfer_requests_cancelled_total", stage="waiting") == 1
