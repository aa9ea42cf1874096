"""The demo's known answers: a replica that starts answering wrong is caught by the
operator's checks, taken out of serving, replaced and named.

The fault is the tests' own (docs/known-answers.md, "Faults for the tests"): the demo
installs the operator with `pods.testing_faults` (`FAULTS`), which every serving pod of
the objects `pods.testing_faults_objects` names runs, so that only this step's object,
`ANSWERS`, gets it, and the other steps stay fault-free. A pod of it answers wrong from
its (`CLEAN_BATCHES` + 1)th batch on; its own check at start and the operator's checks run
a couple of batches each, so a pod that serves nothing else stays right. The step sends
`CLEAN_BATCHES` + 5 single-row requests straight to one pod's IP (the demo runs inside the
cluster's network namespace), one batch each: that pod goes wrong, its peer does not.
Within one `intervalSeconds` (30, the shortest allowed) the operator asks it its known
answers again, sets its readiness gate False (it leaves the Service's endpoints, alive),
takes it out of its ReplicaSet (a replacement starts), names it in `status.wrongAnswers`
and turns AnswersCorrect False, while the other pod stays in the endpoints throughout.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import numpy as np
from kubeinfer.cli.demo.step_protocol import Demo, Step
from kubeinfer.operator.state import names

NAMESPACE = "default"
ANSWERS = "answers"
"""The step's own InferenceDeployment, the only one whose pods get the faults."""
CLEAN_BATCHES = 40
"""Batches a pod runs right: its check at start and each of the operator's checks take 2
(the demo model's 16 probes: the first alone, then the rest in one batch)."""
INTERVAL_SECONDS = 30
"""`spec.knownAnswers.intervalSeconds`: the shortest allowed."""
FAULTS = {
    "KUBEINFER_PODS__TESTING_FAULTS": f"perturb-batches=1,perturb-after-batches={CLEAN_BATCHES}",
    "KUBEINFER_PODS__TESTING_FAULTS_OBJECTS": f"{NAMESPACE}/{ANSWERS}",
}
"""The operator's settings the demo installs it with (FOR TESTS ONLY, never in production):
the faults, for `ANSWERS` only."""
HTTP_PORT = 8000


def _body(rows: np.ndarray) -> dict[str, Any]:
    tensor = {"name": "input", "shape": list(rows.shape), "datatype": "FP32",
              "data": rows.ravel().tolist()}  # fmt: skip
    return {"inputs": [tensor]}


def url_of(pod: dict[str, Any]) -> str:
    return f"http://{pod['status']['podIP']}:{HTTP_PORT}/v2/models/demo/infer"


async def endpoint_ips(demo: Demo) -> set[str]:
    """The ready addresses of the step's Service's EndpointSlices."""
    service = names.service_name(ANSWERS)
    slices = json.loads(
        await demo.kubectl(
            "get", "endpointslices", "-l", f"kubernetes.io/service-name={service}", "-o", "json"
        )
    )
    return {
        address
        for item in slices["items"]
        for endpoint in item.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint.get("addresses") or []
    }


async def answer_of(session: aiohttp.ClientSession, url: str, rows: np.ndarray) -> np.ndarray:
    async with session.post(url, json=_body(rows)) as response:
        assert response.status == 200, f"{url}: {response.status}"
        output = (await response.json())["outputs"][0]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


async def wrong_answers(demo: Demo, step: Step) -> None:
    import onnxruntime

    spec = demo.demo_spec(
        "1", runtime={"replicas": 2}, knownAnswers={"intervalSeconds": INTERVAL_SECONDS}
    )
    await demo.apply([_manifest(spec)])
    try:
        await _catch(demo, step, onnxruntime.InferenceSession(str(demo.models.small)))
    finally:
        await demo.kubectl("delete", "infd", ANSWERS, "--wait=false")
        demo.say(f"$ kubectl delete infd {ANSWERS}")


def _manifest(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": ANSWERS, "namespace": NAMESPACE},
        "spec": spec,
    }


