"""The known-answer decision: which serving pods answer wrong, and what follows. Pure.

From the pods' latest verdicts (`state.known_answers`), a pod answers wrong when its set
failed, or when its answers differ from those a majority of its peers gave: pods of the
same engine digest on the same hardware (GPU product, else CPU model, else the node),
compared probe by probe through their answer digests. Two pods that differ cannot say
which is wrong, so a disagreement counts only against a strict majority of three or more.

What follows, in the order the controller applies it: each checked pod's readiness gate
(`kubeinfer.io/answers-correct`) True where it answered right, False where wrong (the pod
leaves its Service's endpoints at once, without being killed); a wrong pod is then taken
out of its ReplicaSet (relabelled: a replacement is created, the pod and its evidence
stay), with a Warning Event on the InferenceDeployment and on the pod. A pod that failed
its own check at start (never ready) is named and gated False, with its Events once, but
not taken out: it serves nothing, and a replacement would load the same engine. The
status lists the pods taken out while they exist and those held off, and names a node
where pods of different engines answered wrong. A pod that could not be read keeps its
gate as it was: a read that failed is no evidence against its answers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionValue, Reason
from kubeinfer.operator.api.v1alpha1.status import WrongAnswersStatus
from kubeinfer.operator.state import names
from kubeinfer.operator.state.events import Event
from kubeinfer.operator.state.known_answers import (
    GATE_CONDITION,
    AnswerReadings,
    AnswersReport,
    GateWrite,
    Hardware,
    PodAnswers,
    TakeOut,
    evidence_of,
    pod_condition,
    pod_uid,
)
from kubeinfer.operator.state.observed import KubeObject
from pydantic import ValidationError

MIN_PEERS_FOR_MAJORITY = 3
"""Pods of one engine on one hardware needed before a disagreement names the odd one."""
MAX_LISTED = 32


def disagreeing(answers: Iterable[PodAnswers], hardware: Mapping[str, Hardware]) -> dict[str, int]:
    """Per uid of a pod whose answer digests differ from those a strict majority of its
    peers (same engine, same hardware, at least MIN_PEERS_FOR_MAJORITY) gave: the first
    probe that differs."""
    groups: dict[tuple[str, str], list[PodAnswers]] = defaultdict(list)
    for each in answers:
        if each.unread is None and each.answer_digests and each.result != "skipped":
            key = hardware.get(each.node, Hardware(each.node)).peer_key
            groups[(each.engine_digest, key)].append(each)
    odd: dict[str, int] = {}
    for group in groups.values():
        if len(group) < MIN_PEERS_FOR_MAJORITY:
            continue
        (common, count), *_ = Counter(p.answer_digests for p in group).most_common(1)
        if count * 2 <= len(group):
            continue
        for each in group:
            if each.answer_digests != common:
                pairs = zip(each.answer_digests, common, strict=False)
                odd[each.uid] = next((i for i, (a, b) in enumerate(pairs) if a != b), 0)
    return odd


def _record(
    answers: PodAnswers, hardware: Hardware, odd_probe: int | None, now: datetime
) -> WrongAnswersStatus:
    """The status' (and the pod's annotation's) record of a pod answering wrong."""
    failed = answers.result == "failed"
    worst = answers.worst if failed else None
    return WrongAnswersStatus(
        pod=answers.pod,
        node=answers.node,
        gpu_product=hardware.gpu_product,
        gpu_uuid=hardware.gpu_uuid,
        cpu_model=hardware.cpu_model,
        engine_digest=answers.engine_digest,
        reason=Reason.KNOWN_ANSWERS_FAILED if failed else Reason.ANSWERS_DIFFER_FROM_PEERS,
        output=worst.output if worst else "",
        probe=worst.probe if worst else odd_probe,
        error=worst.error if worst else None,
        tolerance=worst.tolerance if worst else None,
        message=(
            (f"at start, never ready: {answers.reason}" if answers.at_start else answers.reason)[
                :2048
            ]
            if failed
            else f"probe {odd_probe} answered otherwise than a majority of its peers "
            "(same engine, same hardware)"
        ),
        detected=now,
    )


def _where(record: WrongAnswersStatus) -> str:
    device = (
        f"GPU {record.gpu_product}" + (f" {record.gpu_uuid}" if record.gpu_uuid else "")
        if record.gpu_product
        else f"CPU {record.cpu_model or 'unknown'}"
    )
    return f"node {record.node or '?'} ({device}), engine {record.engine_digest or '?'}"


def _take_out_event(record: WrongAnswersStatus) -> Event:
    what = (
        f"output {record.output!r} probe {record.probe} error {record.error} over tolerance "
        f"{record.tolerance}"
        if record.reason == Reason.KNOWN_ANSWERS_FAILED
        else record.message
    )
    return Event(
        "Warning",
        str(record.reason),
        f"Pod {record.pod} answered wrong on {_where(record)}: {what}; taken out of its "
        "Service and ReplicaSet (a replacement starts), kept for examination",
    )


