"""What one pass's decision reads beyond the objects themselves, declared once. Pure.

The gather step (`kube.gather`) reads exactly what `signals_to_read` names, from the
children it has just read; `decide` looks at a signal only where this names it (the
table tests hand it, in place of each signal not named, a value that fails the test when
touched: `tests/operator/reconcile/test_decide_reads.py`). Each is read only when the
decision uses it, so an object without a shadow, without autoscaling, without
PodMonitors and whose Deployments are settled costs no request beyond its children:

- the shadow candidate's aggregates, while the stored status says a candidate is Pending
  (`rollout.shadow.metrics_query`);
- the runtime pods (the serving Deployment's, or a fleet's), listed while a runtime
  Deployment has not settled (a pod that cannot start says why in its container
  statuses) or the autoscaler counts them; the candidate's while its Deployment has not
  settled;
- the serving pods as the autoscaler counts them, with its memory of the object, while
  autoscaling is on and a runtime Deployment exists;
- the load (the scaling signals), for the autoscaler or the latency objective, once a
  runtime Deployment exists;
- the quality watch's window of tallies, once the reference engine exists and the watch
  has begun on the engine serving (`quality.report.window_to_read`);
- the cluster's GPU nodes, for an object on a mixed GPU fleet;
- the PodMonitor, where the cluster serves PodMonitors and the settings allow them;
- while the settings price nodes (`cost.pricePerNodeHour`) and a runtime Deployment
  exists, the serving pods and the nodes they run on at every pass, and once the stored
  cost is `cost.refreshSeconds` old the inferences they answered over the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.inference_deployment import in_fleet_mode
from kubeinfer.operator.quality.report import window_to_read
from kubeinfer.operator.rollout.shadow import ShadowQuery, metrics_query
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import KubeObject, ObservedState
from kubeinfer.operator.state.runtime_failures import unsettled


@dataclass(frozen=True)
class QualityWindow:
    """The quality watch's tallies to read: against this reference engine, over the last
    `seconds`."""

    reference_digest: str
    seconds: int


@dataclass(frozen=True)
class CostRead:
    """The cost's reads: the serving pods and the nodes at every pass (the pods of the
    window are remembered), and the inferences over `window_seconds` when the figure is due
    (`cost.refreshSeconds` after the stored one)."""

    window_seconds: int
    inferences: bool


@dataclass(frozen=True)
class Reads:
    """The signals one pass reads beyond the objects (see the module's docstring); what
    is not named stays as `ObservedState` has it by default: nothing read."""

    shadow: ShadowQuery | None = None
    runtime_pods: bool = False
    candidate_pods: bool = False
    serving_pods: bool = False
    """The serving pods counted, and the autoscaler's memory (`scaling_history`)."""
    scaling_signals: bool = False
    wake_signals: bool = False
    """With autoscaling.minReplicas 0: the request counter, the activator's view of the
    object and, at zero, the wake query (`wake_signals`)."""
    quality: QualityWindow | None = None
    """The window's tallies (`quality`), with the direct read's past counts
    (`quality_history`)."""
    gpu_nodes: bool = False
    pod_monitor: bool = False
    answers: bool = False
    """The serving pods' known answers (`answers`): the pods listed, those due asked, by
    the controller, which keeps their schedule."""
    cost: CostRead | None = None
    """While the settings price nodes: the serving pods' runs, with the cost's memory of
    the window (`cost_history`), and when due the inferences (`cost`)."""


SIGNALS: dict[str, tuple[str, ...]] = {
    "shadow": ("shadow",),
    "runtime_pods": ("runtime_pods",),
    "candidate_pods": ("candidate_pods",),
    "serving_pods": ("serving_pods", "scaling_history"),
    "scaling_signals": ("scaling_signals",),
    "wake_signals": ("wake_signals",),
    "quality": ("quality", "quality_history"),
    "gpu_nodes": ("gpu_nodes",),
    "pod_monitor": ("pod_monitor",),
    "answers": ("answers",),
    "cost": ("cost", "cost_history"),
}
"""Each of `Reads`' signals, and the `ObservedState` fields the gather fills with it."""


def runtime_deployments(observed: ObservedState) -> list[KubeObject]:
    """The runtime Deployments there are: the serving one, and a mixed GPU fleet's (one
    per product)."""
    return [d for d in (observed.deployment, *observed.product_deployments) if d]


def signals_to_read(observed: ObservedState, now: datetime) -> Reads:
    """What the decision of a pass over `observed` reads beyond the objects: a function of
    the children, the spec, the stored status and whether PodMonitors are served, so the
    gather step can ask before reading anything more."""
    spec = observed.spec
    runtimes = runtime_deployments(observed)
    autoscaled = spec.autoscaling.enabled and bool(runtimes)
    objective = spec.slo.p99_latency_milliseconds is not None
    return Reads(
        shadow=metrics_query(observed.status.candidate),
        runtime_pods=autoscaled or any(unsettled(deployment) for deployment in runtimes),
        candidate_pods=unsettled(observed.candidate_deployment),
        serving_pods=autoscaled,
        scaling_signals=autoscaled or (objective and bool(runtimes)),
        wake_signals=autoscaled and spec.autoscaling.min_replicas == 0,
        quality=_quality_window(observed, now),
        gpu_nodes=in_fleet_mode(spec),
        pod_monitor=observed.pod_monitors_available,
        answers=bool(runtimes) and spec.known_answers is not None,
        cost=_cost_read(observed, bool(runtimes), now),
    )


def _cost_read(observed: ObservedState, runtimes: bool, now: datetime) -> CostRead | None:
    """The cost's reads while the settings price nodes and a runtime Deployment exists (at
    zero replicas too: the window still holds the pods it had); the inferences only once the
    stored figure is `refresh_seconds` old (or there is none)."""
    settings = observed.cost_settings
    if settings is None or not runtimes:
        return None
    stored = observed.status.cost
    age = (now - stored.last_evaluated).total_seconds() if stored is not None else None
    due = age is None or not 0 <= age < settings.refresh_seconds
    return CostRead(settings.window_seconds, due)


def _quality_window(observed: ObservedState, now: datetime) -> QualityWindow | None:
    """The quality watch's window, once the reference engine exists (its ConfigMap names
    it) and the watch has begun on the engine the serving ConfigMap names."""
    reference = engine_digest(observed.reference_configmap)
    if not (observed.spec.quality_watch.enabled and reference):
        return None
    seconds = window_to_read(
        observed.spec.quality_watch,
        observed.status.quality_watch,
        engine_digest(observed.configmap),
        now,
    )
    return QualityWindow(reference, seconds) if seconds is not None else None


def engine_digest(configmap: KubeObject | None) -> str | None:
    """The engine a runtime ConfigMap names (its annotation), or None."""
    annotations = ((configmap or {}).get("metadata") or {}).get("annotations") or {}
    digest = annotations.get(names.ANNOTATION_ENGINE_DIGEST)
    return digest if isinstance(digest, str) and digest else None
