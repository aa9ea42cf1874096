"""The demo's autoscaling step: a burst of load, the count going up, and back down after.

No cluster here, so this process plays the Deployment controller (it starts and stops
`kubeinfer serve` processes, the "pods") and runs the operator's own autoscaling pass
once a second: the load read from the pods' /metrics through the operator's metrics
source (the direct read it uses without Prometheus), the pods counted as the gather step
counts them, and `kubeinfer.operator.scaling.recommend` deciding. The burst: idle, then
closed-loop clients spread over the ready pods, then idle again.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from kubeinfer.cli.demo.load import free_port, http_get
from kubeinfer.operator.api.v1alpha1.inference_deployment import AutoscalingSpec, QueryOverrides
from kubeinfer.operator.metrics.direct import DirectRead
from kubeinfer.operator.metrics.queries import Scope
from kubeinfer.operator.metrics.scaling import read_scaling_signals
from kubeinfer.operator.scaling.recommend import recommend
from kubeinfer.operator.state.scaling_inputs import ScalingHistory, ServingPods

SPEC = AutoscalingSpec.model_validate(
    {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 3,
        "targetQueueDepthPerReplica": 4,
        "scaleDownStabilizationSeconds": 6,
        "scaleDownMaxPercent": 100,
        "scaleDownPeriodSeconds": 5,
    }
)
"""The demo's autoscaling spec: windows of seconds, not minutes, to fit in a demo."""

READY = {"type": "Ready", "status": "True"}

PHASES = ((3, 0), (12, 24), (10, 0))
"""(seconds, clients): idle, a burst of 24 closed-loop clients, idle."""


@dataclass
class Pod:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    created: float = field(default_factory=time.monotonic)
    ready_at: float | None = None


@dataclass
class LocalDeployment:
    """The "pods" of one model: `kubeinfer serve` processes on loopback."""

    engine: str
    cache: str
    logs: Path
    pods: list[Pod] = field(default_factory=list)
    counter: int = 0

    def scale(self, replicas: int) -> None:
        while len(self.pods) < replicas:
            self.counter += 1
            port = free_port()
            command = [
                sys.executable, "-m", "kubeinfer.cli", "serve", "--engine", self.engine,
                "--cache", self.cache, "--model-name", "demo", "--host", "127.0.0.1",
                "--port", str(port), "--max-batch-size", "32",
                "--drain-grace-period-seconds", "5",
            ]  # fmt: skip
            log = (self.logs / f"pod-{self.counter}.log").open("wb")
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            self.pods.append(Pod(f"demo-runtime-{self.counter}", port, process))
        while len(self.pods) > replicas:  # the newest go first, as a ReplicaSet picks
            pod = self.pods.pop()
            pod.process.terminate()

    def check_ready(self) -> None:
        for pod in self.pods:
            if (
                pod.ready_at is None
                and http_get(f"http://127.0.0.1:{pod.port}/v2/health/ready")[0] == 200
            ):
                pod.ready_at = time.monotonic()

    def ready(self) -> list[Pod]:
        return [p for p in self.pods if p.ready_at is not None]

    def serving_pods(self, now: float) -> ServingPods:
        starting = [p for p in self.pods if p.ready_at is None]
        startups = [p.ready_at - p.created for p in self.pods if p.ready_at is not None]
        return ServingPods(
            desired=len(self.pods),
            ready=len(self.ready()),
            starting=len(starting),
            oldest_starting_age_seconds=max((now - p.created for p in starting), default=None),
            startup_seconds=float(np.median(startups)) if startups else None,
        )

    def pod_objects(self) -> list[dict[str, Any]]:
        """The ready pods as the API would list them, for the direct metrics read."""
        return [
            {
                "metadata": {"name": p.name},
                "spec": {"containers": [{"ports": [{"name": "http", "containerPort": p.port}]}]},
                "status": {"podIP": "127.0.0.1", "conditions": [READY]},
            }
            for p in self.ready()
        ]

    def stop(self) -> None:
        for pod in self.pods:
            pod.process.terminate()
        for pod in self.pods:
            try:
                pod.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pod.process.kill()


