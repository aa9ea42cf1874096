"""What the operator knows of the serving pods' known-answer checks: each pod's latest
verdict (read with `POST /v2/known-answers`), the hardware of its node, and when it was
last checked. Pure values and the pure readings of the API objects they come from.

The schedule runs on the operator's monotonic clock (`checked_at_seconds`), never on
the wall clock: a step of the system time must neither skip checks nor run them all.
The memory of the checks is kept by the controller between passes (as the autoscaler's
history is): a restarted operator checks every pod once more, which costs a few
milliseconds of each engine and changes nothing that passed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeinfer.operator.api.v1alpha1.conditions import ConditionValue, Reason
from kubeinfer.operator.api.v1alpha1.status import WrongAnswersStatus
from kubeinfer.operator.state.events import Event

KubeObject = dict[str, Any]
"""An object as the API returns it (`observed.KubeObject`: observed.py holds these
readings, so this module does not import it)."""

GATE_CONDITION = "kubeinfer.io/answers-correct"
"""The runtime pods' readiness gate: a pod is Ready only once the operator set it True."""

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_UUID_LABEL = "nvidia.com/gpu.uuid"
CPU_MODEL_LABELS = (
    "feature.node.kubernetes.io/cpu-model.vendor_id",
    "feature.node.kubernetes.io/cpu-model.family",
    "feature.node.kubernetes.io/cpu-model.id",
)
"""Node feature discovery's CPU model labels, joined in this order."""
ARCH_LABEL = "kubernetes.io/arch"
UNREAD_RETRY_SECONDS = 5.0
"""How soon a pod that could not be read is asked again (doubled at each unanswered ask,
up to the interval: a pod the operator cannot reach costs it little)."""


@dataclass(frozen=True)
class Hardware:
    """What a node computes on, as its labels and status say."""

    node: str
    gpu_product: str | None = None
    gpu_uuid: str | None = None
    cpu_model: str | None = None

    @property
    def peer_key(self) -> str:
        """Pods whose answers may be compared bit for bit: the same GPU product, else the
        same CPU model; a node that names neither is compared only with itself."""
        if self.gpu_product:
            return f"gpu:{self.gpu_product}"
        if self.cpu_model and not self.cpu_model.startswith("arch "):
            return f"cpu:{self.cpu_model}"
        return f"node:{self.node}"


@dataclass(frozen=True)
class OutputFailure:
    """The worst output of a failed verdict."""

    output: str
    probe: int | None
    error: float | None
    """None where the runtime reported a NaN or an infinity."""
    tolerance: float | None


@dataclass(frozen=True)
class PodAnswers:
    """One pod's latest verdict, or why it could not be read (`unread`: not a failure of
    the pod's answers, only of the operator's read)."""

    pod: str
    uid: str
    node: str
    engine_digest: str
    result: str = ""
    """passed, failed or skipped (the runtime's words); empty when unread."""
    reason: str = ""
    answer_digests: tuple[str, ...] = ()
    worst: OutputFailure | None = None
    unread: str | None = None
    at_start: bool = False
    """The verdict of the pod's own check at start, read while it is not ready: a failure
    holds its readiness false for good."""


@dataclass(frozen=True)
class AnswerMemory:
    """Per pod uid, when it was last checked (monotonic seconds) and what it answered;
    per node, its hardware (read once: a node's devices do not change under it)."""

    checked_at_seconds: Mapping[str, float] = field(default_factory=dict)
    answers: Mapping[str, PodAnswers] = field(default_factory=dict)
    hardware: Mapping[str, Hardware] = field(default_factory=dict)
    unread: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    """Per pod uid whose last asks went unanswered: when, and how many in a row."""
    taken_out: frozenset[str] = frozenset()
    """Uids of the pods this operator took out: no longer serving, whatever a watch that
    lags still says of their labels."""
    held_off_read_at_seconds: Mapping[str, float] = field(default_factory=dict)
    """Per uid of a pod whose containers run but are not ready, when its verdict at start
    was last read (`held_off_due`)."""


@dataclass(frozen=True)
class AnswerReadings:
    """What the gather step read for the known-answer decision."""

    pods: tuple[KubeObject, ...]
    """The serving pods that can be checked (containers ready, addressable)."""
    answers: Mapping[str, PodAnswers]
    """Per pod uid, its latest verdict (this pass' or remembered)."""
    hardware: Mapping[str, Hardware]
    """Per node name."""
    taken_out: tuple[KubeObject, ...]
    """Pods the operator took out of serving earlier, which are the status' evidence."""
    next_check_in_seconds: float | None
    """When the next pod is due, from the end of this gather."""


