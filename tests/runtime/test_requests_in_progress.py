"""`kubeinfer_requests_in_progress`: the inference requests the data plane has admitted
and not yet answered, the autoscaler's load signal (`requests_in_progress_per_replica`), read as a
scrape reads it, from the app's own /metrics.

Covers, on the app from `served_app.app_of` with the real ONNX Runtime engine behind the
gate (`conftest.GatedEngine`) and one execution slot: a request held on the slot and the ones
queued behind it are counted from their start to their answer (while they are held, the
gauge is the batcher's queued plus in-flight requests); requests answered with an error
while others are held (400: inputs the model does not take; 404: no such model; 503: the
queue is full) and one whose caller went away (cancelled while queued) are counted only
until they end, so the gauge goes back to the held count after each; once everything is
answered it reads 0.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubeinfer.contract.runtime_config import BatchingPolicy, EngineSource, RuntimeConfig
from kubeinfer.runtime.dataplane import DataPlane
from kubeinfer.runtime.http.app import DATAPLANE
from kubeinfer.runtime.protocol.tensor_codec import decode_infer_request
from kubeinfer.runtime.protocol.v2_types import InferResponse
from prometheus_client.parser import text_string_to_metric_families
from served_app import app_of
from waiting import eventually

INFER = "/v2/models/tiny/infer"
GAUGES = ("kubeinfer_requests_in_progress", "kubeinfer_queue_depth", "kubeinfer_inflight_requests")


def body(width: int = 16) -> dict:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, width],
                        "data": [0.1] * width}]}  # fmt: skip


class Runtime:
    """The app under a test client; every request sent in the background is awaited at
    teardown, so a failed test leaves no task behind."""

    def __init__(self, client: TestClient, gated) -> None:
        self.client, self.gated = client, gated
        self.dataplane = client.app[DATAPLANE]
        self.sent: list[asyncio.Task] = []

    def send(self, path: str = INFER, request_body: dict | None = None) -> asyncio.Task[int]:
        """POSTs in the background; the task's result is the HTTP status."""
        task = asyncio.create_task(self.post(path, request_body or body()))
        self.sent.append(task)
        return task

    async def post(self, path: str, request_body: dict) -> int:
        async with self.client.post(path, json=request_body) as response:
            await response.read()
            return response.status

    async def scraped(self) -> tuple[float, ...]:
        """(requests in progress, queued, in flight), from GET /metrics."""
        async with self.client.get("/metrics") as response:
            assert response.status == 200
            text = await response.text()
        values = {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.labels == {"model": "tiny", "version": "1"}
        }
        return tuple(values[name] for name in GAUGES)

    async def hold_three(self) -> list[asyncio.Task[int]]:
        """One request running on the held slot, two queued behind it (the queue's limit)."""
        self.gated.gate.clear()
        held = [self.send()]
        await eventually(
            lambda: self.gated.running == 1,
            what="the first request on the slot",
            every=0.002,
            in_thread=False,
        )
        held += [self.send(), self.send()]
        await eventually(
            lambda: self.dataplane.batcher.queued == 2,
            what="two requests queued",
            every=0.002,
            in_thread=False,
        )
        return held


@pytest.fixture
async def runtime(gated, tiny_model, request):
    # Two queue places by default: three requests fill the slot and the queue. A test that
    # needs a place left for one more (admission counts requests being read or decoded
    # too, so a full queue refuses even a malformed request with 503) asks for three.
    queue_size = getattr(request, "param", 2)
    config = RuntimeConfig(
        model_name="tiny",
        engine=EngineSource(onnx_path=str(tiny_model)),
        batching=BatchingPolicy(execution_slots=1, max_queue_size=queue_size),
    )
    async with TestClient(TestServer(app_of(config, gated))) as client:
        runtime = Runtime(client, gated)
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
    assert await runtime.scraped() == (0, 0, 0)


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
    assert await runtime.scraped() == (0, 0, 0)


async def infer_in_the_dataplane(dataplane: DataPlane) -> InferResponse:
    """One request through the data plane alone, as a transport takes it there."""

    async def unencoded(response: InferResponse) -> InferResponse:
        return response

    with dataplane.admitted("tiny", None) as admission:
        request = decode_infer_request(json.dumps(body()).encode(), None, dataplane.limits)
        answer, _ = await dataplane.infer_decoded(admission, request, unencoded)
    return answer


async def test_a_request_whose_caller_went_away_is_no_longer_in_progress(runtime, gated) -> None:
    """Cancelled in the data plane itself: aiohttp does not cancel a handler whose client
    disconnected, but a server shutting down does."""
    dataplane = runtime.dataplane
    gated.gate.clear()
    running = runtime.send()
    await eventually(
        lambda: gated.running == 1,
        what="the first request on the slot",
        every=0.002,
        in_thread=False,
    )
    gone = asyncio.create_task(infer_in_the_dataplane(dataplane))
    runtime.sent.append(gone)
    await eventually(
        lambda: dataplane.batcher.queued == 1,
        what="the second request queued",
        every=0.002,
        in_thread=False,
    )
    assert await runtime.scraped() == (2, 1, 1)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert (await runtime.scraped())[0] == 1
    gated.gate.set()
    assert await running == 200
    assert gated.batches == [1]  # the cancelled request never ran
    assert await runtime.scraped() == (0, 0, 0)