async def _clients(deployment: LocalDeployment, count: int, stop: asyncio.Event) -> int:
    """`count` closed-loop clients over the ready pods until `stop`; returns non-200s."""
    import aiohttp

    row = np.random.default_rng(5).standard_normal(16).astype(np.float32).tolist()
    body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": row}]}
    failures = 0

    async def client(index: int) -> None:
        nonlocal failures
        async with aiohttp.ClientSession() as session:
            sent = index
            while not stop.is_set():
                ready = deployment.ready()
                if not ready:
                    await asyncio.sleep(0.05)
                    continue
                pod = ready[sent % len(ready)]
                sent += 1
                url = f"http://127.0.0.1:{pod.port}/v2/models/demo/infer"
                try:
                    async with session.post(url, json=body) as answer:
                        await answer.read()
                        failures += answer.status != 200
                except (aiohttp.ClientError, OSError):
                    await asyncio.sleep(0.05)  # a pod going away: the Service moves on

    await asyncio.gather(*(client(i) for i in range(count)))
    return failures


async def _run(deployment: LocalDeployment) -> bool:
    async def list_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
        return deployment.pod_objects()

    source = DirectRead(list_pods, timeout_seconds=2)
    history = ScalingHistory()
    deployment.scale(SPEC.min_replicas)
    started = time.monotonic()
    while not deployment.ready():
        deployment.check_ready()
        if time.monotonic() - started > 60:
            raise RuntimeError("the first pod did not become ready")
        await asyncio.sleep(0.1)
    print("  |  t s | clients | pods ready/starting | queue depth per pod | decision |")
    print("  |--:|--:|---|--:|---|")
    peak, t0 = 1, time.monotonic()
    failures = 0
    for seconds, clients in PHASES:
        stop = asyncio.Event()
        load = asyncio.create_task(_clients(deployment, clients, stop)) if clients else None
        phase_end = time.monotonic() + seconds
        while time.monotonic() < phase_end:
            await asyncio.sleep(1.0)
            deployment.check_ready()
            now = time.monotonic()
            pods = deployment.serving_pods(now)
            signals = await read_scaling_signals(
                source, Scope("demo", "demo"), QueryOverrides(), datetime.now(UTC)
            )
            decision = recommend(SPEC, history, signals, pods, datetime.now(UTC))
            history = decision.history
            deployment.scale(decision.replicas)
            peak = max(peak, decision.replicas)
            depth = signals.queue_depth_per_replica
            change = (
                f"**{pods.desired} → {decision.replicas}**"
                if decision.replicas != pods.desired
                else f"{decision.replicas}"
            )
            print(
                f"  | {now - t0:4.0f} | {clients} | {pods.ready}/{pods.starting} "
                f"| {'n/a' if depth is None else f'{depth:.1f}'} "
                f"| {change} ({decision.limited[1]}) |",
                flush=True,
            )
        stop.set()
        if load is not None:
            failures += await load
    final = len(deployment.pods)
    print(
        f"\n  peak {peak} pods under the burst, {final} after it; "
        f"{failures} requests answered other than 200"
    )
    return peak > SPEC.min_replicas and final == SPEC.min_replicas and failures == 0


def run_autoscale_step(workdir: Path, engine: str, cache: str) -> bool:
    """Serves `engine` from `cache` as an autoscaled local "Deployment" through a burst."""
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    deployment = LocalDeployment(engine, cache, logs)
    print(
        f"  autoscaling: target {SPEC.target_queue_depth_per_replica:g} requests in progress "
        f"per pod, {SPEC.min_replicas}..{SPEC.max_replicas} pods, scale-down window "
        f"{SPEC.scale_down_stabilization_seconds} s; a pass every second\n"
    )
    try:
        return asyncio.run(_run(deployment))
    finally:
        deployment.stop()
