"""The autoscaler's part of a pass: its count and its report, from what the gather step
read (the signals, the serving pods) and the SLO report. Pure."""

from __future__ import annotations

from datetime import datetime

from kubeinfer.operator.reconcile.scaling_status import ScalingReport, scaling_report
from kubeinfer.operator.reconcile.slo_status import SloReport
from kubeinfer.operator.scaling.recommend import recommend
from kubeinfer.operator.state.observed import KubeObject, ObservedState
from kubeinfer.operator.state.scaling_inputs import (
    Recommendation,
    ScalingSignals,
    ServingPods,
    SloMiss,
)


def _serving_deployments(observed: ObservedState) -> list[KubeObject]:
    """The serving Deployment, or a mixed GPU fleet's Deployments (one per product)."""
    return [observed.deployment] if observed.deployment else list(observed.product_deployments)


def no_pods(observed: ObservedState) -> ServingPods:
    """What is known of the pods when none were counted (the Deployment is new)."""
    counts = [((d.get("spec") or {}).get("replicas")) for d in _serving_deployments(observed)]
    known = [count for count in counts if isinstance(count, int)]
    minimum = observed.spec.autoscaling.min_replicas
    return ServingPods(desired=sum(known) if known else minimum, ready=0, starting=0)


def slo_miss(observed: ObservedState, slo: SloReport | None, now: datetime) -> SloMiss | None:
    """The objective missed, for the autoscaler: for how long since the later of the miss'
    start and the count's last change (a windowed p99 lags a scale-up)."""
    if slo is None or slo.status.met is not False or slo.status.p99_milliseconds is None:
        return None
    since = slo.status.missed_since or now
    scaled = observed.status.autoscaling.last_scale_time if observed.status.autoscaling else None
    if scaled is not None and scaled > since:
        since = scaled
    return SloMiss(
        slo.status.p99_milliseconds / 1e3,
        slo.status.objective_p99_milliseconds / 1e3,
        max(0.0, (now - since).total_seconds()),
    )


def recommendation(
    observed: ObservedState, now: datetime, slo: SloReport | None = None
) -> Recommendation | None:
    """The autoscaler's count, once the serving Deployment exists (a new one starts at
    minReplicas; on a mixed GPU fleet, once one product's does); None with autoscaling
    off."""
    scaling = observed.spec.autoscaling
    if not scaling.enabled or not _serving_deployments(observed):
        return None
    signals = observed.scaling_signals or ScalingSignals(error="The signals were not read.")
    pods = observed.serving_pods or no_pods(observed)
    return recommend(
        scaling, observed.scaling_history, signals, pods, now, slo_miss(observed, slo, now)
    )


def scaling(
    observed: ObservedState, recommended: Recommendation | None, now: datetime
) -> ScalingReport | None:
    """The autoscaler's status and Events for this pass (None with autoscaling off)."""
    if recommended is None:
        return None
    return scaling_report(
        observed.spec,
        recommended,
        observed.scaling_signals,
        observed.serving_pods or no_pods(observed),
        observed.status.autoscaling,
        observed.status.metrics,
        now,
    )
