"""How far the observed serving Deployment is from the desired one. Pure.

The status reads it (Ready, Available, a stalled rollout), and `decide` tells from it
when the roll to a promoted engine is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.reconcile.child_meta import input_hash
from kubeinfer.operator.state.observed import KubeObject


@dataclass(frozen=True)
class RolloutProgress:
    """How far the observed Deployment is from the desired one."""

    exists: bool
    complete: bool
    available: bool
    """At least one pod is available: something serves."""
    stalled: bool
    ready_replicas: int
    message: str
    replacing: bool = False
    """The Deployment's template is rolled out (its controller says its new ReplicaSet
    was available) and some of its pods are not ready: pods lost with a node or a drain
    and started again elsewhere, or a scale-up's new pods starting; nothing rolls."""


def rollout_progress(
    observed: KubeObject | None,
    desired: KubeObject | None,
    replicas: int,
    on_demand: bool = False,
) -> RolloutProgress:
    """Complete means: the observed Deployment is the desired one (same input hash), its
    controller has seen that generation, and all `replicas` pods are updated, ready and
    available with no old pod left.

    Available means a pod serves, or, `on_demand` (autoscaling.minReplicas 0), the
    Deployment is at zero pods: the activator holds the object's requests and starts one
    (the zero step goes to zero only with the activator routing it, and the Service is
    switched to it before the pods are removed), so pods still leaving keep nothing from
    complete either.

    A Deployment this pass creates (`observed` None, `desired` not) reads as it will once
    created, with nothing counted yet: the status is written only after the pass's
    children are, so it is there by then. The message names the updated pods only while
    old ones are left, so the pass that sees the new Deployment appear and the passes
    that see its controller count its first pods compute the same status and write none:
    an InferenceDeployment's status write is among the API server's costliest requests."""
    if desired is None:
        return RolloutProgress(False, False, False, False, 0, "the Deployment does not exist yet")
    if observed is None:
        observed = {"metadata": desired["metadata"], "status": {}}
    name = observed["metadata"]["name"]
    status: dict[str, Any] = observed.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    available_count = int(status.get("availableReplicas") or 0)
    total = int(status.get("replicas") or 0)
    generation = observed["metadata"].get("generation")
    seen = generation is None or int(status.get("observedGeneration") or 0) >= int(generation)
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    progressing = conditions.get("Progressing") or {}
    stalled = progressing.get("reason") == "ProgressDeadlineExceeded"
    complete = (
        input_hash(observed) == input_hash(desired)
        and seen
        and updated >= replicas
        and ready >= replicas
        and available_count >= replicas
        and (total == replicas or (on_demand and replicas == 0))
    )
    if total > updated:
        message = f"Deployment {name}: {updated} of {replicas} pods updated, {ready} ready"
    else:
        message = f"Deployment {name}: {ready} of {replicas} pods ready"
    if stalled:
        message += f"; {progressing.get('message') or 'progress deadline exceeded'}"
    # Any available pod serves. Not the Deployment's Available condition: with the roll's
    # maxUnavailable 0 it is False as soon as one pod is missing (a node lost, a drain),
    # while the others go on serving.
    rolled_out = (
        input_hash(observed) == input_hash(desired)
        and seen
        and progressing.get("reason") == "NewReplicaSetAvailable"
    )
    replacing = rolled_out and not complete and not stalled
    serves = available_count > 0 or (on_demand and complete and replicas == 0)
    return RolloutProgress(True, complete, serves, stalled, ready, message, replacing=replacing)


def available(deployment: KubeObject | None) -> bool:
    """Has the Deployment at least one available pod?"""
    return int(((deployment or {}).get("status") or {}).get("availableReplicas") or 0) > 0
