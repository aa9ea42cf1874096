"""Which events on an InferenceDeployment ask for a pass (`kube.owner_events`): its first
sight, a new generation, labels or annotations (`kubeinfer promote` writes one), the
start of its deletion and its deletion; not the operator's own status writes coming back,
nor a resourceVersion that moved for nothing a pass reads.
"""

from __future__ import annotations

import copy
from typing import Any

from kubeinfer.operator.kube.owner_events import OwnerEvents

OWNER: dict[str, Any] = {
    "apiVersion": "kubeinfer.io/v1alpha1",
    "kind": "InferenceDeployment",
    "metadata": {
        "name": "m",
        "namespace": "n",
        "uid": "5c1d0e2a",
        "generation": 1,
        "resourceVersion": "10",
        "labels": {"team": "search"},
        "annotations": {"note": "a"},
    },
    "spec": {"runtime": {"replicas": 2}},
}


def changed(body: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    new = copy.deepcopy(body)
    new["metadata"].update(metadata)
    new["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
    return new


def test_the_first_sight_asks_and_the_same_object_again_does_not() -> None:
    events = OwnerEvents()
    assert events.asks_for_pass(None, OWNER)  # the watch's first listing (a restart)
    assert not events.asks_for_pass("MODIFIED", OWNER)
    assert OwnerEvents().asks_for_pass("ADDED", OWNER)


def test_a_status_write_coming_back_asks_for_nothing() -> None:
    events = OwnerEvents()
    events.asks_for_pass("ADDED", OWNER)
    written = changed(OWNER)
    written["status"] = {"observedGeneration": 1, "conditions": [{"type": "Ready"}]}
    assert not events.asks_for_pass("MODIFIED", written)


def test_a_new_generation_labels_or_annotations_ask() -> None:
    events = OwnerEvents()
    events.asks_for_pass("ADDED", OWNER)
    spec = changed(OWNER, generation=2)
    assert events.asks_for_pass("MODIFIED", spec)
    labels = changed(spec, labels={"team": "ads"})
    assert events.asks_for_pass("MODIFIED", labels)
    promote = changed(labels, annotations={"note": "a", "kubeinfer.io/promote": "sha256:1"})
    assert events.asks_for_pass("MODIFIED", promote)
    assert not events.asks_for_pass("MODIFIED", changed(promote))


def test_deletion_asks_when_it_starts_and_when_the_object_is_gone() -> None:
    events = OwnerEvents()
    events.asks_for_pass("ADDED", OWNER)
    deleting = changed(OWNER, deletionTimestamp="2026-11-27T14:00:00Z")
    assert events.asks_for_pass("MODIFIED", deleting)
    assert events.asks_for_pass("DELETED", deleting)
    assert len(events) == 0  # nothing kept for an object that is gone
    assert events.asks_for_pass("ADDED", OWNER)  # created again under the same name


def test_objects_are_told_apart_by_namespace_and_name() -> None:
    events = OwnerEvents()
    events.asks_for_pass("ADDED", OWNER)
    other = copy.deepcopy(OWNER)
    other["metadata"]["namespace"] = "other"
    assert events.asks_for_pass("ADDED", other)
    assert len(events) == 2


def test_an_object_made_again_under_its_name_asks_even_with_its_deletion_missed() -> None:
    events = OwnerEvents()
    events.asks_for_pass("ADDED", OWNER)
    # A watch that broke over the deletion lists the new object: same name, metadata and
    # generation, another uid; no DELETED came between.
    again = changed(OWNER, uid="9f3b7c61")
    assert events.asks_for_pass(None, again)