@dataclass(frozen=True)
class GateWrite:
    """A pod's readiness gate condition to set."""

    pod: KubeObject
    correct: bool
    reason: Reason
    message: str


@dataclass(frozen=True)
class TakeOut:
    """A pod to relabel out of its ReplicaSet and Service, with its evidence."""

    pod: KubeObject
    record: WrongAnswersStatus
    event: Event


@dataclass(frozen=True)
class AnswersReport:
    """What the known-answer decision adds to a pass."""

    gates: tuple[GateWrite, ...] = ()
    take_out: tuple[TakeOut, ...] = ()
    condition: ConditionValue | None = None
    wrong_answers: tuple[WrongAnswersStatus, ...] = ()
    suspect_nodes: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()
    held_off: tuple[TakeOut, ...] = ()
    """Pods newly found failed at start: not taken out, but each gets its Event."""
    requeue_after_seconds: float | None = None


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def pod_node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_condition(pod: Mapping[str, Any], kind: str) -> str | None:
    """The status (True, False, Unknown) of the pod's condition `kind`, None if absent."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return str(condition.get("status"))
    return None


def checkable(pod: Mapping[str, Any]) -> bool:
    """Whether the pod can answer its set: its containers are ready (the runtime passed
    its own check at start), it has an IP, and it is not going away."""
    meta = pod.get("metadata") or {}
    return (
        not meta.get("deletionTimestamp")
        and pod_condition(pod, "ContainersReady") == "True"
        and bool((pod.get("status") or {}).get("podIP"))
    )


def held_off(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's containers run but are not ready, and it is addressable and not
    going away: a runtime whose check at start failed holds its readiness false for good
    and says why at `GET /v2/known-answers` (one still loading does not listen yet)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    return (
        not meta.get("deletionTimestamp")
        and bool(status.get("podIP"))
        and bool(containers)
        and all("running" in (c.get("state") or {}) for c in containers)
        and pod_condition(pod, "ContainersReady") != "True"
    )


def held_off_due(
    pods: Iterable[KubeObject], memory: AnswerMemory, now_seconds: float
) -> list[KubeObject]:
    """The held-off pods whose verdict at start to read now: not known failed already (the
    failure is for good), and not read within UNREAD_RETRY_SECONDS. Kept apart from the
    checks' schedule, so that a pod asked while it loads is checked at once when ready."""
    return [
        pod
        for pod in pods
        if _awaits_verdict_at_start(pod, memory)
        and now_seconds >= _held_off_read_due_at(pod, memory)
    ]


def _awaits_verdict_at_start(pod: KubeObject, memory: AnswerMemory) -> bool:
    """Held off, and not known failed at start already (that failure is for good)."""
    known = memory.answers.get(pod_uid(pod))
    return held_off(pod) and not (known is not None and known.at_start)


def _held_off_read_due_at(pod: KubeObject, memory: AnswerMemory) -> float:
    last = memory.held_off_read_at_seconds.get(pod_uid(pod))
    return -math.inf if last is None else last + UNREAD_RETRY_SECONDS


def awaits_answer_check(pod: Mapping[str, Any]) -> bool:
    """A serving pod whose runtime is up and whose gate the operator has not set yet: it
    serves only once the operator asked it (a pass at once, not at the next resync)."""
    gated = any(
        gate.get("conditionType") == GATE_CONDITION
        for gate in (pod.get("spec") or {}).get("readinessGates") or []
    )
    return gated and checkable(pod) and pod_condition(pod, GATE_CONDITION) is None


def due_at_seconds(pod: Mapping[str, Any], memory: AnswerMemory, interval_seconds: float) -> float:
    """When (monotonic seconds) a checkable pod is to be asked next: at once when never
    asked; UNREAD_RETRY_SECONDS after it was read while its gate is still not set (the
    write failed: a new pod waits for it to serve); else the interval after its last
    check. A pod whose last asks went unanswered: UNREAD_RETRY_SECONDS after the last,
    doubled with each unanswered ask, up to the interval."""
    uid = pod_uid(pod)
    if uid in memory.unread:
        since, failures = memory.unread[uid]
        backoff = UNREAD_RETRY_SECONDS * float(2 ** max(failures - 1, 0))
        return since + min(interval_seconds, backoff)
    last = memory.checked_at_seconds.get(uid)
    if last is None:
        return -math.inf
    if pod_condition(pod, GATE_CONDITION) is None:  # its gate write is due, or failed
        return last + UNREAD_RETRY_SECONDS
    return last + interval_seconds


