"""Autoscaling end to end, on loopback: real `kubeinfer serve` processes standing in for the
serving pods (`process_kubelet`), a real client driving them through their "Service", a
real Prometheus scraping them (targets follow the pods), and the real operator (against
the emulated API server) reading Prometheus and setting the Deployment's replicas.

One scenario, in order: load arrives → the count goes up to what the queue depth calls
for, and ScalingActive/ScalingLimited, status.metrics and an Event say why; Prometheus
stops → the count holds, even when the load goes, and ScalingActive says why; Prometheus
comes back → the idle pods are seen and the count comes down after the (short)
stabilization window.

Closed-loop clients keep a fixed number of requests outstanding, and a long batching
delay keeps them queued at the server, so the queue depth per ready pod is about the
clients divided by the ready pods (a little less: each client spends some time on its own
side): 24 clients at a target of 3 call for about 8 pods, held at maxReplicas 3. (Fewer
clients per pod would not queue at all: a lone small batch on an idle runtime runs at
once, so the queue would vanish at 3 pods and the count would fall back; queue depth is
a load signal only where there is a queue.)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from kubeinfer.operator.reconcile import names
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.runtime.demo_models import build_mlp
from operator_harness import (
    FAST,
    NAMESPACE,
    World,
    condition,
    eventually,
    manifest,
    start_operator,
)
from process_kubelet import ProcessKubelet, process_kubelet
from prometheus_harness import PrometheusServer, ScrapeTarget, running_prometheus

pytestmark = pytest.mark.slow

SCALING_FAST = OperatorSettings(
    **{**FAST.model_dump(), "autoscale_poll_seconds": 0.5, "metrics_timeout_seconds": 2}
)
RUNTIME = names.runtime_name("resnet")
CLIENTS = 24


def autoscaled(model: Path, prometheus: str) -> dict[str, Any]:
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    return manifest(
        model={"source": {"uri": f"file://{model}", "sha256": sha}},
        engine={"maxBatchSize": 32},
        runtime={
            "replicas": 1,
            "batching": {
                "maxBatchSize": 32,
                "preferredBatchSizes": [32],
                "maxQueueDelayMicroseconds": 20_000,  # requests wait queued: depth = clients
            },
        },
        autoscaling={
            "enabled": True,
            "minReplicas": 1,
            "maxReplicas": 3,
            "targetQueueDepthPerReplica": 3,
            "scaleDownStabilizationSeconds": 5,
            "scaleDownMaxPercent": 100,
            "scaleDownPeriodSeconds": 1,
        },
        monitoring={"prometheus": {"url": prometheus}},
    )


def replicas(world: World) -> int | None:
    deployment = world.api.get("apps/v1", "deployments", NAMESPACE, RUNTIME)
    return (deployment or {}).get("spec", {}).get("replicas")


def status(world: World) -> dict[str, Any]:
    return (world.infd() or {}).get("status") or {}


@contextlib.asynccontextmanager
async def scraping(prometheus: PrometheusServer, kubelet: ProcessKubelet):
    """Keeps Prometheus' targets on the ready serving pods, as service discovery would."""

    async def follow() -> None:
        current: tuple[ScrapeTarget, ...] = ()
        while True:
            wanted = tuple(
                ScrapeTarget(pod.url.removeprefix("http://"), NAMESPACE, pod.name)
                for pod in sorted(kubelet.pods_of(RUNTIME), key=lambda p: p.name)
                if pod.ready
            )
            if wanted != current and prometheus.process.poll() is None:
                prometheus.reload(wanted)
                current = wanted
            await asyncio.sleep(0.2)

    task = asyncio.create_task(follow())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def load(kubelet: ProcessKubelet, clients: int = CLIENTS):
    """Closed-loop clients spread over the ready serving pods (the Service's endpoints);
    yields the status codes seen."""
    codes: dict[int, int] = {}
    row = np.random.default_rng(3).standard_normal(16).astype(np.float32).tolist()
    body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": row}]}
    turn = itertools.count()

    async def client() -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                urls = kubelet.ready_urls(RUNTIME)
                if not urls:
                    await asyncio.sleep(0.05)
                    continue
                url = urls[next(turn) % len(urls)]
                try:
                    async with session.post(f"{url}/v2/models/resnet/infer", json=body) as answer:
                        await answer.read()
                        codes[answer.status] = codes.get(answer.status, 0) + 1
                except (aiohttp.ClientError, OSError):
                    await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    try:
        yield codes
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_scales_up_under_load_holds_without_metrics_and_down_when_idle(
    world: World, tmp_path: Path
) -> None:
    # 67 MB of weights, several ms per batch here: the requests' time is spent in the
    # runtimes (queued or running), not in this process' clients.
    model = build_mlp(tmp_path / "model.onnx", 16, (4096, 4096), 10)
    (tmp_path / "prometheus").mkdir()
    with running_prometheus([], tmp_path / "prometheus") as prometheus:
        async with (
            start_operator(world, SCALING_FAST),
            process_kubelet(world, tmp_path / "node") as kubelet,
            scraping(prometheus, kubelet),
        ):
            world.api.create("inferencedeployments", autoscaled(model, prometheus.url))
            await eventually(lambda: kubelet.ready_urls(RUNTIME), within=60, what="a pod")
            assert replicas(world) == 1

            async with load(kubelet) as codes:
                await eventually(lambda: replicas(world) == 3, within=60, what="3 replicas")
                await eventually(
                    lambda: len(kubelet.ready_urls(RUNTIME)) == 3, within=60, what="3 ready"
                )
                active = condition(world.infd(), "ScalingActive")
                assert active["status"] == "True" and active["reason"] == "ValidMetricFound"
                ups = await eventually(
                    lambda: [
                        e for e in world.children(("v1", "events")) if e["reason"] == "ScaledUp"
                    ],
                    what="the scale-up's Event",
                )  # one, or two where the pods started in two steps
                assert all("Queue depth per replica" in e["message"] for e in ups), ups
                await eventually(
                    lambda: (
                        (status(world).get("metrics") or {}).get("queueDepthPerReplica") is not None
                    ),
                    what="status.metrics",
                )
                assert 1 <= status(world)["autoscaling"]["desiredReplicas"] <= 3
                await asyncio.sleep(3)  # settled at the demand: no overshoot, no flapping
                assert replicas(world) == 3

                # Prometheus goes away under load: the count holds, and the status says why.
                prometheus.stop()
                await eventually(
                    lambda: (
                        (condition(world.infd(), "ScalingActive") or {}).get("reason")
                        == "MetricsUnavailable"
                    ),
                    within=20,
                    what="ScalingActive=False MetricsUnavailable",
                )
            # ...and still holds once the load is gone: missing data never scales down.
            await asyncio.sleep(4 * SCALING_FAST.autoscale_poll_seconds + 3)
            assert replicas(world) == 3
            assert condition(world.infd(), "ScalingActive")["status"] == "False"
            assert set(codes) == {200}, codes

            # Prometheus back: the idle pods are seen, the count comes down by itself.
            prometheus.start()
            await eventually(
                lambda: (condition(world.infd(), "ScalingActive") or {}).get("status") == "True",
                within=30,
                what="ScalingActive back to True",
            )
            await eventually(lambda: replicas(world) == 1, within=60, what="back to 1 replica")
            await eventually(
                lambda: [
                    e for e in world.children(("v1", "events")) if e["reason"] == "ScaledDown"
                ],
                what="the scale-down's Event",
            )
    assert not world.api.spec_writes, (
        "the operator writes the Deployment's replicas, never the spec"
    )
