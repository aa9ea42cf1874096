"""Autoscaling end to end on the real control plane: the real operator reads a real
Prometheus and sets the runtime Deployment's replicas; the real ReplicaSet controller
creates and deletes the pods, the kubelet runs them as containers of the runtime image
(`kubeinfer serve`, ready when the kubelet's readiness probes pass), and Prometheus finds
them as it would in a cluster, by Kubernetes service discovery as a ServiceAccount of the
namespace, keeping the pods whose `prometheus.io/*` annotations the operator rendered (the
test cluster has no PodMonitor API). Closed-loop clients drive the ready serving pods at
their own addresses, as the Service would.

One scenario, in order: load arrives → the count goes up to what the requests in progress call
for, and ScalingActive/ScalingLimited, status.metrics and an Event say why; Prometheus
stops → the count holds, even when the load goes, and ScalingActive says why; Prometheus
comes back → the idle pods are seen and the count comes down after the (short)
stabilization window. Throughout, the operator writes the Deployment, never the spec it
was given.

Closed-loop clients keep a fixed number of requests outstanding, and a long batching
delay keeps them queued at the server, so the requests in progress per ready pod are about the
clients divided by the ready pods (a little less: each client spends some time on its own
side): 24 clients at a target of 3 call for about 8 pods, held at maxReplicas 3. (Fewer
clients per pod would not queue at all: a lone small batch on an idle runtime runs at
once, so the queue would vanish at 3 pods and the count would fall back; requests in progress are
a load signal only where there is a queue.)

The machine is small and shared, so the waits are long: they bound a failure's time, not
a pass's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from decide_scenarios import tuned
from kubeinfer.cli.demo.mlp_models import build_mlp
from kubeinfer.operator.state import names
from operator_harness import (
    FAST,
    IDS,
    Model,
    World,
    condition,
    eventually,
    manifest,
    start_operator,
)
from prometheus_harness import DiscoveringPrometheus, running_prometheus_with_kubernetes_sd

pytestmark = pytest.mark.slow

SCALING_FAST = tuned(FAST, requeue={"autoscale_poll_seconds": 0.5}, metrics={"timeout_seconds": 2})
OWNER = "resnet"
RUNTIME = names.runtime_name(OWNER)
CLIENTS = 24
MAX_REPLICAS = 3
SCRAPER_ACCOUNT = "prometheus"


def autoscaled(model: Model, prometheus: str) -> dict[str, Any]:
    return manifest(
        model,
        name=OWNER,
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
            "maxReplicas": MAX_REPLICAS,
            "targetRequestsInProgressPerReplica": 3,
            "scaleDownStabilizationSeconds": 5,
            "scaleDownMaxPercent": 100,
            "scaleDownPeriodSeconds": 1,
        },
        monitoring={"prometheus": {"url": prometheus}},
    )


def grant_scraper(world: World) -> str:
    """A ServiceAccount allowed what Prometheus' pod discovery does in the namespace (get,
    list and watch pods), as a cluster grants its Prometheus; returns its token."""
    kube = world.kube
    kube.create(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SCRAPER_ACCOUNT}}
    )
    kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": SCRAPER_ACCOUNT},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        }
    )
    kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": SCRAPER_ACCOUNT},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": SCRAPER_ACCOUNT,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": SCRAPER_ACCOUNT, "namespace": world.namespace}
            ],
        }
    )
    return world.cluster.service_account_token(world.namespace, SCRAPER_ACCOUNT)


def replicas(world: World) -> int | None:
    deployment = world.kube.get("apps/v1", "deployments", RUNTIME)
    return (deployment or {}).get("spec", {}).get("replicas")


def status(world: World) -> dict[str, Any]:
    return (world.infd(OWNER) or {}).get("status") or {}


def scaling_active(world: World) -> dict[str, Any]:
    return condition(world.infd(OWNER), "ScalingActive") or {}


def events(world: World, reason: str) -> list[dict[str, Any]]:
    return [e for e in world.events() if e["reason"] == reason]


def serving_endpoints(world: World) -> dict[str, str]:
    """The ready pods the serving Service sends to, by name, each with its base URL: the
    pods its selector matches that are Ready, at their own IP and `http` container port
    (what the Service's endpoints list, read from the pods so that a node without a
    routable pod network, whose Services have no EndpointSlices, serves as well)."""
    service = world.kube.get("v1", "services", names.service_name(OWNER))
    if service is None:
        return {}
    selector = names.selector_string(service["spec"]["selector"])
    found = {}
    for pod in world.pods(selector):
        ip = pod["status"].get("podIP")
        ready = condition(pod, "Ready") or {}
        if not ip or ready.get("status") != "True" or pod["metadata"].get("deletionTimestamp"):
            continue
        ports = [p for c in pod["spec"]["containers"] for p in c.get("ports") or []]
        (port,) = [p["containerPort"] for p in ports if p.get("name") == "http"]
        found[pod["metadata"]["name"]] = f"http://{ip}:{port}"
    return found


@contextlib.asynccontextmanager
async def load(world: World, clients: int = CLIENTS) -> AsyncIterator[dict[int, int]]:
    """Closed-loop clients spread over the serving Service's ready pods (re-read every
    half second, as endpoints follow the pods); yields the status codes seen."""
    codes: dict[int, int] = {}
    urls: list[str] = []
    row = np.random.default_rng(3).standard_normal(16).astype(np.float32).tolist()
    body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": row}]}
    turn = itertools.count()

    async def follow_endpoints() -> None:
        while True:
            # A failed read (the API server slow on a busy machine) keeps the last list,
            # as a Service keeps its endpoints; the clients must not stop following.
            with contextlib.suppress(Exception):
                found = await asyncio.to_thread(serving_endpoints, world)
                urls[:] = sorted(found.values())
            # not a wait: the endpoints are re-read every 0.5 s, as a Service's
            await asyncio.sleep(0.5)

    async def client() -> None:
        # A short connection per request: a pod being deleted closes its listener, and a
        # kept-alive connection to it would only fail later.
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            timeout=aiohttp.ClientTimeout(total=60),
        ) as session:
            while True:
                if not urls:
                    await asyncio.sleep(0.05)  # not a wait: paces a client with nowhere to send yet
                    continue
                url = urls[next(turn) % len(urls)]
                try:
                    async with session.post(f"{url}/v2/models/{OWNER}/infer", json=body) as answer:
                        await answer.read()
                        codes[answer.status] = codes.get(answer.status, 0) + 1
                except (aiohttp.ClientError, OSError):  # TimeoutError included
                    await asyncio.sleep(0.05)  # not a wait: a client's pause after a failed request

    tasks = [asyncio.create_task(follow_endpoints())]
    tasks += [asyncio.create_task(client()) for _ in range(clients)]
    try:
        yield codes
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def scraped_as_serving(world: World, prometheus: DiscoveringPrometheus, count: int) -> None:
    """Until `count` pods serve and Prometheus, by discovery alone, scrapes exactly
    those (healthy)."""

    def seen() -> bool:
        serving = serving_endpoints(world)
        scraped = prometheus.scraped_pods()
        return len(serving) == count and all(scraped.get(pod) == "up" for pod in serving)

    await eventually(seen, within=120, what=f"Prometheus scraping {count} serving pods")


def spec_writes(world: World) -> list[str]:
    """The operator's writes to the InferenceDeployment itself that carried a spec (the
    audit log records those writes' bodies)."""
    return [
        f"{c.verb} {c.resource} {c.body}"
        for c in world.calls()
        if c.resource == IDS[1] and c.verb in ("patch", "update") and "spec" in (c.body or {})
    ]


