"""Batching policy Adaptive in the runtime, on the real ONNX Runtime engine (the tiny demo
MLP, behind the gate where a slot must be held busy):

- the configuration: Adaptive needs an SLO, in `kubeinfer serve`'s config and the batcher;
- the setting the adaptive policy chooses is the one the batcher runs with: once a batch
  is measured, a configured delay of a second no longer holds a request back from a free
  slot (it still does under Static);
- over HTTP: `GET /v2/batching` reports the policy, the setting in force, why, and what
  was measured; /metrics carries the SLO and the same setting; Static reports its
  configured values and exports no adaptive series.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubeinfer.contract.runtime_config import (
    BatchingPolicy,
    BatchingPolicyKind,
    EngineSource,
    RuntimeConfig,
)
from kubeinfer.runtime.batching.adaptive import DECISION_INTERVAL_SECONDS, SettingReason
from kubeinfer.runtime.batching.queue import Batcher
from kubeinfer.runtime.serve_command import ServeSettings, config_from_settings
from prometheus_client.parser import text_string_to_metric_families
from served_app import app_of
from test_batch_scheduler import rows
from waiting import eventually

ADAPTIVE = BatchingPolicyKind.ADAPTIVE


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


def test_the_batcher_refuses_adaptive_batching_without_an_slo(tiny_engine) -> None:
    with pytest.raises(ValueError, match="Adaptive needs an SLO"):
        Batcher(tiny_engine, BatchingPolicy(policy=ADAPTIVE))


class SteppedClock:
    """The batcher's clock: the monotonic one, stepped ahead on demand, so that a decision
    interval passes between two batches without the test sleeping through it (each
    batch's own time, read while no step is taken, stays the real one)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead

    def pass_decision_interval(self) -> None:
        self.ahead += DECISION_INTERVAL_SECONDS * 2


async def a_free_slot_takes_a_request_within(policy: BatchingPolicy, gated) -> float | None:
    """With one of two slots held busy, the seconds until a second request runs on the
    other (None: not within 0.5 s). One request runs first, so a batch is measured."""
    clock = SteppedClock()
    batcher = Batcher(
        gated, policy, slo_p99_latency_milliseconds=0.001, inline_below_seconds=0.0, clock=clock
    )  # no batch inline: a held one would hold the event loop
    await batcher.start()
    held = second = None
    try:
        await batcher.infer(rows(1), 1)
        clock.pass_decision_interval()
        gated.gate.clear()
        held = asyncio.create_task(batcher.infer(rows(1), 1))
        await eventually(
            lambda: gated.running == 1, what="the first batch running", every=0.002, in_thread=False
        )
        started = asyncio.get_running_loop().time()
        second = asyncio.create_task(batcher.infer(rows(1), 1))
        try:
            await eventually(lambda: gated.running == 2, within=0.5, every=0.002, in_thread=False)
        except AssertionError:
            return None
        return asyncio.get_running_loop().time() - started
    finally:
        gated.gate.set()
        await asyncio.gather(*(t for t in (held, second) if t), return_exceptions=True)
        await batcher.close()


async def test_the_adaptive_setting_replaces_the_configured_delay(gated) -> None:
    # A 1 µs SLO no batch can meet: the adaptive policy's answer is the lowest latency,
    # no delay, where the configured second-long delay would hold the request back.
    slow_static = BatchingPolicy(execution_slots=2, max_queue_delay_microseconds=1_000_000)
    adaptive = slow_static.model_copy(update={"policy": ADAPTIVE})
    assert await a_free_slot_takes_a_request_within(slow_static, gated) is None
    assert await a_free_slot_takes_a_request_within(adaptive, gated) is not None


def gauges(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if family.type == "gauge"
    }


def config(tiny_model, policy: BatchingPolicy, slo: float | None) -> RuntimeConfig:
    return RuntimeConfig(
        model_name="tiny",
        engine=EngineSource(onnx_path=str(tiny_model)),
        batching=policy,
        slo_p99_latency_milliseconds=slo,
    )


def body(n: int) -> dict:
    return {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [n, 16], "data": [0.1] * 16 * n}]
    }


async def test_an_adaptive_runtime_reports_its_slo_setting_and_measurements(
    tiny_engine, tiny_model
) -> None:
    policy = BatchingPolicy(
        policy=ADAPTIVE, execution_slots=2, max_batch_size=16, slo_margin_percent=25
    )
    app = app_of(config(tiny_model, policy, 1000), tiny_engine)
    async with TestClient(TestServer(app)) as client:
        before = await (await client.get("/v2/batching")).json()
        assert before["policy"] == "Adaptive"
        assert before["reason"] == SettingReason.UNMEASURED
        assert (before["queueDelayMicroseconds"], before["preferredBatchSize"]) == (2000, 16)
        assert before["targetP99Milliseconds"] == pytest.approx(750)
        assert before["computeAlone"] == before["computeBesideAnother"] == []

        for _ in range(3):
            answers = await asyncio.gather(
                *(client.post("/v2/models/tiny/infer", json=body(n)) for n in (1, 3, 4, 8))
            )
            assert [a.status for a in answers] == [200] * 4
            await asyncio.sleep(DECISION_INTERVAL_SECONDS)  # not a wait: a decision interval passes
        await client.post("/v2/models/tiny/infer", json=body(1))  # a step after the interval

        status = await (await client.get("/v2/batching")).json()
        # The tiny model's batches take microseconds (a shared machine's hiccups: a few ms)
        assert status["reason"] == SettingReason.WITHIN_SLO
        assert status["arrivalRowsPerSecond"] > 0
        measured = status["computeAlone"] + status["computeBesideAnother"]
        assert measured and all(m["meanMilliseconds"] > 0 for m in measured)
        alone = [m["rows"] for m in status["computeAlone"]]
        assert alone == sorted(alone)
        assert 1 <= status["parallelSlots"] <= 2
        assert 1 <= status["preferredBatchSize"] <= 16
        assert status["predictedP99Milliseconds"] <= 750

        exported = gauges(await (await client.get("/metrics")).text())
        assert exported["kubeinfer_slo_p99_latency_seconds"] == pytest.approx(1.0)
        assert exported["kubeinfer_batching_queue_delay_seconds"] == pytest.approx(
            status["queueDelayMicroseconds"] / 1e6
        )
        assert exported["kubeinfer_batching_preferred_batch_size"] == status["preferredBatchSize"]


