"""Which desired children a pass must write: those missing, and those whose observed copy
no longer carries every field the operator owns on them. Pure."""

from __future__ import annotations

from kubeinfer.operator.reconcile.drift import carries
from kubeinfer.operator.state.observed import KubeObject, ObservedState


def _observed_child(observed: ObservedState, kind: str, name: str) -> KubeObject | None:
    candidates: tuple[KubeObject | None, ...]
    candidates = {
        "PersistentVolumeClaim": (observed.pvc,),
        "ConfigMap": (
            observed.configmap,
            observed.candidate_configmap,
            observed.mirror_configmap,
            *observed.product_configmaps,
        ),
        "Deployment": (
            observed.deployment,
            observed.candidate_deployment,
            *observed.product_deployments,
        ),
        "Service": (observed.service, observed.candidate_service, observed.backend_service),
        "EndpointSlice": (observed.activator_slice,),
        "PodMonitor": (observed.pod_monitor,),
        "PodDisruptionBudget": (observed.disruption_budget,),
        "Job": observed.jobs,
    }.get(kind, ())
    for child in candidates:
        if child and (child.get("metadata") or {}).get("name") == name:
            return child
    return None


CREATE_ONLY = frozenset({"Job", "PersistentVolumeClaim"})
"""Kinds written only when missing. A Job's pod template is immutable, and a change
outside the engine inputs (resources, image, tolerations) must not disturb a build under
way: the next attempt, if any, is created from the new spec. A claim's class and access
modes are immutable and its size may only grow, so re-applying a changed cache spec would
be refused on every pass: the claim is created once and resized on the claim itself."""


def needs_write(child: KubeObject, observed: ObservedState) -> bool:
    """A desired child must be applied when it is missing, or (unless created only) when
    the observed one lacks or changed a field the operator owns on it. apiVersion and
    kind are not compared: the child was found by them, and the items of a list the API
    server answers carry neither."""
    existing = _observed_child(observed, child["kind"], child["metadata"]["name"])
    if existing is None:
        return True
    owned = {key: value for key, value in child.items() if key not in ("apiVersion", "kind")}
    return child["kind"] not in CREATE_ONLY and not carries(existing, owned)