async def test_scales_up_under_load_holds_without_metrics_and_down_when_idle(
    world: World, model_directory: Path, tmp_path: Path
) -> None:
    # 67 MB of weights, several ms per batch: the requests' time is spent in the
    # runtimes (queued or running), not in this process' clients.
    model = Model(build_mlp(model_directory / f"{world.namespace}.onnx", 16, (4096, 4096), 10))
    token = grant_scraper(world)
    try:
        with running_prometheus_with_kubernetes_sd(
            tmp_path,
            server=world.cluster.server,
            ca_file=world.cluster.ca_file,
            token=token,
            namespace=world.namespace,
        ) as prometheus:
            async with start_operator(world, SCALING_FAST):
                await scale_through_an_outage(world, prometheus, model)
    finally:
        model.path.unlink(missing_ok=True)
    assert spec_writes(world) == [], "the operator writes the Deployment, never the spec"


async def scale_through_an_outage(
    world: World, prometheus: DiscoveringPrometheus, model: Model
) -> None:
    world.create(autoscaled(model, prometheus.url))
    # The build, then a pod loading 67 MB: minutes at worst on a busy machine.
    await scraped_as_serving(world, prometheus, 1)
    assert replicas(world) == 1, "no load, no scaling"

    async with load(world) as codes:
        await eventually(lambda: replicas(world) == MAX_REPLICAS, within=120, what="3 replicas")
        # New pods are discovered and scraped by themselves: nobody told Prometheus.
        await scraped_as_serving(world, prometheus, MAX_REPLICAS)
        active = scaling_active(world)
        assert (active["status"], active["reason"]) == ("True", "ValidMetricFound"), active
        ups = await eventually(
            lambda: events(world, "ScaledUp"), within=60, what="the scale-up's Event"
        )  # one, or two where the pods started in two steps
        assert all("Requests in progress per replica" in e["message"] for e in ups), ups
        await eventually(
            lambda: (
                (status(world).get("metrics") or {}).get("requestsInProgressPerReplica") is not None
            ),
            within=60,
            what="status.metrics",
        )
        # Still about 8 wanted with all 3 serving: the bound is what holds the count.
        await eventually(
            lambda: (
                (condition(world.infd(OWNER), "ScalingLimited") or {}).get("reason")
                == "TooManyReplicas"
            ),
            within=60,
            what="ScalingLimited TooManyReplicas",
        )
        assert 1 <= status(world)["autoscaling"]["desiredReplicas"] <= MAX_REPLICAS
        # not a wait: settled at the demand, it must not overshoot or flap meanwhile
        await asyncio.sleep(3)
        assert replicas(world) == MAX_REPLICAS

        # Prometheus goes away under load: the count holds, and the status says why.
        await asyncio.to_thread(prometheus.stop)
        await eventually(
            lambda: scaling_active(world).get("reason") == "MetricsUnavailable",
            within=60,
            what="ScalingActive=False MetricsUnavailable",
        )
    # ...and still holds once the load is gone: missing data never scales down.
    # not a wait: polls pass without data, which must not scale down
    await asyncio.sleep(4 * SCALING_FAST.requeue.autoscale_poll_seconds + 5)
    assert replicas(world) == MAX_REPLICAS
    assert scaling_active(world)["status"] == "False"
    assert set(codes) == {200}, codes
    assert codes[200] > CLIENTS, codes

    # Prometheus back: discovery finds the idle pods again, the count comes down by itself.
    restarted = time.time()
    await asyncio.to_thread(prometheus.start)
    await asyncio.to_thread(prometheus.wait_for_scrape_after, restarted, 60)
    await eventually(
        lambda: scaling_active(world).get("status") == "True",
        within=60,
        what="ScalingActive back to True",
    )
    await eventually(lambda: replicas(world) == 1, within=120, what="back to 1 replica")
    downs = await eventually(
        lambda: events(world, "ScaledDown"), within=60, what="the scale-down's Event"
    )
    assert all("requests in progress per replica" in e["message"].lower() for e in downs), downs
    # The real ReplicaSet controller takes the surplus pods away; one stays serving.
    await scraped_as_serving(world, prometheus, 1)
