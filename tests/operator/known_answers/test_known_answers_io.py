"""The known-answer checks' I/O (`kube.known_answers`) over a recording stand-in for the
API client and a real HTTP server standing in for two runtime pods on loopback: the
gather asks the due pods, reads each node once, remembers the schedule; the apply sets
the gates, then takes the wrong pod out (labels, evidence, owner) with an Event on it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from kubeinfer.operator.kube.known_answers import apply_answers, gather_answers
from kubeinfer.operator.reconcile.known_answers import decide_answers
from kubeinfer.operator.state import names
from kubeinfer.operator.state.known_answers import GATE_CONDITION, AnswerMemory
from kubeinfer.operator.state.observed import OwnerRef

OWNER = OwnerRef("resnet", "ns", "uid-owner", 1)
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def verdict(result: str) -> dict[str, Any]:
    passed = result == "passed"
    latest = {
        "digest": "sha256:abc", "result": result, "reason": "" if passed else "probe 2 off",
        "outputs": [{"name": "output", "tolerance": 0.001, "error": 0.0 if passed else 2.0,
                     "probe": 2, "passed": passed}],
        "answerDigests": ["d0"],
    }  # fmt: skip
    return {"servingAllowed": True, "atStart": latest, "latest": latest}


@pytest.fixture
async def runtimes(unused_tcp_port_factory: Any) -> AsyncIterator[dict[str, int]]:
    """Two runtimes on loopback: `good` passes its set, `bad` fails it."""
    ports: dict[str, int] = {}
    runners = []
    for name, result in (("good", "passed"), ("bad", "failed")):

        async def answer(_: web.Request, result: str = result) -> web.Response:
            return web.json_response(verdict(result))

        app = web.Application()
        app.router.add_post("/v2/known-answers", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        ports[name] = unused_tcp_port_factory()
        await web.TCPSite(runner, "127.0.0.1", ports[name]).start()
        runners.append(runner)
    yield ports
    for runner in runners:
        await runner.cleanup()


def pod(name: str, port: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7",
                     "labels": {**names.runtime_selector("resnet"),
                                names.LABEL_ROLE: names.ROLE_SERVING},
                     "annotations": {names.ANNOTATION_ENGINE_DIGEST: "sha256:abc"},
                     "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "rs"}]},
        "spec": {"nodeName": "node-1",
                 "containers": [{"ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"podIP": "127.0.0.1",
                   "conditions": [{"type": "ContainersReady", "status": "True"}]},
    }  # fmt: skip


class Recorder:
    """The API client's calls the checks make, answered from `pods`."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.calls: list[tuple[str, Any, ...]] = []

    async def list(self, resource: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
        wanted = dict(term.split("=") for term in selector.split(","))
        labels = [(p, p["metadata"]["labels"]) for p in self.pods]
        return [p for p, have in labels if all(have.get(k) == v for k, v in wanted.items())]

    async def get(self, resource: Any, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(("get", resource.plural, name))
        return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H200"}}}

    async def strategic_patch(self, resource: Any, namespace: str, name: str, body: Any,
                              *, subresource: str | None = None) -> dict[str, Any]:  # fmt: skip
        self.calls.append(("status", name, body))
        return next(p for p in self.pods if p["metadata"]["name"] == name)

    async def json_patch(self, resource: Any, namespace: str, name: str, operations: Any,
                         *, subresource: str | None = None) -> dict[str, Any]:  # fmt: skip
        self.calls.append(("patch", name, operations))
        return {}

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("event", obj["involvedObject"]["kind"], obj["reason"]))
        return obj


async def test_the_due_pods_are_asked_and_the_wrong_one_is_gated_then_taken_out(
    runtimes: dict[str, int],
) -> None:
    client = Recorder([pod("good", runtimes["good"]), pod("bad", runtimes["bad"])])
    clock = iter([100.0, 100.5]).__next__
    readings, memory = await gather_answers(
        client,
        client,
        OWNER,
        AnswerMemory(),
        30,
        clock,  # type: ignore[arg-type]
    )
    assert {a.pod: a.result for a in readings.answers.values()} == {"good": "passed",
                                                                    "bad": "failed"}  # fmt: skip
    assert memory.checked_at_seconds == {"uid-good": 100.5, "uid-bad": 100.5}
    assert readings.hardware["node-1"].gpu_product == "H200"
    assert readings.next_check_in_seconds == 5  # the gates are not written yet
    report = decide_answers(readings, NOW)
    writes, taken = await apply_answers(client, OWNER, report, NOW)  # type: ignore[arg-type]
    assert taken == {"uid-bad"} and writes == 4
    gates = {call[1]: call[2]["status"]["conditions"][0] for call in client.calls
             if call[0] == "status"}  # fmt: skip
    assert {n: (c["type"], c["status"]) for n, c in gates.items()} == {
        "bad": (GATE_CONDITION, "False"), "good": (GATE_CONDITION, "True"),
    }  # fmt: skip
    (patch,) = [call for call in client.calls if call[0] == "patch"]
    operations = {op["path"]: op["value"] for op in patch[2]}
    assert operations["/metadata/resourceVersion"] == "7"
    assert operations["/metadata/labels"][names.LABEL_COMPONENT] == names.COMPONENT_WRONG_ANSWERS
    record = json.loads(operations["/metadata/annotations"][names.ANNOTATION_WRONG_ANSWERS])
    assert (record["pod"], record["gpuProduct"], record["probe"]) == ("bad", "H200", 2)
    assert operations["/metadata/ownerReferences"][-1]["uid"] == "uid-owner"
    assert ("event", "Pod", "KnownAnswersFailed") in client.calls
    # A second gather within the interval asks nobody, and reads no node again.
    good, bad = client.pods
    good["status"]["conditions"].append({"type": GATE_CONDITION, "status": "True"})
    bad["metadata"]["labels"] = operations["/metadata/labels"]
    bad["metadata"]["annotations"] = operations["/metadata/annotations"]
    client.calls.clear()
    again, _ = await gather_answers(
        client,
        client,
        OWNER,
        memory,
        30,
        iter([110.0, 110.0]).__next__,  # type: ignore[arg-type]
    )
    assert client.calls == [] and again.next_check_in_seconds == 20.5
    assert [p["metadata"]["name"] for p in again.pods] == ["good"]
    assert decide_answers(again, NOW).wrong_answers[0].pod == "bad"  # the evidence, listed


async def test_a_held_off_pod_is_read_with_get_named_and_given_its_event_once(
    unused_tcp_port_factory: Any,
) -> None:
    """A runtime whose check at start failed answers GET only (a POST would run its set
    again); a pod still loading does not listen: unread, not remembered as failed."""
    failed = verdict("failed")
    body = {"servingAllowed": False, "atStart": failed["atStart"], "latest": failed["latest"]}

    async def answer(_: web.Request) -> web.Response:
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/v2/known-answers", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = unused_tcp_port_factory()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        held, loading = pod("held", port), pod("loading", unused_tcp_port_factory())
        for each in (held, loading):
            each["status"]["conditions"] = [{"type": "ContainersReady", "status": "False"}]
            each["status"]["containerStatuses"] = [{"name": "runtime", "state": {"running": {}}}]
        client = Recorder([held, loading])
        readings, memory = await gather_answers(
            client, client, OWNER, AnswerMemory(), 30, iter([50.0, 50.5]).__next__,  # type: ignore[arg-type]
        )  # fmt: skip
        assert set(readings.answers) == {"uid-held"} and readings.answers["uid-held"].at_start
        assert memory.held_off_read_at_seconds == {"uid-held": 50.5, "uid-loading": 50.5}
        assert memory.checked_at_seconds == {} and memory.unread == {}
        report = decide_answers(readings, NOW)
        writes, taken = await apply_answers(client, OWNER, report, NOW)  # type: ignore[arg-type]
        assert taken == set() and writes == 2  # its gate, its Event
        assert not [c for c in client.calls if c[0] == "patch"], "not taken out"
        assert ("event", "Pod", "KnownAnswersFailed") in client.calls
        assert report.wrong_answers[0].pod == "held"
    finally:
        await runner.cleanup()
