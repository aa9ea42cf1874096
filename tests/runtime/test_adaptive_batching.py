"""Batching policy Adaptive in the runtime, on the Rust data plane serving the real ONNX
Runtime engine (the tiny demo MLP, behind the gate where a slot must be held busy):

- the configuration: Adaptive needs an SLO in `kubeinfer serve`'s config;
- the setting the adaptive policy chooses is the one the server runs with: once a batch
  is measured, a configured delay of a second no longer holds a request back from a free
  slot (it still does under Static); batches are timed apart, alone and beside another,
  and slots that slow each other down are then run one batch at a time;
- over HTTP: `GET /v2/batching` reports the policy, the setting in force, why, and what
  was measured; /metrics carries the SLO and the same setting; Static reports its
  configured values and exports no adaptive series.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest
from kubeinfer.contract.runtime_config import (
    BatchingPolicy,
    BatchingPolicyKind,
    EngineSource,
    RuntimeConfig,
)
from kubeinfer.runtime.serve_command import ServeSettings, config_from_settings
from rust_served import rust_served
from waiting import eventually

ADAPTIVE = BatchingPolicyKind.ADAPTIVE

DECISION_INTERVAL_SECONDS = 0.02
"""The Rust scheduler's: Adaptive decides its setting again at most this often."""


def test_serve_refuses_adaptive_batching_without_an_slo(tmp_path, tiny_model) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"modelName: tiny\nengine: {{onnxPath: {tiny_model}}}\nbatching: {{policy: Adaptive}}\n"
    )
    with pytest.raises(
        ValueError, match="batching policy Adaptive needs sloP99LatencyMilliseconds"
    ):
        config_from_settings(ServeSettings(config=config))
    config.write_text(config.read_text() + "sloP99LatencyMilliseconds: 40\n")
    loaded = config_from_settings(ServeSettings(config=config))
    assert (loaded.batching.policy, loaded.slo_p99_latency_milliseconds) == (ADAPTIVE, 40)


def rows(n: int) -> dict:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [n, 16],
                        "data": [0.1] * 16 * n}]}  # fmt: skip


class Client:
    def __init__(self, serving, session: aiohttp.ClientSession) -> None:
        self.serving, self.session = serving, session
        self.base = f"http://127.0.0.1:{serving.port}"

    async def infer(self, n: int) -> int:
        url = f"{self.base}/v2/models/tiny/infer"
        async with self.session.post(url, data=json.dumps(rows(n))) as answer:
            await answer.read()
            return answer.status

    def batching(self) -> dict:
        return self.serving.served.get_json("/v2/batching")


@pytest.fixture
async def client(start_serving) -> AsyncIterator:
    """`client(policy, slo)`: the gated tiny model served under that policy and SLO."""
    async with aiohttp.ClientSession() as session:

        async def serve(policy: BatchingPolicy, slo: float | None) -> Client:
            serving = await start_serving(batching=policy, slo_p99_latency_milliseconds=slo)
            return Client(serving, session)

        yield serve


async def a_decision_interval_passes() -> None:
    await asyncio.sleep(2 * DECISION_INTERVAL_SECONDS)  # not a wait: the interval is the test


async def a_free_slot_takes_a_request_within(client: Client, gated) -> float | None:
    """With one of two slots held busy, the seconds until a second request runs on the
    other (None: not within 0.5 s). One request runs first, so a batch is measured."""
    assert await client.infer(1) == 200
    await a_decision_interval_passes()
    gated.gate.clear()
    held = asyncio.create_task(client.infer(1))
    second = None
    try:
        await eventually(lambda: gated.running == 1, what="the first batch running", every=0.002)
        started = time.monotonic()
        second = asyncio.create_task(client.infer(1))
        try:
            await eventually(lambda: gated.running == 2, within=0.5, every=0.002)
        except AssertionError:
            return None
        return time.monotonic() - started
    finally:
        gated.gate.set()
        await asyncio.gather(*(t for t in (held, second) if t), return_exceptions=True)


async def test_the_adaptive_setting_replaces_the_configured_delay(client, gated) -> None:
    # A 1 µs SLO no batch can meet: the adaptive policy's answer is the lowest latency,
    # no delay, where the configured second-long delay would hold the request back.
    slow_static = BatchingPolicy(execution_slots=2, max_queue_delay_microseconds=1_000_000)
    adaptive = slow_static.model_copy(update={"policy": ADAPTIVE})
    assert await a_free_slot_takes_a_request_within(await client(slow_static, None), gated) is None
    served = await client(adaptive, 0.001)
    assert await a_free_slot_takes_a_request_within(served, gated) is not None


def config(tiny_model, policy: BatchingPolicy, slo: float | None) -> RuntimeConfig:
    return RuntimeConfig(
        model_name="tiny",
        engine=EngineSource(onnx_path=str(tiny_model)),
        host="127.0.0.1",
        batching=policy,
        slo_p99_latency_milliseconds=slo,
    )


def post(served, n: int) -> int:
    return served.request("POST", served.infer_path, json.dumps(rows(n)).encode())[0]


