"""The known-answer checks' I/O: asking the serving pods, reading their nodes, and writing
what `reconcile.known_answers` decided (the pods' readiness gates, the pods taken out of
serving, the Events on them).

Each due pod is asked directly, at its IP and its container port named `http`, with
`POST /v2/known-answers` (the runtime runs the set at its lowest priority and answers the
verdicts); pods are asked at once, each bounded by `ANSWER_TIMEOUT_SECONDS`. A pod that
does not answer is `unread`, which changes nothing of its gate. Nodes are read with one
GET each, for the hardware the peers are grouped by and the status names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import aiohttp
from kubeinfer.operator.kube.apply import event_object
from kubeinfer.operator.kube.cache import Lister
from kubeinfer.operator.kube.client import POD, ApiError, JsonPatch, KubeClient
from kubeinfer.operator.kube.resources import NODE
from kubeinfer.operator.metrics_sources.pods import http_port
from kubeinfer.operator.reconcile.known_answers import take_out_labels
from kubeinfer.operator.state import names
from kubeinfer.operator.state.decision import Event
from kubeinfer.operator.state.known_answers import (
    GATE_CONDITION,
    AnswerMemory,
    AnswerReadings,
    AnswersReport,
    GateWrite,
    Hardware,
    PodAnswers,
    TakeOut,
    answers_from_wire,
    due_pods,
    evidence_json,
    hardware_of,
    held_off_due,
    next_check_in_seconds,
    pod_name,
    pod_node,
    pod_uid,
    unread_answers,
)
from kubeinfer.operator.state.observed import KubeObject, OwnerRef

logger = logging.getLogger(__name__)

ANSWER_TIMEOUT_SECONDS = 30.0
"""How long a pod may take to answer its set: each of its probe batches waits up to 10 s
for a quiet moment of its batcher (docs/known-answers.md), so a busy pod takes longer."""
CONNECT_TIMEOUT_SECONDS = 2.0
"""A pod that does not accept the connection by then is unread (an address nothing
answers at, as a simulated node's pods have)."""
PATH = "/v2/known-answers"


def _digest(pod: Mapping[str, Any]) -> str:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(names.ANNOTATION_ENGINE_DIGEST) or "")


async def _ask(session: aiohttp.ClientSession, pod: KubeObject, at_start: bool) -> PodAnswers:
    """One pod's verdict, or why it could not be read: a POST runs the set again; with
    `at_start` a GET reads the verdict of the pod's check at start (a held-off pod's)."""
    ip, port = (pod.get("status") or {}).get("podIP"), http_port(pod)
    if not ip or port is None:
        return unread_answers(pod, _digest(pod), "no IP or no container port named 'http'")
    host = f"[{ip}]" if ":" in ip else ip
    url = f"http://{host}:{port}{PATH}"
    try:
        async with session.request("GET" if at_start else "POST", url) as response:
            if response.status != 200:
                return unread_answers(pod, _digest(pod), f"{url} answered HTTP {response.status}")
            body = await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError) as error:
        return unread_answers(pod, _digest(pod), f"{url}: {str(error) or type(error).__name__}")
    if not isinstance(body, dict):
        return unread_answers(pod, _digest(pod), f"{url} answered no JSON object")
    return answers_from_wire(pod, _digest(pod), body, at_start=at_start)


async def ask_pods(
    pods: Sequence[KubeObject], held_off: Sequence[KubeObject] = ()
) -> tuple[list[PodAnswers], list[PodAnswers]]:
    """The checkable pods' verdicts (their sets run again) and the held-off pods' verdicts
    at start (read only), all asked at once."""
    if not pods and not held_off:
        return [], []
    timeout = aiohttp.ClientTimeout(
        total=ANSWER_TIMEOUT_SECONDS, sock_connect=CONNECT_TIMEOUT_SECONDS
    )
    async with aiohttp.ClientSession(timeout=timeout) as session:
        asked = [_ask(session, pod, at_start=False) for pod in pods]
        read = [_ask(session, pod, at_start=True) for pod in held_off]
        answered = await asyncio.gather(*asked, *read)
    return list(answered[: len(pods)]), list(answered[len(pods) :])


async def read_hardware(client: KubeClient, nodes: Iterable[str]) -> dict[str, Hardware]:
    """Each named node's hardware (a node that cannot be read: its name only)."""
    wanted = sorted({node for node in nodes if node})

    async def one(name: str) -> Hardware:
        try:
            return hardware_of(await client.get(NODE, "", name), name)
        except ApiError as error:
            logger.info("Node not read: node=%s error=%s", name, error)
            return Hardware(name)

    return dict(zip(wanted, await asyncio.gather(*(one(n) for n in wanted)), strict=True))


