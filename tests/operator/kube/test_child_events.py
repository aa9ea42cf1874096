"""Which children's watch events ask for a pass (`kube.child_events`): every event but a
healthy runtime pod's, a build's before it has finished and a disruption budget's status
write."""

from __future__ import annotations

from kubeinfer.operator.kube.child_events import ChildEvents
from kubeinfer.operator.state import names
from kubeinfer.operator.state.known_answers import GATE_CONDITION

RUNTIME_LABELS = {names.LABEL_INSTANCE: "resnet", names.LABEL_ROLE: names.ROLE_SERVING}
BUILD_LABELS = {names.LABEL_INSTANCE: "resnet", names.LABEL_COMPONENT: names.COMPONENT_BUILD}


def pod(labels: dict[str, str], runtime: dict | None = None) -> dict:
    statuses = [{"name": "runtime", **runtime}] if runtime is not None else []
    return {"metadata": {"namespace": "ns", "name": "p", "labels": labels},
            "status": {"containerStatuses": statuses}}  # fmt: skip


def budget(generation: int, labels: dict[str, str] | None = None, healthy: int = 0) -> dict:
    return {"metadata": {"namespace": "ns", "name": "resnet-runtime", "uid": "u",
                         "generation": generation, "labels": labels or {}},
            "status": {"currentHealthy": healthy}}  # fmt: skip


def test_a_runtime_pod_asks_only_when_it_fails_or_goes():
    events = ChildEvents()
    creating = {"waiting": {"reason": "ContainerCreating"}}
    starting = pod(RUNTIME_LABELS, {"ready": False, "state": creating})
    ready = pod(RUNTIME_LABELS, {"ready": True, "state": {"running": {}}})
    crash_loop = {"waiting": {"reason": "CrashLoopBackOff"}}
    crashed = pod(RUNTIME_LABELS, {"ready": False, "restartCount": 1, "state": crash_loop,
                                   "lastState": {"terminated": {"exitCode": 3}}})  # fmt: skip
    pull = {"waiting": {"reason": "ImagePullBackOff"}}
    pulling = pod(RUNTIME_LABELS, {"ready": False, "state": pull})
    assert not events.asks_for_pass("pods", "ADDED", RUNTIME_LABELS, pod(RUNTIME_LABELS))
    assert not events.asks_for_pass("pods", "MODIFIED", RUNTIME_LABELS, starting)
    assert not events.asks_for_pass("pods", "MODIFIED", RUNTIME_LABELS, ready)
    assert events.asks_for_pass("pods", "MODIFIED", RUNTIME_LABELS, crashed)
    assert events.asks_for_pass("pods", "MODIFIED", RUNTIME_LABELS, pulling)
    assert events.asks_for_pass("pods", "DELETED", RUNTIME_LABELS, ready)


def build_pod(state: dict) -> dict:
    statuses = [{"name": "build", "ready": False, "state": state}]
    return {"metadata": {"namespace": "ns", "name": "b", "labels": BUILD_LABELS},
            "status": {"containerStatuses": statuses}}  # fmt: skip


def test_a_build_pod_asks_once_its_build_has_terminated_or_it_goes():
    events = ChildEvents()
    running = build_pod({"running": {}})
    done = build_pod({"terminated": {"exitCode": 0, "message": '{"digest": "sha256:ab"}'}})
    assert not events.asks_for_pass("pods", "ADDED", BUILD_LABELS, pod(BUILD_LABELS))
    assert not events.asks_for_pass("pods", "MODIFIED", BUILD_LABELS, running)
    assert events.asks_for_pass("pods", "MODIFIED", BUILD_LABELS, done)
    assert events.asks_for_pass("pods", "DELETED", BUILD_LABELS, running)
    assert events.asks_for_pass("pods", None, BUILD_LABELS, running)  # the first listing


def job(*conditions: str) -> dict:
    found = [{"type": c, "status": "True"} for c in conditions]
    return {"metadata": {"namespace": "ns", "name": "j", "labels": BUILD_LABELS},
            "status": {"active": 1, "conditions": found}}  # fmt: skip


def test_a_build_job_asks_once_it_has_finished_or_it_goes():
    events = ChildEvents()
    assert not events.asks_for_pass("jobs", "ADDED", BUILD_LABELS, job())
    assert not events.asks_for_pass("jobs", "MODIFIED", BUILD_LABELS, job())
    for end in ("Complete", "Failed"):
        assert events.asks_for_pass("jobs", "MODIFIED", BUILD_LABELS, job(end))
    assert events.asks_for_pass("jobs", "DELETED", BUILD_LABELS, job())
    assert events.asks_for_pass("jobs", None, BUILD_LABELS, job())


def test_a_budget_asks_for_its_spec_labels_and_deletion_not_its_status():
    events = ChildEvents()
    labels = {names.LABEL_INSTANCE: "resnet"}
    assert events.asks_for_pass("poddisruptionbudgets", "ADDED", labels, budget(1))
    recounted = budget(1, healthy=2)
    assert not events.asks_for_pass("poddisruptionbudgets", "MODIFIED", labels, recounted)
    assert events.asks_for_pass("poddisruptionbudgets", "MODIFIED", labels, budget(2, healthy=2))
    edited = budget(2, {"team": "a"}, healthy=2)
    assert events.asks_for_pass("poddisruptionbudgets", "MODIFIED", labels, edited)
    assert events.asks_for_pass("poddisruptionbudgets", "DELETED", labels, edited)


def test_every_event_of_the_other_kinds_asks():
    events = ChildEvents()
    for plural in ("deployments", "configmaps", "services", "persistentvolumeclaims"):
        body = {"metadata": {"namespace": "ns", "name": "x", "generation": 1}, "status": {}}
        assert events.asks_for_pass(plural, "MODIFIED", RUNTIME_LABELS, body)
        assert events.asks_for_pass(plural, "MODIFIED", RUNTIME_LABELS, body), "the same again"


def test_a_gated_runtime_pod_asks_once_its_containers_are_ready_until_its_gate_is_set():
    events = ChildEvents()
    gated = pod(RUNTIME_LABELS, {"ready": True, "state": {"running": {}}})
    gated["spec"] = {"readinessGates": [{"conditionType": GATE_CONDITION}]}
    gated["status"] |= {"podIP": "10.0.0.9",
                        "conditions": [{"type": "ContainersReady", "status": "True"}]}  # fmt: skip
    assert events.asks_for_pass("pods", "MODIFIED", RUNTIME_LABELS, gated)
    gated["status"]["conditions"].append({"type": GATE_CONDITION, "status": "True"})
    assert not events.asks_for_pass("pods", "MODIFIED", RUNTIME_LABELS, gated)
