"""Every child the observed state holds can be deleted by a pass: `kube.apply` deletes only
the (kind, name) it finds in `observed_children`, so a slot missing there makes every
deletion a decision asks of it silently do nothing (the quality watch's reference runtime
and a mixed fleet's retired product Deployments stayed, before they were listed). The
test fills each child slot of ObservedState and checks `observed_children` lists it; the
pods, which the operator never deletes, are the only slots left out, by name."""

from __future__ import annotations

import dataclasses
import typing

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec, InferenceDeploymentStatus
from kubeinfer.operator.kube.apply import observed_children
from kubeinfer.operator.state.observed import ObservedState, OwnerRef

NOT_DELETED = {"job_pods", "runtime_pods", "candidate_pods"}
"""Pods: the Deployments and Jobs own them, the operator deletes none."""


def _child_slots() -> list[tuple[str, bool]]:
    """(field, holds a tuple) of every ObservedState field typed as Kubernetes objects."""
    hints = typing.get_type_hints(ObservedState)
    slots = []
    for field in dataclasses.fields(ObservedState):
        hint = str(hints[field.name])
        if "dict[str, typing.Any]" in hint and field.name != "annotations":
            slots.append((field.name, hint.startswith("tuple")))
    return slots


def test_every_child_slot_is_deletable():
    slots = _child_slots()
    assert len(slots) > 15, "the slots were found by their type"
    filled = {
        name: ({"metadata": {"name": name}},) if many else {"metadata": {"name": name}}
        for name, many in slots
    }
    spec = InferenceDeploymentSpec.model_validate(
        {
            "model": {
                "name": "m",
                "version": "1",
                "source": {"uri": "https://models.example.com/m.onnx", "sha256": "c" * 64},
            }
        }
    )
    observed = ObservedState(
        owner=OwnerRef("o", "ns", "uid", 1),
        spec=spec,
        status=InferenceDeploymentStatus(),
        **filled,
    )
    deletable = {name for _, name in observed_children(observed)}
    assert {name for name, _ in slots} - NOT_DELETED - deletable == set()