def due_pods(
    pods: Iterable[KubeObject], memory: AnswerMemory, interval_seconds: float, now_seconds: float
) -> list[KubeObject]:
    """The checkable pods to ask now (`due_at_seconds`)."""
    return [
        pod
        for pod in pods
        if checkable(pod) and due_at_seconds(pod, memory, interval_seconds) <= now_seconds
    ]


def next_check_in_seconds(
    pods: Iterable[KubeObject], memory: AnswerMemory, interval_seconds: float, now_seconds: float
) -> float | None:
    """Seconds until the earliest checkable pod is due, or a held-off pod's verdict at
    start is to be read (None without any)."""
    waits = []
    for pod in pods:
        if checkable(pod):
            waits.append(max(0.0, due_at_seconds(pod, memory, interval_seconds) - now_seconds))
        elif _awaits_verdict_at_start(pod, memory):
            waits.append(max(0.0, _held_off_read_due_at(pod, memory) - now_seconds))
    return min(waits) if waits else None


def hardware_of(node: Mapping[str, Any] | None, name: str) -> Hardware:
    """A node's GPU product and UUID, or its CPU model, from its labels (and its
    architecture from its status where no label names the model)."""
    if node is None:
        return Hardware(name)
    labels = (node.get("metadata") or {}).get("labels") or {}
    model = [str(labels[key]) for key in CPU_MODEL_LABELS if labels.get(key)]
    arch = labels.get(ARCH_LABEL) or ((node.get("status") or {}).get("nodeInfo") or {}).get(
        "architecture"
    )
    cpu = " ".join(model) if model else (f"arch {arch}" if arch else None)
    return Hardware(
        node=name,
        gpu_product=labels.get(GPU_PRODUCT_LABEL) or None,
        gpu_uuid=labels.get(GPU_UUID_LABEL) or None,
        cpu_model=cpu,
    )


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _worst(outputs: Iterable[Mapping[str, Any]]) -> OutputFailure | None:
    """The failed output with the largest error over its tolerance (a non-finite error
    first), or None when every output passed."""
    failed = [o for o in outputs if o.get("passed") is False]
    if not failed:
        return None

    def ratio(output: Mapping[str, Any]) -> float:
        error, tolerance = _number(output.get("error")), _number(output.get("tolerance"))
        if error is None:
            return math.inf
        return error / tolerance if tolerance else error

    worst = max(failed, key=ratio)
    probe = worst.get("probe")
    return OutputFailure(
        output=str(worst.get("name") or ""),
        probe=probe if isinstance(probe, int) else None,
        error=_number(worst.get("error")),
        tolerance=_number(worst.get("tolerance")),
    )


def answers_from_wire(
    pod: Mapping[str, Any], digest: str, body: Mapping[str, Any], *, at_start: bool = False
) -> PodAnswers:
    """The pod's verdict from its `/v2/known-answers` answer: its latest run, or with
    `at_start` its check at start (a held-off pod's; the runtime reports that run as its
    latest too, so the body alone cannot say which was asked for)."""
    wanted = body.get("atStart") if at_start else body.get("latest") or body.get("atStart")
    latest = wanted or {}
    return PodAnswers(
        at_start=at_start and bool(wanted),
        pod=pod_name(pod),
        uid=pod_uid(pod),
        node=pod_node(pod),
        engine_digest=str(latest.get("digest") or digest),
        result=str(latest.get("result") or ""),
        reason=str(latest.get("reason") or ""),
        answer_digests=tuple(str(d) for d in latest.get("answerDigests") or ()),
        worst=_worst(latest.get("outputs") or ()),
    )


def unread_answers(pod: Mapping[str, Any], digest: str, why: str) -> PodAnswers:
    return PodAnswers(pod_name(pod), pod_uid(pod), pod_node(pod), digest, unread=why)


def evidence_json(record: Mapping[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def evidence_of(pod: Mapping[str, Any], annotation: str) -> dict[str, Any] | None:
    """The record the operator wrote on a pod it took out of serving, if readable."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(annotation)
    try:
        record = json.loads(text) if text else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