def test_an_adaptive_runtime_reports_its_slo_setting_and_measurements(
    tiny_engine, tiny_model
) -> None:
    policy = BatchingPolicy(
        policy=ADAPTIVE, execution_slots=2, max_batch_size=16, slo_margin_percent=25
    )
    with rust_served(config(tiny_model, policy, 1000), tiny_engine) as served:
        before = served.get_json("/v2/batching")
        assert before["policy"] == "Adaptive"
        assert before["reason"] == "Unmeasured"
        assert (before["queueDelayMicroseconds"], before["preferredBatchSize"]) == (2000, 16)
        assert before["targetP99Milliseconds"] == pytest.approx(750)
        assert before["computeAlone"] == before["computeBesideAnother"] == []

        with ThreadPoolExecutor(4) as pool:
            for _ in range(3):
                assert list(pool.map(lambda n: post(served, n), (1, 3, 4, 8))) == [200] * 4
                time.sleep(DECISION_INTERVAL_SECONDS)  # not a wait: a decision interval passes
        assert post(served, 1) == 200  # a step after the interval

        status = served.get_json("/v2/batching")
        # The tiny model's batches take microseconds (a shared machine's hiccups: a few ms)
        assert status["reason"] == "WithinSlo"
        assert status["arrivalRowsPerSecond"] > 0
        measured = status["computeAlone"] + status["computeBesideAnother"]
        assert measured and all(m["meanMilliseconds"] > 0 for m in measured)
        alone = [m["rows"] for m in status["computeAlone"]]
        assert alone == sorted(alone)
        assert 1 <= status["parallelSlots"] <= 2
        assert 1 <= status["preferredBatchSize"] <= 16
        assert status["predictedP99Milliseconds"] <= 750

        exported = served.gauges()
        assert exported["kubeinfer_slo_p99_latency_seconds"] == pytest.approx(1.0)
        assert exported["kubeinfer_batching_queue_delay_seconds"] == pytest.approx(
            status["queueDelayMicroseconds"] / 1e6
        )
        assert exported["kubeinfer_batching_preferred_batch_size"] == status["preferredBatchSize"]


@pytest.mark.parametrize("slo", [None, 25.0])
def test_a_static_runtime_reports_its_configured_values(tiny_engine, tiny_model, slo) -> None:
    policy = BatchingPolicy(max_queue_delay_microseconds=500, preferred_batch_sizes=[4, 8])
    with rust_served(config(tiny_model, policy, slo), tiny_engine) as served:
        assert post(served, 2) == 200
        status = served.get_json("/v2/batching")
        assert status == {
            "policy": "Static",
            "sloP99LatencyMilliseconds": slo,
            "maxBatchSize": 32,
            "queueDelayMicroseconds": 500,
            "preferredBatchSize": 8,
            "configuredMaxBatchSize": 32,
            "outputRowMismatches": 0,
        }
        exported = served.gauges()
        assert not any(name.startswith("kubeinfer_batching_") for name in exported)
        if slo is None:
            assert "kubeinfer_slo_p99_latency_seconds" not in exported
        else:
            assert exported["kubeinfer_slo_p99_latency_seconds"] == pytest.approx(0.025)


async def test_batches_are_timed_apart_alone_and_beside_another(client, gated) -> None:
    served = await client(BatchingPolicy(policy=ADAPTIVE, execution_slots=2), 0.001)
    assert await served.infer(4) == 200  # alone
    await a_decision_interval_passes()
    gated.gate.clear()
    first = asyncio.create_task(served.infer(1))
    await eventually(lambda: gated.running == 1, what="the first batch running", every=0.002)
    second = asyncio.create_task(served.infer(2))  # no delay: beside it
    await eventually(
        lambda: gated.running == 2, what="the second batch running beside it", every=0.002
    )
    gated.gate.set()
    assert await asyncio.gather(first, second) == [200, 200]
    status = served.batching()
    assert [m["rows"] for m in status["computeAlone"]] == [4]
    assert [m["rows"] for m in status["computeBesideAnother"]] == [1, 2]


async def test_slots_that_slow_each_other_down_run_one_batch_at_a_time(client, gated) -> None:
    # Two batches held side by side take far longer than one alone: measured so, the two
    # slots are worth one, and a second batch waits for the first instead of starting.
    served = await client(BatchingPolicy(policy=ADAPTIVE, execution_slots=2), 60_000)
    assert await served.infer(1) == 200  # alone: fast
    await a_decision_interval_passes()
    gated.gate.clear()
    held = [asyncio.create_task(served.infer(1))]
    await eventually(lambda: gated.running == 1, what="a batch running", every=0.002)
    held.append(asyncio.create_task(served.infer(1)))
    await eventually(lambda: gated.running == 2, what="two batches side by side", every=0.002)
    await asyncio.sleep(0.05)  # not a wait: the 50 ms the two spend beside each other
    gated.gate.set()
    assert await asyncio.gather(*held) == [200, 200]
    await a_decision_interval_passes()

    gated.gate.clear()
    first = asyncio.create_task(served.infer(1))
    await eventually(lambda: gated.running == 1, what="the next batch running", every=0.002)
    second = asyncio.create_task(served.infer(1))
    await asyncio.sleep(0.3)  # not a wait: time for a second batch to start, which must not
    assert gated.running == 1, "a second batch started beside the first"
    status = served.batching()
    assert (status["concurrentBatches"], status["parallelSlots"]) == (1, 1.0)
    gated.gate.set()
    assert await asyncio.gather(first, second) == [200, 200]