async def _catch(demo: Demo, step: Step, reference: Any) -> None:
    async def two_ready() -> list[dict[str, Any]] | None:
        pods = await demo.pods(ANSWERS)
        ips = await endpoint_ips(demo)
        ready = [p for p in pods if p.get("status", {}).get("podIP") in ips]
        return ready if len(ready) == 2 else None

    ready = await demo.until(two_ready, 150, f"2 ready {ANSWERS} pods in its Service")
    await demo.until(lambda: _answers_status(demo, "True"), 30, "AnswersCorrect True on both pods")
    await demo.show("get", "infd", ANSWERS)
    bad, good = sorted(ready, key=lambda p: p["metadata"]["name"])
    bad_ip, good_ip = bad["status"]["podIP"], good["status"]["podIP"]
    rows = np.random.default_rng(5).standard_normal((1, 512)).astype(np.float32)
    expected = reference.run(None, {"input": rows})[0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        requests = CLEAN_BATCHES + 5
        demo.say(
            f"  {requests} requests straight to one pod, {bad['metadata']['name']} "
            f"({url_of(bad)}), the other untouched; its last answer against ONNX Runtime "
            "in-process:"
        )
        for _ in range(requests - 1):
            await answer_of(session, url_of(bad), rows)
        wrong = float(np.abs(await answer_of(session, url_of(bad), rows) - expected).max())
        right = float(np.abs(await answer_of(session, url_of(good), rows) - expected).max())
        demo.say(
            f"  {bad['metadata']['name']}: max |diff| {wrong:.2f} (answering wrong); "
            f"{good['metadata']['name']}: {right:.1e}"
        )
        assert wrong > 1e-2 and right < 1e-3, "the fault did not reach one pod only"
        good_throughout = True

        async def watch_good() -> None:
            nonlocal good_throughout
            while True:
                good_throughout &= good_ip in await endpoint_ips(demo)
                await asyncio.sleep(0.5)  # not a wait: how often the endpoints are read

        watcher = asyncio.create_task(watch_good())
        started = time.monotonic()
        try:
            await demo.until(
                lambda: _out_of_endpoints(demo, bad_ip),
                INTERVAL_SECONDS + 20,
                "the wrong pod out of its Service's endpoints within one interval",
            )
            caught = time.monotonic() - started
            demo.say(
                f"  {bad['metadata']['name']} left the Service's endpoints {caught:.0f} s "
                f"later (the operator's checks every {INTERVAL_SECONDS} s)"
            )
            await demo.until(lambda: _answers_status(demo, "False"), 20, "AnswersCorrect False")
            replacement = await demo.until(
                lambda: _replacement(demo, bad, good_ip), 90, "a replacement Ready"
            )
            demo.say(
                f"  its replacement {replacement} Ready {time.monotonic() - started:.0f} s "
                "after the wrong answers: 2 pods serve again"
            )
            again = float(np.abs(await answer_of(session, url_of(good), rows) - expected).max())
            assert again < 1e-3, f"the other pod answered wrong: {again}"
        finally:
            watcher.cancel()
    assert good_throughout, "the other pod left the Service's endpoints"
    infd = await demo.infd(ANSWERS)
    answers = demo.condition(infd, "AnswersCorrect")
    assert bad["metadata"]["name"] in answers.get("message", ""), answers
    (record,) = infd["status"]["wrongAnswers"]
    assert record["pod"] == bad["metadata"]["name"], record
    assert record["node"] == bad["spec"]["nodeName"], record
    await demo.show("get", "infd", ANSWERS)
    await demo.show_plugin("infd", "answers", ANSWERS)
    await demo.show(
        "get", "events", "--field-selector", "reason=KnownAnswersFailed",
        "-o", "custom-columns=TYPE:.type,REASON:.reason,OBJECT:.involvedObject.name,"
        "MESSAGE:.message",
    )  # fmt: skip
    await demo.show("get", "pods", "-l", "app.kubernetes.io/component=wrong-answers")
    demo.say(f"  {good['metadata']['name']} stayed in the Service's endpoints throughout")
    step.outcome = (
        f"caught: pod {record['pod']} on node {record['node']} "
        f"(engine {record['engineDigest'][:19]}...), replaced"
    )


async def _answers_status(demo: Demo, status: str) -> bool:
    answers = demo.condition(await demo.infd(ANSWERS), "AnswersCorrect")
    return answers.get("status") == status


async def _out_of_endpoints(demo: Demo, ip: str) -> bool:
    return ip not in await endpoint_ips(demo)


async def _replacement(demo: Demo, bad: dict[str, Any], good_ip: str) -> str | None:
    """The replacement's name once two ready serving pods are in the Service again, the
    other pod and a new one."""
    ips = await endpoint_ips(demo)
    serving = [
        p for p in await demo.pods(ANSWERS) if p["metadata"]["uid"] != bad["metadata"]["uid"]
    ]
    ready = [p for p in serving if p["status"].get("podIP") in ips]
    if len(ready) != 2 or good_ip not in {p["status"]["podIP"] for p in ready}:
        return None
    (new,) = [p["metadata"]["name"] for p in ready if p["status"]["podIP"] != good_ip]
    return str(new)