async def gather_answers(
    client: KubeClient,
    reader: Lister,
    owner: OwnerRef,
    memory: AnswerMemory,
    interval_seconds: float,
    clock: Any,
) -> tuple[AnswerReadings, AnswerMemory]:
    """The serving pods, the due ones asked, their nodes, the pods taken out earlier; and
    the memory to keep (only of pods that still serve). `clock()` is monotonic seconds."""
    serving_selector = names.selector_string(names.runtime_selector(owner.name))
    listed = await reader.list(POD, owner.namespace, serving_selector)
    pods = [pod for pod in listed if pod_uid(pod) not in memory.taken_out]
    taken_selector = names.selector_string(names.wrong_answers_selector(owner.name))
    taken_out = await reader.list(POD, owner.namespace, taken_selector)
    started_seconds = clock()
    due = due_pods(pods, memory, interval_seconds, started_seconds)
    asked, read_held_off = await ask_pods(due, held_off_due(pods, memory, started_seconds))
    now_seconds = clock()
    uids = {pod_uid(pod) for pod in pods}
    checked = {uid: t for uid, t in memory.checked_at_seconds.items() if uid in uids}
    answers = {uid: a for uid, a in memory.answers.items() if uid in uids}
    unread = {uid: u for uid, u in memory.unread.items() if uid in uids}
    for each in asked:
        if each.unread is None:
            checked[each.uid], answers[each.uid] = now_seconds, each
            unread.pop(each.uid, None)
        else:
            unread[each.uid] = (now_seconds, unread.get(each.uid, (0.0, 0))[1] + 1)
            logger.info("Known answers not read: pod=%s reason=%s", each.pod, each.unread)
    held_off_read = {uid: t for uid, t in memory.held_off_read_at_seconds.items() if uid in uids}
    for each in read_held_off:
        held_off_read[each.uid] = now_seconds
        # Only a failure at start counts: a pod that passed it is checked once ready.
        if each.unread is None and each.at_start and each.result == "failed":
            answers[each.uid] = each
    nodes = {pod_node(p) for p in pods}
    hardware = {n: h for n, h in memory.hardware.items() if n in nodes}
    hardware.update(await read_hardware(client, nodes - set(hardware)))
    taken = memory.taken_out & {pod_uid(p) for p in listed}  # forgotten once the watch agrees
    kept = AnswerMemory(checked, answers, hardware, unread, frozenset(taken), held_off_read)
    readings = AnswerReadings(
        pods=tuple(pods),
        answers=answers,
        hardware=hardware,
        taken_out=tuple(taken_out),
        next_check_in_seconds=next_check_in_seconds(pods, kept, interval_seconds, now_seconds),
    )
    return readings, kept


def _gate_patch(gate: GateWrite, now: datetime) -> KubeObject:
    """The gate condition, merged into the pod's status by its type (the kubelet owns the
    other conditions, and keeps this one)."""
    condition = {
        "type": GATE_CONDITION,
        "status": "True" if gate.correct else "False",
        "reason": str(gate.reason),
        "message": gate.message,
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return {"status": {"conditions": [condition]}}


def _take_out_operations(pod: KubeObject, owner: OwnerRef, take_out: TakeOut) -> JsonPatch:
    """Relabels the pod out of its ReplicaSet and Service, records its evidence, and makes
    the InferenceDeployment an owner, so deleting that still deletes the pod."""
    meta = pod["metadata"]
    annotations = {
        **(meta.get("annotations") or {}),
        names.ANNOTATION_WRONG_ANSWERS: evidence_json(
            take_out.record.model_dump(mode="json", by_alias=True, exclude_none=True)
        ),
    }
    reference = {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceDeployment",
        "name": owner.name,
        "uid": owner.uid,
    }
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
        {"op": "replace", "path": "/metadata/labels", "value": take_out_labels(pod)},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
        {"op": "add", "path": "/metadata/ownerReferences",
         "value": [*(meta.get("ownerReferences") or []), reference]},
    ]  # fmt: skip


def _pod_event(pod: KubeObject, owner: OwnerRef, event: Event, now: datetime) -> KubeObject:
    body = event_object(owner, event, now)
    body["metadata"]["generateName"] = f"{pod_name(pod)}."
    body["involvedObject"] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod_name(pod),
        "namespace": owner.namespace,
        "uid": pod_uid(pod),
    }
    return body


async def apply_answers(
    client: KubeClient, owner: OwnerRef, report: AnswersReport, now: datetime
) -> tuple[int, set[str]]:
    """The gates first (a wrong pod leaves its endpoints at once), then the pods taken
    out, each with an Event of its own; returns the writes made. A pod relabelled by
    someone else meanwhile fails its take-out's resourceVersion test, and is decided
    again on the next pass. Also returns the uids of the pods taken out."""
    writes, taken = 0, set()
    written: dict[str, KubeObject] = {}
    for gate in report.gates:
        name = pod_name(gate.pod)
        try:
            written[name] = await client.strategic_patch(
                POD, owner.namespace, name, _gate_patch(gate, now), subresource="status"
            )
        except ApiError as error:
            if error.status != 404:
                raise
            continue  # gone meanwhile: nothing to gate
        writes += 1
    for take_out in report.take_out:
        pod = written.get(pod_name(take_out.pod), take_out.pod)
        name = pod_name(pod)
        operations = _take_out_operations(pod, owner, take_out)
        try:
            await client.json_patch(POD, owner.namespace, name, operations)
        except ApiError as error:
            if error.status not in (404, 409, 422):
                raise
            # Gone, or changed since it was read (taken out already, seen through a watch
            # that lags): the next pass decides on what it reads then.
            logger.info("Pod not taken out: pod=%s/%s error=%s", owner.namespace, name, error)
            continue
        taken.add(pod_uid(pod))
        logger.warning("Pod taken out of serving: pod=%s/%s %s", owner.namespace, name,
                       take_out.event.message)  # fmt: skip
        await _post_pod_event(client, pod, owner, take_out.event, now)
        writes += 2
    for held in report.held_off:
        if (gated := written.get(pod_name(held.pod))) is None:
            continue  # its gate not written: gone meanwhile
        logger.warning("Pod failed its check at start: pod=%s/%s %s", owner.namespace,
                       pod_name(gated), held.event.message)  # fmt: skip
        await _post_pod_event(client, gated, owner, held.event, now)
        writes += 1
    return writes, taken


async def _post_pod_event(
    client: KubeClient, pod: KubeObject, owner: OwnerRef, event: Event, now: datetime
) -> None:
    """The pod's Event; one not posted is logged, not retried (the status names it)."""
    try:
        await client.create(_pod_event(pod, owner, event, now))
    except ApiError as error:
        logger.warning("Event not posted: pod=%s error=%s", pod_name(pod), error)
