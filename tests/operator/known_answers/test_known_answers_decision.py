"""The known-answer decision (`reconcile.known_answers`) and what it reads
(`state.known_answers`), as pure functions: which serving pods answer wrong (a failed
set, or answers that differ from a majority of their peers on the same engine and
hardware), the readiness gates and take-outs that follow, the status records, the
suspect nodes, the AnswersCorrect condition, and the schedule on a monotonic clock."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from decide_scenarios import SETTINGS, T0, Cluster, as_gathered, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, Reason
from kubeinfer.operator.reconcile.decide import decide
from kubeinfer.operator.reconcile.known_answers import decide_answers, disagreeing
from kubeinfer.operator.state import names
from kubeinfer.operator.state.known_answers import (
    GATE_CONDITION,
    AnswerMemory,
    AnswerReadings,
    Hardware,
    PodAnswers,
    answers_from_wire,
    awaits_answer_check,
    due_pods,
    evidence_json,
    hardware_of,
    next_check_in_seconds,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def pod(name: str, node: str = "node-1", gate: str | None = None, ready: bool = True) -> Any:
    conditions = [{"type": "ContainersReady", "status": "True" if ready else "False"}]
    if gate is not None:
        conditions.append({"type": GATE_CONDITION, "status": gate})
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {names.LABEL_COMPONENT: names.COMPONENT_RUNTIME},
            "annotations": {names.ANNOTATION_ENGINE_DIGEST: DIGEST},
        },
        "spec": {"nodeName": node, "readinessGates": [{"conditionType": GATE_CONDITION}]},
        "status": {"podIP": "10.0.0.1", "conditions": conditions},
    }


def verdict(result: str = "passed", digests: tuple[str, ...] = ("d0", "d1")) -> dict[str, Any]:
    outputs = [{"name": "logits", "tolerance": 0.14, "error": 0.01, "probe": 3, "passed": True}]
    if result == "failed":
        outputs = [{"name": "logits", "tolerance": 0.14, "error": 0.4, "probe": 6, "passed": False}]
    latest = {
        "digest": DIGEST,
        "result": result,
        "reason": "output 'logits': probe 6 answered 0.4" if result == "failed" else "",
        "outputs": outputs,
        "answerDigests": list(digests),
    }
    return {"servingAllowed": True, "atStart": latest, "latest": latest}


def readings(pods: list[Any], answers: list[PodAnswers], **kwargs: Any) -> AnswerReadings:
    return AnswerReadings(
        pods=tuple(pods),
        answers={a.uid: a for a in answers},
        hardware=kwargs.get("hardware", {"node-1": Hardware("node-1", cpu_model="Intel 6 143")}),
        taken_out=tuple(kwargs.get("taken_out", ())),
        next_check_in_seconds=kwargs.get("next_check", 300.0),
    )


def test_a_pod_that_passed_gets_its_gate_true_and_the_condition_says_correct() -> None:
    good = pod("good")
    report = decide_answers(readings([good], [answers_from_wire(good, DIGEST, verdict())]), NOW)
    assert [(g.pod["metadata"]["name"], g.correct) for g in report.gates] == [("good", True)]
    assert report.take_out == ()
    assert report.condition is not None and report.condition[0] == ConditionStatus.TRUE


def test_a_gate_already_true_is_not_written_again() -> None:
    good = pod("good", gate="True")
    report = decide_answers(readings([good], [answers_from_wire(good, DIGEST, verdict())]), NOW)
    assert report.gates == ()


def test_a_pod_that_failed_its_set_is_gated_false_taken_out_and_named() -> None:
    good, bad = pod("good", gate="True"), pod("bad", gate="True")
    answers = [
        answers_from_wire(good, DIGEST, verdict()),
        answers_from_wire(bad, DIGEST, verdict("failed")),
    ]
    report = decide_answers(readings([good, bad], answers), NOW)
    assert [(g.pod["metadata"]["name"], g.correct) for g in report.gates] == [("bad", False)]
    (out,) = report.take_out
    record = out.record
    assert (record.pod, record.node, record.engine_digest) == ("bad", "node-1", DIGEST)
    assert (record.output, record.probe, record.error, record.tolerance) == ("logits", 6, 0.4, 0.14)
    assert record.cpu_model == "Intel 6 143" and record.reason == Reason.KNOWN_ANSWERS_FAILED
    assert report.condition is not None
    assert report.condition[:2] == (ConditionStatus.FALSE, Reason.KNOWN_ANSWERS_FAILED)
    assert [r.pod for r in report.wrong_answers] == ["bad"]
    assert "bad" in report.events[0].message and "node-1" in report.events[0].message


def test_a_pod_that_could_not_be_read_keeps_its_gate() -> None:
    quiet = pod("quiet", gate="True")
    unread = PodAnswers("quiet", "uid-quiet", "node-1", DIGEST, unread="timed out")
    report = decide_answers(readings([quiet], [unread]), NOW)
    assert report.gates == () and report.take_out == ()
    assert report.condition is not None and report.condition[0] == ConditionStatus.UNKNOWN


def test_the_odd_one_of_three_peers_is_taken_out_but_one_of_two_is_not() -> None:
    pods = [pod(n, gate="True") for n in ("a", "b", "c")]
    digests = [("d0", "d1"), ("d0", "d1"), ("d0", "XX")]
    answers = [
        answers_from_wire(p, DIGEST, verdict(digests=d)) for p, d in zip(pods, digests, strict=True)
    ]
    hardware = {"node-1": Hardware("node-1", gpu_product="NVIDIA-H100")}
    assert disagreeing(answers, hardware) == {"uid-c": 1}
    report = decide_answers(readings(pods, answers, hardware=hardware), NOW)
    assert [t.record.pod for t in report.take_out] == ["c"]
    assert report.take_out[0].record.reason == Reason.ANSWERS_DIFFER_FROM_PEERS
    assert report.take_out[0].record.probe == 1
    assert disagreeing(answers[1:], hardware) == {}  # two that differ: no majority


def test_peers_on_other_hardware_are_not_compared() -> None:
    pods = [pod("a", "n1"), pod("b", "n1"), pod("c", "n2")]
    digests = [("d0",), ("d0",), ("XX",)]
    answers = [
        answers_from_wire(p, DIGEST, verdict(digests=d)) for p, d in zip(pods, digests, strict=True)
    ]
    hardware = {"n1": Hardware("n1", gpu_product="H100"), "n2": Hardware("n2", gpu_product="A10")}
    assert disagreeing(answers, hardware) == {}


def test_a_node_where_pods_of_two_engines_failed_is_suspect() -> None:
    earlier = pod("earlier")
    record = {
        "pod": "earlier", "node": "node-1", "engineDigest": OTHER,
        "reason": "KnownAnswersFailed", "detected": "2026-12-02T11:00:00Z",
    }  # fmt: skip
    earlier["metadata"]["annotations"][names.ANNOTATION_WRONG_ANSWERS] = evidence_json(record)
    bad = pod("bad", gate="True")
    answers = [answers_from_wire(bad, DIGEST, verdict("failed"))]
    report = decide_answers(readings([bad], answers, taken_out=[earlier]), NOW)
    assert [r.pod for r in report.wrong_answers] == ["bad", "earlier"]
    assert report.suspect_nodes == ("node-1",)


def test_the_schedule_asks_new_pods_at_once_and_others_after_the_interval() -> None:
    fresh, old, starting = pod("fresh"), pod("old", gate="True"), pod("starting", ready=False)
    memory = AnswerMemory({"uid-old": 100.0})
    assert awaits_answer_check(fresh) and not awaits_answer_check(old)
    assert [p["metadata"]["name"] for p in due_pods([fresh, old, starting], memory, 30, 110)] == [
        "fresh"
    ]
    assert [p["metadata"]["name"] for p in due_pods([old], memory, 30, 130)] == ["old"]
    assert next_check_in_seconds([old, starting], memory, 30, 110) == 20
    assert next_check_in_seconds([fresh], memory, 30, 110) == 0  # never asked: now
    unanswered = AnswerMemory(unread={"uid-fresh": (110.0, 3)})  # 3 asks in a row: 20 s
    assert (
        due_pods([fresh], unanswered, 30, 129) == []
        and next_check_in_seconds([fresh], unanswered, 30, 110) == 20
    )


def test_hardware_is_read_from_the_node_labels() -> None:
    gpu = {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}
    assert hardware_of(gpu, "g").peer_key == "gpu:NVIDIA-H200"
    cpu = {"metadata": {"labels": {"kubernetes.io/arch": "amd64"}}}
    assert hardware_of(cpu, "c").cpu_model == "arch amd64"
    assert hardware_of(cpu, "c").peer_key == "node:c"  # no model named: only itself


def gates(cluster: Cluster) -> list[Any]:
    return cluster.get("Deployment")["spec"]["template"]["spec"].get("readinessGates", [])


def answers_condition(decided: Any) -> Any:
    (answered,) = [c for c in decided.status.conditions if c.type == "AnswersCorrect"]
    return answered


def test_the_checks_are_off_by_default_no_gate_no_read_and_the_condition_says_so() -> None:
    cluster = Cluster(make_spec())
    cluster.build_to_ready()
    assert gates(cluster) == []  # a pod is Ready on its own check at start, as before
    assert cluster.spec.known_answers is None
    good, bad = pod("good", gate="True"), pod("bad", gate="True")
    answers = [answers_from_wire(bad, DIGEST, verdict("failed"))]
    observed = replace(  # verdicts read anyway (they never are) change nothing
        as_gathered(cluster.observe(), T0), answers=readings([good, bad], answers, next_check=7.0)
    )
    decision = decide(observed, SETTINGS, T0)
    assert decision.answers is None and decision.status.wrong_answers == []
    assert "KnownAnswersFailed" not in {e.reason for e in decision.events}
    assert decision.requeue_after_seconds != 7.0
    assert "AnswersCorrect" not in {c.type for c in decision.status.conditions}


def test_known_answers_set_gates_the_serving_pods_and_unset_again_removes_the_gate() -> None:
    cluster = Cluster(make_spec(knownAnswers={}))
    cluster.build_to_ready()
    assert cluster.spec.known_answers is not None
    assert cluster.spec.known_answers.interval_seconds == 300
    assert gates(cluster) == [{"conditionType": GATE_CONDITION}]
    status = cluster.reconcile(T0).status  # no verdicts read in this table test: none said
    assert not [c for c in status.conditions if c.type == "AnswersCorrect"]
    good = pod("good", gate="True")
    observed = replace(
        as_gathered(cluster.observe(), T0),
        answers=readings([good], [answers_from_wire(good, DIGEST, verdict())]),
    )
    cluster.status = decide(observed, SETTINGS, T0).status
    assert answers_condition(cluster).reason == "AnswersCorrect"
    cluster.update_spec(make_spec())
    decision = cluster.reconcile(T0)
    assert gates(cluster) == []  # the pods roll, ungated
    assert "AnswersCorrect" not in {c.type for c in decision.status.conditions}


def test_decide_folds_the_verdicts_into_the_status_events_and_requeue() -> None:
    cluster = Cluster(make_spec(knownAnswers={}))
    cluster.build_to_ready()
    good, bad = pod("good", gate="True"), pod("bad", gate="True")
    answers = [
        answers_from_wire(good, DIGEST, verdict()),
        answers_from_wire(bad, DIGEST, verdict("failed")),
    ]
    observed = replace(
        as_gathered(cluster.observe(), T0), answers=readings([good, bad], answers, next_check=7.0)
    )
    decision = decide(observed, SETTINGS, T0)
    (answered,) = [c for c in decision.status.conditions if c.type == "AnswersCorrect"]
    assert (answered.status, answered.reason) == ("False", "KnownAnswersFailed")
    assert [r.pod for r in decision.status.wrong_answers] == ["bad"]
    assert "KnownAnswersFailed" in {e.reason for e in decision.events}
    assert decision.answers is not None and decision.answers.take_out[0].record.pod == "bad"
    assert decision.requeue_after_seconds == 7.0


def held_off_pod(name: str, gate: str | None = None) -> Any:
    """A pod whose runtime runs but is not ready (its check at start failed)."""
    held = pod(name, gate=gate, ready=False)
    held["status"]["containerStatuses"] = [{"name": "runtime", "state": {"running": {}}}]
    return held


def at_start_failure(held: Any) -> PodAnswers:
    body = verdict("failed")  # as the runtime says it: its run at start is its latest too
    body["servingAllowed"] = False
    return answers_from_wire(held, DIGEST, body, at_start=True)


def test_a_pod_that_failed_at_start_is_named_gated_false_once_and_not_taken_out() -> None:
    good, held = pod("good", gate="True"), held_off_pod("held")
    answers = [answers_from_wire(good, DIGEST, verdict()), at_start_failure(held)]
    assert answers[1].at_start and not answers[0].at_start
    report = decide_answers(readings([good, held], answers), NOW)
    assert report.take_out == (), "never ready: nothing to take out of serving"
    assert [(g.pod["metadata"]["name"], g.correct) for g in report.gates] == [("held", False)]
    (record,) = report.wrong_answers
    assert (record.pod, record.node, record.engine_digest) == ("held", "node-1", DIGEST)
    assert record.message.startswith("at start, never ready: ")
    assert report.condition is not None
    assert report.condition[:2] == (ConditionStatus.FALSE, Reason.KNOWN_ANSWERS_FAILED)
    ((noticed, event),) = [(t.pod, t.event) for t in report.held_off]
    assert noticed is held and "at start" in event.message and "node-1" in event.message
    assert [e.message for e in report.events] == [event.message]
    # Its gate False already (a later pass): still named, no Event again.
    again = held_off_pod("held", gate="False")
    report = decide_answers(readings([good, again], answers), NOW)
    assert report.gates == () and report.held_off == () and report.events == ()
    assert [r.pod for r in report.wrong_answers] == ["held"]


def test_held_off_pods_are_read_apart_from_the_checks_schedule() -> None:
    from kubeinfer.operator.state.known_answers import UNREAD_RETRY_SECONDS, held_off_due

    loading, ready = held_off_pod("loading"), pod("ready")
    ready["status"]["containerStatuses"] = [{"name": "runtime", "state": {"running": {}}}]
    memory = AnswerMemory()
    assert held_off_due([loading, ready], memory, 100.0) == [loading]
    read_once = AnswerMemory(held_off_read_at_seconds={"uid-loading": 100.0})
    assert held_off_due([loading], read_once, 100.0 + UNREAD_RETRY_SECONDS / 2) == []
    assert held_off_due([loading], read_once, 100.0 + UNREAD_RETRY_SECONDS) == [loading]
    known = AnswerMemory(answers={"uid-loading": at_start_failure(loading)})
    assert held_off_due([loading], known, 1e9) == [], "a failure at start is for good"
    # Read while it loaded, then ready: checked at once, no backoff carried over.
    now_ready = pod("loading")
    assert due_pods([now_ready], read_once, 300, 101.0) == [now_ready]
    assert next_check_in_seconds([loading], read_once, 300, 102.0) == UNREAD_RETRY_SECONDS - 2