def _held_off_event(record: WrongAnswersStatus) -> Event:
    return Event(
        "Warning",
        str(record.reason),
        f"Pod {record.pod} failed its known-answer check at start on {_where(record)}: "
        f"output {record.output!r} probe {record.probe} error {record.error} over tolerance "
        f"{record.tolerance}; it never becomes ready and serves nothing (kept in its "
        "ReplicaSet: a rollout waits, the pods before it serve)",
    )


def _gate(pod: KubeObject, answers: PodAnswers, wrong: bool) -> GateWrite | None:
    """The gate to write on a checked pod, None where it already says so."""
    current = pod_condition(pod, GATE_CONDITION)
    if wrong:
        write = GateWrite(pod, False, Reason.KNOWN_ANSWERS_FAILED, answers.reason[:1024])
    else:
        message = f"Known-answer set {answers.result} (engine {answers.engine_digest})"
        write = GateWrite(pod, True, Reason.ANSWERS_CORRECT, message)
    wanted = "True" if write.correct else "False"
    return None if current == wanted else write


def _kept_records(taken_out: Iterable[KubeObject]) -> list[WrongAnswersStatus]:
    records = []
    for pod in taken_out:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        record = evidence_of(pod, names.ANNOTATION_WRONG_ANSWERS)
        try:
            records.append(WrongAnswersStatus.model_validate(record or {}))
        except ValidationError:
            continue  # an annotation edited by hand: the pod is still out, not listed
    return records


def suspect_nodes(records: Iterable[WrongAnswersStatus]) -> tuple[str, ...]:
    """Nodes where pods of more than one engine answered wrong."""
    engines: dict[str, set[str]] = defaultdict(set)
    for record in records:
        if record.node:
            engines[record.node].add(record.engine_digest)
    return tuple(sorted(node for node, digests in engines.items() if len(digests) > 1))


def _condition(
    checked: Sequence[PodAnswers], records: Sequence[WrongAnswersStatus], serving: int
) -> ConditionValue:
    if records:
        newest = records[0]
        listed = ", ".join(f"{r.pod} ({_where(r)})" for r in records[:5])
        return (
            ConditionStatus.FALSE,
            Reason(newest.reason),
            f"{len(records)} pod(s) answered wrong and serve nothing (taken out of serving, "
            f"or never ready): {listed}; {serving} serving pod(s) answer correctly. Delete a "
            "pod taken out once examined",
        )
    if not checked:
        return (ConditionStatus.UNKNOWN, Reason.ANSWERS_UNCHECKED, "No serving pod checked yet")
    return (
        ConditionStatus.TRUE,
        Reason.ANSWERS_CORRECT,
        f"{len(checked)} serving pod(s) answered their known-answer set correctly",
    )


def decide_answers(readings: AnswerReadings, now: datetime) -> AnswersReport:
    """The gates, the pods to take out, the status and the condition of this pass."""
    by_uid = {pod_uid(pod): pod for pod in readings.pods}
    read = [a for uid, a in readings.answers.items() if uid in by_uid and a.unread is None]
    odd = disagreeing(read, readings.hardware)
    gates: list[GateWrite] = []
    take_out: list[TakeOut] = []
    held_off: list[TakeOut] = []
    for answers in sorted(read, key=lambda a: a.pod):
        pod = by_uid[answers.uid]
        wrong = answers.result == "failed" or answers.uid in odd
        if (gate := _gate(pod, answers, wrong)) is not None:
            gates.append(gate)
        if not wrong:
            continue
        hardware = readings.hardware.get(answers.node, Hardware(answers.node))
        record = _record(answers, hardware, odd.get(answers.uid), now)
        if not answers.at_start:
            take_out.append(TakeOut(pod, record, _take_out_event(record)))
        else:
            # Never ready, it serves nothing and holds its rollout: it stays where it is,
            # named, and its Event goes once (with its gate's first write).
            held_off.append(TakeOut(pod, record, _held_off_event(record)))
    noticed = [t for t in held_off if any(g.pod is t.pod for g in gates)]
    fresh = [t.record for t in (*take_out, *held_off)]
    taken = {r.pod for r in fresh}
    kept = [r for r in _kept_records(readings.taken_out) if r.pod not in taken]
    records = sorted([*fresh, *kept], key=lambda r: (r.detected, r.pod), reverse=True)
    correct = [a for a in read if a.result != "failed" and a.uid not in odd]
    return AnswersReport(
        gates=tuple(gates),
        take_out=tuple(take_out),
        condition=_condition(correct, records, len(correct)),
        wrong_answers=tuple(records[:MAX_LISTED]),
        suspect_nodes=suspect_nodes(records)[:MAX_LISTED],
        events=tuple(t.event for t in (*take_out, *noticed)),
        held_off=tuple(noticed),
        requeue_after_seconds=readings.next_check_in_seconds,
    )


def take_out_labels(pod: KubeObject) -> dict[str, Any]:
    """The labels a pod taken out of serving carries instead of its role's."""
    labels = dict((pod.get("metadata") or {}).get("labels") or {})
    labels[names.LABEL_COMPONENT] = names.COMPONENT_WRONG_ANSWERS
    labels[names.LABEL_ROLE] = names.ROLE_WRONG_ANSWERS
    return labels
