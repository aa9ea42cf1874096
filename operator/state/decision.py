"""What one reconcile pass decides: a plain frozen value.

`decide` (pure) returns a `Decision`; `apply` (I/O) carries it out. Children are plain
Kubernetes object dicts, exactly as they are server-side applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus
from kubeinfer.operator.state.events import Event
from kubeinfer.operator.state.known_answers import AnswersReport
from kubeinfer.operator.state.observed import KubeObject
from kubeinfer.operator.state.scaling_inputs import ScalingHistory


@dataclass(frozen=True)
class Decision:
    """The outcome of one pass: the children to write (applied as given, with field
    manager `kubeinfer`: only those missing or changed, so an unchanged object gets no
    write), children to delete (kind, name), the new status and the events to emit.
    `requeue_after_seconds` asks for another pass (e.g. build backoff)."""

    apply: tuple[KubeObject, ...] = ()
    delete: tuple[tuple[str, str], ...] = ()
    status: InferenceDeploymentStatus = field(default_factory=InferenceDeploymentStatus)
    events: tuple[Event, ...] = ()
    requeue_after_seconds: float | None = None
    desired: tuple[KubeObject, ...] = ()
    """Every child that should exist, written or not (`apply` is the subset that is
    missing or whose input-hash annotation differs from the observed one)."""
    scaling_history: ScalingHistory | None = None
    """The autoscaler's memory to keep for the next pass (None: autoscaling is off)."""
    answers: AnswersReport | None = None
    """The serving pods' readiness gates to set and the pods to take out of serving for
    wrong answers (None: no known-answer verdicts were read this pass)."""
    activator_route: dict[str, Any] | None = None
    """The object's entry in the activator's route table (None: minReplicas above 0, no
    entry), which the controller keeps in the table's ConfigMap."""


__all__ = ["Decision", "Event"]
