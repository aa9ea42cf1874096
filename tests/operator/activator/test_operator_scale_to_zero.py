"""Scale to zero on the real node: the real operator (in-process) and two activator pods of
the runtime image (`kubeinfer activator`, as `kubeinfer up` installs them), an
InferenceDeployment with `minReplicas: 0`.

- After the idle window its pods go to zero; its Service's EndpointSlice lists the
  activator pods; Ready stays True and ScaledToZero is True.
- 100 concurrent first requests to the Service's ClusterIP are all answered, each with the
  model's own answer to its row; a pod is started for them; once it is ready the
  Service's endpoints are the pod's alone (the activator out of the path). The cold start
  (first request sent to first answer) is printed.
- Past the activator's bound a request is refused with 503 and Retry-After before any
  held request is answered, and the held ones are answered.
- A schedule's window opening wakes the object with no request; so does a Prometheus
  query (a real Prometheus) passing its threshold.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import numpy as np
import onnxruntime as ort
import pytest
from decide_scenarios import tuned
from kubeinfer.cli.local.activator import SELECTOR, activator_objects
from kubeinfer.operator.settings import Activator, Pods
from kubeinfer.operator.state import names
from operator_harness import FAST, Model, World, condition, eventually, manifest, start_operator
from prometheus_harness import require_prometheus, running_prometheus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WINDOW_SECONDS = 10
ROUTE_SECONDS = 150
"""The route reaches the activator pods through a ConfigMap volume, which the kubelet
refreshes on its own period (about a minute, plus its cache's): how long an object may
wait for its route before it can go to zero."""
SERVICE = names.service_name("resnet")


def settings_for(world: World, **groups: dict[str, Any]) -> Any:
    return tuned(
        FAST,
        activator={"namespace": world.namespace},
        requeue={"autoscale_poll_seconds": 1},
        # The product's preStop pause (FAST has none): a request sent just after the scale
        # to zero may still reach the leaving pod by kube-proxy's rules, and that pod must
        # still admit it until they are gone (without the pause a third of the first burst
        # was refused "the server is shutting down").
        pods={"pre_stop_sleep_seconds": Pods().pre_stop_sleep_seconds},
        **groups,
    )


def install_activator(world: World, *flags: str) -> None:
    for obj in activator_objects(Activator(namespace=world.namespace), pull_policy="Never"):
        if obj["kind"] == "Deployment":
            container = obj["spec"]["template"]["spec"]["containers"][0]
            container["args"] = [*container["args"], *flags]
        world.create(obj)


def ready_activators(world: World) -> list[str]:
    selector = ",".join(f"{k}={v}" for k, v in SELECTOR.items())
    return [
        p["status"]["podIP"]
        for p in world.pods(selector)
        if any(c["type"] == "Ready" and c["status"] == "True"
               for c in (p.get("status") or {}).get("conditions") or [])
    ]  # fmt: skip


def endpoint_addresses(world: World) -> set[str]:
    """The ready addresses every EndpointSlice of the Service lists."""
    slices = world.kube.list(
        "discovery.k8s.io/v1", "endpointslices", f"kubernetes.io/service-name={SERVICE}"
    )
    return {
        address
        for piece in slices
        for endpoint in piece.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready", True)
        for address in endpoint["addresses"]
    }


def selector_of_serving() -> str:
    return names.selector_string(names.runtime_selector("resnet"))


def serving_ips(world: World) -> set[str]:
    return {
        p["status"]["podIP"]
        for p in world.pods(selector_of_serving())
        if (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
    }


def replicas(world: World) -> int | None:
    deployment = world.kube.get("apps/v1", "deployments", names.runtime_name("resnet"))
    return None if deployment is None else deployment["spec"]["replicas"]


def cluster_ip(world: World) -> str:
    service = world.kube.get("v1", "services", SERVICE)
    assert service is not None
    return str(service["spec"]["clusterIP"])


def zero_condition(world: World) -> dict[str, Any]:
    return condition(world.infd(), "ScaledToZero") or {}


async def infer(session: aiohttp.ClientSession, url: str, row: np.ndarray) -> tuple[int, Any]:
    body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                        "data": row.tolist()}]}  # fmt: skip
    async with session.post(f"{url}/v2/models/resnet/infer", json=body) as answer:
        payload = await answer.json(content_type=None)
        return answer.status, (payload, answer.headers.get("Retry-After"))


def own_answer(model: Model, rows: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {session.get_inputs()[0].name: rows})
    return np.asarray(output)


async def at_zero(world: World) -> None:
    """Waits for the object to reach zero pods with the Service on the activator, its last
    pod gone: the leaving pod answers what reaches it in its preStop pause (kube-proxy
    falls back to a terminating pod while no other serves, the activator's forwards
    too), so a request sent before it is gone starts no pod."""
    await eventually(lambda: replicas(world) == 0, ROUTE_SECONDS + WINDOW_SECONDS, "zero pods")
    await eventually(lambda: not world.pods(selector_of_serving()), 60, "the last pod gone")
    activators = set(ready_activators(world))
    await eventually(
        lambda: endpoint_addresses(world) == activators,
        30,
        lambda: (
            f"the activator slice: {endpoint_addresses(world)} listed, {activators} ready; "
            + str(
                [
                    (x["metadata"]["name"], x["metadata"].get("labels"), x.get("endpoints"))
                    for x in world.kube.list("discovery.k8s.io/v1", "endpointslices")
                ]
            )
        ),
    )


def zero_manifest(tiny: Model, **autoscaling: Any) -> dict[str, Any]:
    scaling = {"enabled": True, "minReplicas": 0, "maxReplicas": 2,
               "scaleToZeroAfterSeconds": WINDOW_SECONDS, **autoscaling}  # fmt: skip
    return manifest(tiny, autoscaling=scaling)


async def test_idle_goes_to_zero_and_100_first_requests_are_all_answered(
    world: World, tiny: Model
) -> None:
    rows = np.random.default_rng(7).standard_normal((100, 16)).astype(np.float32)
    expected = own_answer(tiny, rows)
    install_activator(world)
    async with start_operator(world, settings_for(world)):
        world.create(zero_manifest(tiny))
        await eventually(lambda: len(ready_activators(world)) == 2, 180, "two activators")
        await eventually(lambda: bool(serving_ips(world) & endpoint_addresses(world)), 180,
                         "a serving pod behind the Service")  # fmt: skip
        url = f"http://{cluster_ip(world)}:8000"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=150)) as session:

            async def answered() -> bool:
                # kube-proxy refuses (or has no rule for) the cluster IP until it has
                # programmed the Service's endpoint.
                try:
                    return (await infer(session, url, rows[0]))[0] == 200
                except aiohttp.ClientConnectorError:
                    return False

            await eventually(answered, 60, "the Service to answer")
            await at_zero(world)
            assert zero_condition(world).get("status") == "True"
            await eventually(lambda: (world.infd() or {})["status"]["ready"] == "0/0", 30,
                             "the status counting no pod")  # fmt: skip
            ready = condition(world.infd(), "Ready") or {}
            assert ready.get("status") == "True", ready
            sent = time.monotonic()
            answers = await asyncio.gather(*(infer(session, url, row) for row in rows))
            cold_start = time.monotonic() - sent
        statuses = [status for status, _ in answers]
        refused = [payload for status, (payload, _) in answers if status != 200]
        scaled = [e["message"][:40] for e in world.events() if e["reason"].startswith("Scaled")]
        assert statuses == [200] * 100, (statuses.count(503), refused[:1], scaled)
        got = np.array([payload["outputs"][0]["data"] for _, (payload, _) in answers])
        np.testing.assert_allclose(got, expected.reshape(100, -1), rtol=1e-5, atol=1e-5)
        print(f"cold start, engine in the node's cache: {cold_start:.2f} s for 100 requests")
        activators = set(ready_activators(world))

        def straight_to_the_pods() -> bool:
            # The burst may have started a second pod: the pods are whichever serve now.
            listed = endpoint_addresses(world)
            return bool(listed) and listed <= serving_ips(world) and not listed & activators

        await eventually(straight_to_the_pods, 60,
                         lambda: f"the activator out of the Service's endpoints: "
                         f"{endpoint_addresses(world)} listed, pods {serving_ips(world)}, "
                         f"activators {activators}")  # fmt: skip
        assert zero_condition(world).get("status") == "False"


async def test_past_the_bound_a_request_is_refused_at_once_and_the_held_are_answered(
    world: World, tiny: Model
) -> None:
    row = np.zeros(16, dtype=np.float32)
    install_activator(world, "--max-held-requests=4")
    async with start_operator(world, settings_for(world)):
        world.create(zero_manifest(tiny))
        await eventually(lambda: len(ready_activators(world)) == 2, 180, "two activators")
        await at_zero(world)
        # One activator pod only: the bound is each pod's.
        (activator, *_) = ready_activators(world)
        url = f"http://{activator}:8000"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=150)) as session:
            held = [asyncio.create_task(infer(session, url, row)) for _ in range(4)]
            await eventually(lambda: _held(world, activator) == 4, 30, "four requests held")
            status, (payload, retry_after) = await infer(session, url, row)
            assert status == 503 and retry_after is not None and "error" in payload
            assert not any(task.done() for task in held), "refused before any held answer"
            answers = await asyncio.gather(*held)
        assert [status for status, _ in answers] == [200] * 4


def _held(world: World, address: str) -> int:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{address}:8000/v2/activator", timeout=5) as answer:
        routes = json.loads(answer.read())["routes"]
    return sum(int(r.get("held", 0)) for r in routes if r["namespace"] == world.namespace)


async def test_a_schedule_and_a_prometheus_query_wake_the_object_with_no_request(
    world: World, tiny: Model, tmp_path: Any
) -> None:
    require_prometheus()
    install_activator(world)
    with running_prometheus([], tmp_path) as prometheus:
        async with start_operator(world, settings_for(world)):
            world.create(zero_manifest(tiny))
            await eventually(lambda: len(ready_activators(world)) == 2, 180, "two activators")
            await at_zero(world)
            # A window open now (every minute, for two minutes): one pod, no request.
            window = {"start": "* * * * *", "durationSeconds": 120, "replicas": 1}
            world.patch_spec({"autoscaling": {"wakeOn": {"schedules": [window]}}})
            await eventually(lambda: replicas(world) == 1, 30, "woken by the schedule")
            # The Deployment is written before the status, in the same pass.
            await eventually(
                lambda: zero_condition(world).get("reason") in ("ScheduleOpen", "RecentlyActive"),
                30,
                "ScaledToZero says why the pod is up",
            )
            world.patch_spec({"autoscaling": {"wakeOn": {"schedules": None}}})
            await at_zero(world)
            # Work waiting upstream: a query that passes its threshold a few seconds on.
            opens = time.time() + 5
            wake = {"query": f"vector(time() > bool {opens:.0f})", "threshold": 0.5}
            world.patch_spec({"monitoring": {"prometheus": {"url": prometheus.url}},
                              "autoscaling": {"wakeOn": {"prometheus": wake}}})  # fmt: skip
            await eventually(lambda: replicas(world) == 1, 60, "woken by the query")
            assert time.time() >= opens - 1, "woken before the query passed its threshold"
