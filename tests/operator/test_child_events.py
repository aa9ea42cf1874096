"""Which children's watch events ask for a pass (`kube.child_events`): every event but a
healthy runtime pod's and a disruption budget's status write."""

from __future__ import annotations

from kubeinfer.operator.kube.child_events import ChildEvents
from kubeinfer.operator.state import names

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


def test_every_event_of_a_build_pod_asks():
    events = ChildEvents()
    for event_type in ("ADDED", "MODIFIED", "DELETED"):
        assert events.asks_for_pass("pods", event_type, BUILD_LABELS, pod(BUILD_LABELS))


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
    for plural in ("jobs", "deployments", "configmaps", "services", "persistentvolumeclaims"):
        body = {"metadata": {"namespace": "ns", "name": "x", "generation": 1}, "status": {}}
        assert events.asks_for_pass(plural, "MODIFIED", RUNTIME_LABELS, body)
        assert events.asks_for_pass(plural, "MODIFIED", RUNTIME_LABELS, body), "the same again"
