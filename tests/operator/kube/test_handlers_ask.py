"""The watch handlers `handlers.register` adds consult `OwnerEvents` and `ChildEvents`:
called as kopf calls them, an event that carries nothing a pass reads asks the reconciler
for nothing, and the others ask for a pass over the right object. (The two classes are
tested on their own in test_owner_events.py and test_child_events.py; this is what fails
if a handler stops asking them.)"""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest
from kubeinfer.operator import handlers
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names

RUNTIME_LABELS = {
    names.LABEL_MANAGED_BY: names.MANAGED_BY,
    names.LABEL_INSTANCE: "resnet",
    names.LABEL_ROLE: names.ROLE_SERVING,
}
BUILD_LABELS = {
    names.LABEL_MANAGED_BY: names.MANAGED_BY,
    names.LABEL_INSTANCE: "resnet",
    names.LABEL_COMPONENT: names.COMPONENT_BUILD,
}


@pytest.fixture
def wired() -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The registered watch handlers by id, and the passes they asked for."""
    registry = kopf.OperatorRegistry()
    context = handlers.register(registry, OperatorSettings())
    asked: list[tuple[str, str]] = []
    context.reconciler.trigger = lambda namespace, name, *_: asked.append((namespace, name))
    by_id = {handler.id: handler.fn for handler in registry._watching.get_all_handlers()}
    return by_id, asked


def pod(labels: dict[str, str], ready: bool) -> dict[str, Any]:
    state = {"running": {}} if ready else {"waiting": {"reason": "ContainerCreating"}}
    status = {"containerStatuses": [{"name": "runtime", "ready": ready, "state": state}]}
    return {"metadata": {"namespace": "ns", "name": "p", "labels": labels}, "status": status}


async def child_event(
    wired: tuple[dict[str, Any], list[tuple[str, str]]],
    plural: str,
    event_type: str,
    body: dict[str, Any],
) -> list[tuple[str, str]]:
    by_id, asked = wired
    group, version = ("policy", "v1") if plural == "poddisruptionbudgets" else ("", "v1")
    before = len(asked)
    await by_id[f"reconcile_owner_of_{plural}"](
        resource=kopf.Resource(group, version, plural),
        type=event_type,
        namespace="ns",
        labels=body["metadata"]["labels"],
        body=body,
    )
    return asked[before:]


async def test_a_healthy_runtime_pod_asks_for_nothing_and_a_finished_build_asks(wired) -> None:
    assert await child_event(wired, "pods", "MODIFIED", pod(RUNTIME_LABELS, True)) == []
    assert await child_event(wired, "pods", "MODIFIED", pod(RUNTIME_LABELS, False)) == []
    assert await child_event(wired, "pods", "DELETED", pod(RUNTIME_LABELS, True)) == [
        ("ns", "resnet")
    ]
    built = pod(BUILD_LABELS, False)
    built["status"]["containerStatuses"] = [
        {"name": "build", "state": {"terminated": {"exitCode": 0, "message": "{}"}}}
    ]
    assert await child_event(wired, "pods", "MODIFIED", built) == [("ns", "resnet")]


async def test_a_budget_asks_once_for_the_same_spec(wired) -> None:
    labels = {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_INSTANCE: "resnet"}
    budget = {"metadata": {"namespace": "ns", "name": "resnet-runtime", "uid": "u",
                           "generation": 1, "labels": labels}, "status": {}}  # fmt: skip
    recounted = copy.deepcopy(budget)
    recounted["status"] = {"currentHealthy": 2}
    assert await child_event(wired, "poddisruptionbudgets", "ADDED", budget) == [("ns", "resnet")]
    assert await child_event(wired, "poddisruptionbudgets", "MODIFIED", recounted) == []


async def test_the_owners_own_status_write_asks_for_nothing(wired) -> None:
    by_id, asked = wired
    owner = {"metadata": {"namespace": "ns", "name": "resnet", "uid": "u", "generation": 1,
                          "resourceVersion": "10"}, "spec": {}}  # fmt: skip
    written = copy.deepcopy(owner)
    written["metadata"]["resourceVersion"] = "11"
    written["status"] = {"phase": "Building"}
    edited = copy.deepcopy(written)
    edited["metadata"].update(generation=2, resourceVersion="12")
    for body in (owner, written, edited):
        await by_id["reconcile"](type="MODIFIED", namespace="ns", name="resnet", body=body)
    assert asked == [("ns", "resnet"), ("ns", "resnet")]