@pytest.mark.parametrize("slo", [None, 25.0])
async def test_a_static_runtime_reports_its_configured_values(tiny_engine, tiny_model, slo) -> None:
    policy = BatchingPolicy(max_queue_delay_microseconds=500, preferred_batch_sizes=[4, 8])
    app = app_of(config(tiny_model, policy, slo), tiny_engine)
    async with TestClient(TestServer(app)) as client:
        assert (await client.post("/v2/models/tiny/infer", json=body(2))).status == 200
        status = await (await client.get("/v2/batching")).json()
        assert status == {
            "policy": "Static",
            "sloP99LatencyMilliseconds": slo,
            "maxBatchSize": 32,
            "queueDelayMicroseconds": 500,
            "preferredBatchSize": 8,
            "configuredMaxBatchSize": 32,
            "outputRowMismatches": 0,
        }
        exported = gauges(await (await client.get("/metrics")).text())
        assert not any(name.startswith("kubeinfer_batching_") for name in exported)
        if slo is None:
            assert "kubeinfer_slo_p99_latency_seconds" not in exported
        else:
            assert exported["kubeinfer_slo_p99_latency_seconds"] == pytest.approx(0.025)


async def test_batches_are_timed_apart_alone_and_beside_another(gated) -> None:
    policy = BatchingPolicy(policy=ADAPTIVE, execution_slots=2)
    clock = SteppedClock()
    batcher = Batcher(
        gated, policy, slo_p99_latency_milliseconds=0.001, inline_below_seconds=0.0, clock=clock
    )
    await batcher.start()
    try:
        await batcher.infer(rows(4), 4)  # alone
        clock.pass_decision_interval()
        gated.gate.clear()
        first = asyncio.create_task(batcher.infer(rows(1), 1))
        await eventually(
            lambda: gated.running == 1, what="the first batch running", every=0.002, in_thread=False
        )
        second = asyncio.create_task(batcher.infer(rows(2), 2))  # no delay: beside it
        await eventually(
            lambda: gated.running == 2,
            what="the second batch running beside it",
            every=0.002,
            in_thread=False,
        )
        gated.gate.set()
        await asyncio.gather(first, second)
        status = batcher.batching_status()
        assert [m["rows"] for m in status["computeAlone"]] == [4]
        assert [m["rows"] for m in status["computeBesideAnother"]] == [1, 2]
    finally:
        gated.gate.set()
        await batcher.close()


async def test_slots_that_slow_each_other_down_run_one_batch_at_a_time(gated) -> None:
    # Two batches held side by side take far longer than one alone: measured so, the two
    # slots are worth one, and a second batch waits for the first instead of starting.
    policy = BatchingPolicy(policy=ADAPTIVE, execution_slots=2)
    clock = SteppedClock()
    batcher = Batcher(
        gated, policy, slo_p99_latency_milliseconds=60_000, inline_below_seconds=0.0, clock=clock
    )
    await batcher.start()
    try:
        await batcher.infer(rows(1), 1)  # alone: fast
        clock.pass_decision_interval()
        gated.gate.clear()
        held = [asyncio.create_task(batcher.infer(rows(1), 1))]
        await eventually(
            lambda: gated.running == 1, what="a batch running", every=0.002, in_thread=False
        )
        held.append(asyncio.create_task(batcher.infer(rows(1), 1)))
        await eventually(
            lambda: gated.running == 2,
            what="two batches side by side",
            every=0.002,
            in_thread=False,
        )
        await asyncio.sleep(0.05)  # not a wait: the 50 ms the two spend beside each other
        gated.gate.set()
        await asyncio.gather(*held)
        clock.pass_decision_interval()

        gated.gate.clear()
        first = asyncio.create_task(batcher.infer(rows(1), 1))
        await eventually(
            lambda: gated.running == 1, what="the next batch running", every=0.002, in_thread=False
        )
        second = asyncio.create_task(batcher.infer(rows(1), 1))
        await asyncio.sleep(0.3)  # not a wait: time for a second batch to start, which must not
        assert gated.running == 1, "a second batch started beside the first"
        status = batcher.batching_status()
        assert (status["concurrentBatches"], status["parallelSlots"]) == (1, 1.0)
        gated.gate.set()
        await asyncio.gather(first, second)
    finally:
        gated.gate.set()
        await batcher.close()
