"""A replica that starts answering wrong after its check at start, caught on the real
node: the real operator (in-process) asks each serving pod its known answers on the
schedule of `spec.knownAnswers.intervalSeconds`, and a pod that fails its set leaves
its Service's endpoints (its readiness gate False, the pod alive), is taken out of its
ReplicaSet (a replacement starts), is named in the status with its node and engine, and
AnswersCorrect turns False, while the other replica serves throughout.

The fault: every serving pod runs `--testing-faults perturb-batches=1,
perturb-after-batches=N` (the operator's `pods.testing_faults`), so a pod answers wrong
from its (N+1)th batch on; the test sends N requests to one pod only, so that pod goes
wrong and the others (which run only their checks' few batches) stay right. With
`perturb-lowest-bit` too, the pod that goes wrong answers like a replica of another
runtime version, one unit in the last place off and inside its tolerance: it passes its
own set, and is taken out because its two peers on the same engine and node agree with
each other and not with it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import numpy as np
import pytest
from decide_scenarios import tuned
from kubeinfer.operator.state import names
from kubeinfer.operator.state.known_answers import GATE_CONDITION, pod_condition
from operator_harness import FAST, Model, World, condition, eventually, manifest, start_operator
from test_operator_shadow_rollout import ready_urls

pytestmark = pytest.mark.slow

CLEAN_BATCHES = 40
"""Batches a pod runs right: its check at start and the operator's first checks take a
few each (1 + 2 for the tiny model's probes in batches of up to 8)."""
INTERVAL_SECONDS = 30
SERVICE = names.service_name("resnet")
ROW = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)


def serving_pods(world: World) -> list[dict[str, Any]]:
    return [
        pod
        for pod in world.pods(names.selector_string(names.runtime_selector("resnet")))
        if not pod["metadata"].get("deletionTimestamp")
    ]


def url_of(pod: dict[str, Any]) -> str:
    return f"http://{pod['status']['podIP']}:8000"


def answers(world: World) -> dict[str, Any]:
    return condition(world.infd(), "AnswersCorrect") or {}


async def infer(session: aiohttp.ClientSession, url: str) -> int:
    body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                        "data": ROW[0].tolist()}]}  # fmt: skip
    async with session.post(f"{url}/v2/models/resnet/infer", json=body) as answer:
        await answer.read()
        return answer.status


async def applied_and_answering(world: World, document: dict[str, Any], replicas: int) -> None:
    """The object created and its `replicas` pods ready, AnswersCorrect True."""
    world.create(document)
    await eventually(
        lambda: len(ready_urls(world, SERVICE)) == replicas, 180, f"{replicas} ready pod(s)"
    )
    await eventually(lambda: answers(world).get("status") == "True", 30, "AnswersCorrect")


