"""Batching as a client sees it, on the Rust data plane serving the real ONNX Runtime
engine (tiny demo MLP) behind the gate (`conftest.GatedEngine`, the `start_serving`
fixture): a test holds an execution slot busy and decides what queues, and reads what is
queued and in flight from the server's own /metrics.

Covers: requests that queue while a slot is busy run as one batch and each gets its own
rows (requests with batch dimension > 1 included), equal to ONNX Runtime run directly;
one engine error fails every request of its batch with a JSON 500 and the next batch runs
fine; a lone request pays no queue delay even with a second-long one; several execution
slots run batches side by side, and unset execution slots take the engine's choice (one:
a request arriving while it runs queues behind it); `kubeinfer_inflight_requests` counts
the requests of the running batch (not its rows, nor its batches), the ones queued behind
it count as queued only and replace them in flight once it finishes, and a batch the
engine fails on leaves nothing in flight.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import onnxruntime as ort
import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy
from waiting import eventually

GAUGES = ("kubeinfer_queue_depth", "kubeinfer_inflight_requests", "kubeinfer_inflight_batches")
ANSWERED = "still counted after every answer came: a scrape must not lag the answers"


@pytest.fixture
def reference(tiny_model: Path):
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x})[0]


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


class Client:
    """Infer requests to a `Serving`, and what its /metrics says is queued and running."""

    def __init__(self, serving, session: aiohttp.ClientSession) -> None:
        self.serving, self.session = serving, session

    async def infer(self, x: np.ndarray) -> tuple[int, dict]:
        tensor = {"name": "input", "datatype": "FP32", "shape": list(x.shape),
                  "data": x.ravel().tolist()}  # fmt: skip
        url = f"http://127.0.0.1:{self.serving.port}/v2/models/tiny/infer"
        async with self.session.post(url, data=json.dumps({"inputs": [tensor]})) as answer:
            return answer.status, json.loads(await answer.read())

    def logits(self, answer: tuple[int, dict]) -> np.ndarray:
        status, body = answer
        assert status == 200, body
        [output] = body["outputs"]
        return np.array(output["data"], np.float32).reshape(output["shape"])

    def gauges(self) -> tuple[float, ...]:
        """(queued, requests in flight, batches in flight)."""
        values = self.serving.served.gauges()
        return tuple(values[name] for name in GAUGES)

    async def queued(self, count: int) -> None:
        await eventually(
            lambda: self.serving.served.queued() == count, what=f"{count} queued", every=0.002
        )


@pytest.fixture
async def client(start_serving) -> AsyncIterator:
    """`client(**config)`: the gated tiny model served with the config changed so."""
    async with aiohttp.ClientSession() as session:

        async def serve(**updates: object) -> Client:
            return Client(await start_serving(**updates), session)

        yield serve


async def running(gated, count: int = 1) -> None:
    await eventually(lambda: gated.running >= count, what=f"{count} slots running", every=0.002)


def one_slot(**policy: object) -> BatchingPolicy:
    return BatchingPolicy(**{"execution_slots": 1, "max_queue_size": 16, **policy})


async def test_requests_queued_while_busy_run_as_one_batch(client, gated, reference) -> None:
    served = await client(batching=one_slot())
    gated.gate.clear()
    first = asyncio.create_task(served.infer(rows(1, 0)))
    await running(gated)
    sizes = [1, 3, 1, 2, 5]  # some requests carry their own batch dimension
    inputs = [rows(n, seed) for seed, n in enumerate(sizes, start=1)]
    waiting = [asyncio.create_task(served.infer(x)) for x in inputs]
    await served.queued(len(inputs))
    gated.gate.set()
    answers = await asyncio.gather(first, *waiting)
    assert gated.batches == [1, sum(sizes)]
    for x, answer in zip([rows(1, 0), *inputs], answers, strict=True):
        np.testing.assert_allclose(served.logits(answer), reference(x), rtol=1e-5, atol=1e-6)


async def test_an_engine_error_fails_its_batch_only(client, gated, reference) -> None:
    served = await client(batching=one_slot())
    gated.gate.clear()
    blocker = asyncio.create_task(served.infer(rows(1, 0)))
    await running(gated)
    batch = [asyncio.create_task(served.infer(rows(1, i))) for i in range(1, 5)]
    await served.queued(4)
    gated.fail_rows = 4  # the batch of the four queued requests fails
    gated.gate.set()
    assert (await blocker)[0] == 200
    for status, body in await asyncio.gather(*batch):
        assert status == 500 and "simulated engine failure" in body["error"], body
    assert gated.batches == [1]
    assert served.gauges() == (0, 0, 0), ANSWERED  # nothing left in flight
    gated.fail_rows = None
    after = served.logits(await served.infer(rows(1, 5)))
    np.testing.assert_allclose(after, reference(rows(1, 5)), rtol=1e-5, atol=1e-6)


async def test_a_lone_request_pays_no_queue_delay(client) -> None:
    # Were the second-long delay waited for (or more requests), the answer would take it.
    policy = BatchingPolicy(
        execution_slots=2, preferred_batch_sizes=[8], max_queue_delay_microseconds=1_000_000
    )
    served = await client(batching=policy)
    await served.infer(rows(1, 0))  # the first request's connection and decoding set up
    started = time.monotonic()
    assert (await served.infer(rows(1, 1)))[0] == 200
    assert time.monotonic() - started < 0.5


async def test_execution_slots_run_batches_side_by_side(client, gated) -> None:
    served = await client(batching=one_slot(execution_slots=2, max_queue_delay_microseconds=0))
    gated.gate.clear()
    first = asyncio.create_task(served.infer(rows(1, 0)))
    await running(gated)
    second = asyncio.create_task(served.infer(rows(1, 1)))
    await running(gated, 2)
    gated.gate.set()
    assert [status for status, _ in await asyncio.gather(first, second)] == [200, 200]
    assert gated.max_running == 2


async def test_unset_execution_slots_take_the_engines_choice(client, gated) -> None:
    # ONNX Runtime's threads already fill the cores: one slot, so requests arriving while
    # it runs queue into the next batch instead of running beside it.
    assert BatchingPolicy().execution_slots is None
    assert gated.default_execution_slots == 1
    served = await client(batching=BatchingPolicy(max_queue_delay_microseconds=0))
    gated.gate.clear()
    first = asyncio.create_task(served.infer(rows(1, 0)))
    await running(gated)
    second = asyncio.create_task(served.infer(rows(1, 1)))
    await served.queued(1)  # queued behind the held slot, not run beside it
    assert gated.running == 1
    gated.gate.set()
    assert [status for status, _ in await asyncio.gather(first, second)] == [200, 200]
    assert gated.max_running == 1


async def test_requests_in_running_batches_are_in_flight_and_the_rest_queued(client, gated) -> None:
    served = await client(batching=one_slot())
    assert served.gauges() == (0, 0, 0), ANSWERED
    gated.gate.clear()
    first = asyncio.create_task(served.infer(rows(4, 0)))
    await running(gated)
    assert served.gauges() == (0, 1, 1)  # one request of 4 rows
    queued = [asyncio.create_task(served.infer(rows(n, n))) for n in (1, 3, 2)]
    await served.queued(3)
    assert served.gauges() == (3, 1, 1)
    next_batch = gated.hold(6)  # the three queued requests' batch waits at a gate of its own
    gated.gate.set()
    assert (await first)[0] == 200
    await eventually(lambda: gated.running == 1, what="the next batch running", every=0.002)
    assert served.gauges() == (0, 3, 1)
    next_batch.set()
    assert [status for status, _ in await asyncio.gather(*queued)] == [200] * 3
    assert gated.batches == [4, 6]
    assert served.gauges() == (0, 0, 0), ANSWERED
