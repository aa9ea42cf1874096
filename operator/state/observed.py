"""What one reconcile pass starts from: the observed state, a plain frozen value.

`gather` (I/O) fills an `ObservedState`; `decide` (pure) returns a `Decision`
(`state.decision`); `apply` (I/O) carries it out. Children are plain Kubernetes object
dicts, exactly as the API server returns them. The InferenceDeployment's own body is
read here too: which object it is (`owner_ref_from_body`) and its stored status
(`stored_status`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec, InferenceDeploymentStatus
from kubeinfer.operator.settings import Cost
from kubeinfer.operator.state.cost_readings import CostHistory, CostReading
from kubeinfer.operator.state.gpu_nodes import GpuNode
from kubeinfer.operator.state.known_answers import AnswerReadings
from kubeinfer.operator.state.quality_readings import QualityHistory, QualityReading
from kubeinfer.operator.state.scaling_inputs import (
    ScalingHistory,
    ScalingSignals,
    ServingPods,
    WakeSignals,
)
from kubeinfer.operator.state.shadow_readings import ShadowReading
from pydantic import ValidationError

KubeObject = dict[str, Any]
"""An API object as the API server sends it (JSON decoded): what the operator reads and
writes. The one definition; the client and every decision use it."""


@dataclass(frozen=True)
class OwnerRef:
    """The InferenceDeployment being reconciled."""

    name: str
    namespace: str
    uid: str
    generation: int


@dataclass(frozen=True)
class ObservedState:
    """Everything the decision may look at. Children are those owned by the
    InferenceDeployment (by ownerReference), found through their labels."""

    owner: OwnerRef
    spec: InferenceDeploymentSpec
    status: InferenceDeploymentStatus
    pvc: KubeObject | None = None
    configmap: KubeObject | None = None
    deployment: KubeObject | None = None
    service: KubeObject | None = None
    jobs: tuple[KubeObject, ...] = ()
    job_pods: tuple[KubeObject, ...] = ()
    """Pods of the build Jobs, where the build's digest is read from the termination
    message."""
    candidate_configmap: KubeObject | None = None
    candidate_deployment: KubeObject | None = None
    candidate_service: KubeObject | None = None
    """The shadow candidate's children, when one runs."""
    mirror_configmap: KubeObject | None = None
    """The serving pods' mirror target (a ConfigMap of its own, so changing it rolls
    nothing)."""
    reference_configmap: KubeObject | None = None
    reference_deployment: KubeObject | None = None
    reference_service: KubeObject | None = None
    """The quality watch's reference runtime (its own children, like the candidate's)."""
    backend_service: KubeObject | None = None
    activator_slice: KubeObject | None = None
    """With autoscaling.minReplicas 0: the Service the activator forwards to, and the
    EndpointSlice that points the object's Service at the activator while at zero."""
    service_slices: tuple[KubeObject, ...] = ()
    """With autoscaling.minReplicas 0: the EndpointSlice controller's slices of the
    object's Service, which it leaves as they are once the Service has no selector."""
    annotations: dict[str, str] = field(default_factory=dict)
    """The InferenceDeployment's annotations (the shadow's manual gate is one)."""
    shadow: ShadowReading | None = None
    """The running candidate's aggregates, read by the gather step when the stored status
    says a shadow is Pending; None when nothing was read."""
    scaling_signals: ScalingSignals | None = None
    """The load, read when autoscaling is enabled and the serving Deployment exists."""
    serving_pods: ServingPods | None = None
    """The serving Deployment's pods, counted when autoscaling is enabled."""
    runtime_pods: tuple[KubeObject, ...] = ()
    """The serving Deployment's pods as listed, with their container statuses (where a
    runtime that cannot start says why); listed only while the Deployment is not settled
    (a pod not ready, not updated, or one too many) or autoscaling counts them."""
    candidate_pods: tuple[KubeObject, ...] = ()
    """The shadow candidate's pods, listed only while its Deployment is not settled."""
    scaling_history: ScalingHistory = field(default_factory=ScalingHistory)
    """The autoscaler's memory of this object (kept by the reconciler between passes)."""
    wake_signals: WakeSignals | None = None
    """With autoscaling.minReplicas 0: what keeps the object from zero or wakes it."""
    quality: QualityReading | None = None
    """The quality watch's window of tallies, read by the gather step while the serving
    pods mirror to the reference; None when nothing was read."""
    quality_history: QualityHistory = field(default_factory=QualityHistory)
    """The direct read's past counts for the watch's window (kept by the reconciler
    between passes; empty with Prometheus, which keeps its own)."""
    pod_monitor: KubeObject | None = None
    """The PodMonitor the operator created, if any."""
    disruption_budget: KubeObject | None = None
    """The serving pods' PodDisruptionBudget, if it exists."""
    pod_monitors_available: bool = False
    """Whether the cluster serves monitoring.coreos.com/v1 PodMonitors (and the operator's
    settings allow creating them)."""
    product_configmaps: tuple[KubeObject, ...] = ()
    product_deployments: tuple[KubeObject, ...] = ()
    """A mixed GPU fleet's runtime ConfigMaps and Deployments, one per GPU product
    (labelled `kubeinfer.io/gpu-product`)."""
    answers: AnswerReadings | None = None
    """The serving pods' known-answer verdicts and their nodes' hardware (read by the
    controller on its schedule); None when not read."""
    gpu_nodes: tuple[GpuNode, ...] | None = None
    """The cluster's GPU nodes, read for an object on a mixed GPU fleet; None when not
    read (the object runs one engine)."""
    cost_settings: Cost | None = None
    """The operator's prices per node-hour and the cost's window (`settings.cost`), where
    they price any node; None: no cost is computed."""
    cost: CostReading | None = None
    """The inferences the priced serving pods answered over the cost's window, read when
    the figure is due; None when not read."""
    cost_history: CostHistory = field(default_factory=CostHistory)
    """The serving pods of the cost's window, this pass' among them, and a direct read's
    earlier counts (kept by the reconciler between passes, returned updated)."""


def owner_ref_from_body(body: dict[str, Any]) -> OwnerRef:
    """The InferenceDeployment an API body is (the object the pass reconciles)."""
    meta = body["metadata"]
    return OwnerRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 1),
    )


def stored_status(body: dict[str, Any]) -> InferenceDeploymentStatus:
    """The status as stored; a status the model cannot read (written by hand, or by an
    older operator) counts as empty and is rewritten in full."""
    try:
        return InferenceDeploymentStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return InferenceDeploymentStatus()