async def taken_out_after_going_wrong(
    world: World, tiny: Model, replicas: int, faults: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`replicas` pods, each with `faults` (wrong after CLEAN_BATCHES), the first of them
    loaded past its clean batches: it leaves the Service's endpoints within one interval
    while the others serve throughout, and is replaced and kept as evidence, gated and
    alive. The pod and its record in status.wrongAnswers."""
    document = manifest(
        tiny, runtime={"replicas": replicas}, knownAnswers={"intervalSeconds": INTERVAL_SECONDS}
    )
    async with start_operator(world, tuned(FAST, pods={"testing_faults": faults})):
        await applied_and_answering(world, document, replicas)
        bad, *good = sorted(serving_pods(world), key=lambda p: p["metadata"]["name"])
        bad_url, good_urls = url_of(bad), {url_of(pod) for pod in good}
        async with aiohttp.ClientSession() as session:
            for _ in range(CLEAN_BATCHES + 5):  # one pod only: past its clean batches
                assert await infer(session, bad_url) == 200
            good_throughout = True

            async def watch_good() -> None:
                nonlocal good_throughout
                while True:
                    urls = await asyncio.to_thread(ready_urls, world, SERVICE)
                    good_throughout &= good_urls <= set(urls)
                    await asyncio.sleep(0.5)  # not a wait: how often the endpoints are read

            watcher = asyncio.create_task(watch_good())
            try:
                await eventually(
                    lambda: bad_url not in ready_urls(world, SERVICE),
                    INTERVAL_SECONDS + 15,
                    "the wrong pod out of the Service's endpoints within one interval",
                )
                await eventually(lambda: answers(world).get("status") == "False", 15, "False")
                await eventually(
                    lambda: len([p for p in serving_pods(world)
                                 if p["metadata"]["uid"] != bad["metadata"]["uid"]]) == replicas,
                    60, "a replacement created",
                )  # fmt: skip
                for url in good_urls:
                    assert await infer(session, url) == 200
            finally:
                watcher.cancel()
        assert good_throughout, "a good pod left the Service's endpoints"
    status = world.infd()["status"]  # type: ignore[index]
    (record,) = status["wrongAnswers"]
    assert record["pod"] == bad["metadata"]["name"]
    assert record["node"] == bad["spec"]["nodeName"]
    digest = bad["metadata"]["annotations"][names.ANNOTATION_ENGINE_DIGEST]
    assert record["engineDigest"] == digest
    kept = world.pods(names.selector_string(names.wrong_answers_selector("resnet")))
    assert [p["metadata"]["name"] for p in kept] == [bad["metadata"]["name"]]
    (evidence,) = kept  # alive, unready by its gate, no longer the ReplicaSet's
    assert not evidence["metadata"].get("deletionTimestamp")
    assert pod_condition(evidence, GATE_CONDITION) == "False"

    def evidence_ready() -> str | None:
        (pod,) = world.pods(names.selector_string(names.wrong_answers_selector("resnet")))
        return pod_condition(pod, "Ready")

    # The kubelet folds the gate into Ready on its next sync of the pod's status, after
    # the gate is written (the endpoints have let the pod go already: it left the Service).
    await eventually(lambda: evidence_ready() == "False", 30, "the kept pod unready")
    assert not any(o.get("controller") for o in evidence["metadata"]["ownerReferences"])
    return bad, record


async def test_a_replica_that_goes_wrong_is_taken_out_and_replaced(
    world: World, tiny: Model
) -> None:
    faults = f"perturb-batches=1,perturb-after-batches={CLEAN_BATCHES}"
    _, record = await taken_out_after_going_wrong(world, tiny, 2, faults)
    assert record["reason"] == "KnownAnswersFailed" and record["output"]
    assert answers(world)["reason"] == "KnownAnswersFailed"
    assert "KnownAnswersFailed" in {e["reason"] for e in world.events()}


async def test_a_replica_answering_unlike_its_peers_is_taken_out_and_replaced(
    world: World, tiny: Model
) -> None:
    """The stand-in for a replica of another runtime version (`perturb-lowest-bit`: one
    unit in the last place off, inside every tolerance) among three: it passes its own set,
    and its two peers on the same engine and node outvote it."""
    faults = f"perturb-batches=1,perturb-after-batches={CLEAN_BATCHES},perturb-lowest-bit"
    _, record = await taken_out_after_going_wrong(world, tiny, 3, faults)
    assert record["reason"] == "AnswersDifferFromPeers", record
    assert answers(world)["reason"] == "AnswersDifferFromPeers"
    assert "AnswersDifferFromPeers" in {e["reason"] for e in world.events()}


def held_off_pods(world: World) -> list[dict[str, Any]]:
    """Serving pods whose runtime runs but is not ready."""
    return [
        pod
        for pod in serving_pods(world)
        if pod_condition(pod, "ContainersReady") == "False"
        and all("running" in (c.get("state") or {})
                for c in (pod.get("status") or {}).get("containerStatuses") or [{}])
    ]  # fmt: skip


async def test_a_replica_whose_engine_fails_its_check_at_start_holds_the_rollout_and_is_named(
    world: World, tiny: Model
) -> None:
    """A rollout's new pod loads an engine damaged after its digest check (the runtime's
    `damage-engine-after-digest-check`, brought by a change of the operator's settings,
    which rolls the pods): it never becomes ready, the pod before it serves throughout,
    and the status, the condition and an Event on the pod name it, its node and engine."""
    document = manifest(
        tiny, runtime={"replicas": 1}, knownAnswers={"intervalSeconds": INTERVAL_SECONDS}
    )
    async with start_operator(world, FAST):
        await applied_and_answering(world, document, 1)
    (serving,) = ready_urls(world, SERVICE)
    damaging = tuned(FAST, pods={"testing_faults": "damage-engine-after-digest-check"})
    async with start_operator(world, damaging), aiohttp.ClientSession() as session:
        (held,) = await eventually(
            lambda: held_off_pods(world), 180, "the new pod running, never ready"
        )
        await eventually(lambda: answers(world).get("status") == "False", 60, "named")
        assert ready_urls(world, SERVICE) == [serving], "the pod before it serves"
        assert await infer(session, serving) == 200
    status = world.infd()["status"]  # type: ignore[index]
    (record,) = status["wrongAnswers"]
    assert (record["pod"], record["node"]) == (held["metadata"]["name"], held["spec"]["nodeName"])
    digest = held["metadata"]["annotations"][names.ANNOTATION_ENGINE_DIGEST]
    assert record["engineDigest"] == digest and record["reason"] == "KnownAnswersFailed"
    assert record["message"].startswith("at start, never ready: "), record["message"]
    assert answers(world)["reason"] == "KnownAnswersFailed"
    on_pod = [e for e in world.events()
              if e["involvedObject"].get("name") == held["metadata"]["name"]
              and e["reason"] == "KnownAnswersFailed"]  # fmt: skip
    assert len(on_pod) == 1 and "at start" in on_pod[0]["message"], on_pod
    (still,) = [p for p in serving_pods(world) if p["metadata"]["uid"] == held["metadata"]["uid"]]
    assert pod_condition(still, GATE_CONDITION) == "False", "gated, kept in its ReplicaSet"
