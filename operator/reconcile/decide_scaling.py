"""The autoscaler's part of a pass: its count and its report, from what the gather step
read (the signals, the serving pods) and the SLO report. Pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, Reason
from kubeinfer.operator.reconcile.scaling_status import ScalingReport, scaling_report
from kubeinfer.operator.reconcile.slo_status import SloReport
from kubeinfer.operator.scaling import rate_limits, zero
from kubeinfer.operator.scaling.recommend import recommend
from kubeinfer.operator.scaling.signals import pods_word
from kubeinfer.operator.state.observed import KubeObject, ObservedState
from kubeinfer.operator.state.scaling_inputs import (
    Recommendation,
    ScaleEvent,
    ScalingHistory,
    ScalingSignals,
    ServingPods,
    SloMiss,
    WakeSignals,
)


def _serving_deployments(observed: ObservedState) -> list[KubeObject]:
    """The serving Deployment, or a mixed GPU fleet's Deployments (one per product)."""
    return [observed.deployment] if observed.deployment else list(observed.product_deployments)


def no_pods(observed: ObservedState) -> ServingPods:
    """What is known of the pods when none were counted (the Deployment is new)."""
    counts = [((d.get("spec") or {}).get("replicas")) for d in _serving_deployments(observed)]
    known = [count for count in counts if isinstance(count, int)]
    minimum = max(1, observed.spec.autoscaling.min_replicas)  # a new object starts serving
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
    history = observed.scaling_history
    # Read only with minReplicas 0 (reads.signals_to_read); the zero step needs none else.
    wake = (observed.wake_signals if scaling.min_replicas == 0 else None) or WakeSignals()
    verdict = zero.decide(scaling, history, signals, wake, pods, now)
    if verdict.replicas is not None:
        return _set_by_zero_step(scaling, verdict, history, pods, now)
    bounded = scaling
    if verdict.floor != scaling.min_replicas:
        # The HPA steps never go below one pod; an open schedule raises the floor too.
        bounded = scaling.model_copy(update={"min_replicas": verdict.floor})
    recommended = recommend(bounded, history, signals, pods, now, slo_miss(observed, slo, now))
    return replace(
        recommended,
        history=replace(recommended.history, activity=verdict.activity),
        scaled_to_zero=verdict.condition,
    )


def _set_by_zero_step(
    spec: AutoscalingSpec,
    verdict: zero.ZeroVerdict,
    history: ScalingHistory,
    pods: ServingPods,
    now: datetime,
) -> Recommendation:
    """The count the zero step set (to zero, or woken from it): the HPA steps are passed
    by, since no load was measured at zero and a client waits on the wake; the down
    window starts over from the new count."""
    replicas = verdict.replicas if verdict.replicas is not None else pods.desired
    condition = verdict.condition
    message = condition[2] if condition else ""
    events = history.events
    if replicas != pods.desired:
        events = (*events, ScaleEvent(now, pods.desired, replicas))
    within = (
        ConditionStatus.FALSE,
        Reason.DESIRED_WITHIN_RANGE,
        f"{pods_word(replicas)}, within minReplicas {spec.min_replicas} and maxReplicas "
        f"{spec.max_replicas}.",
    )
    return Recommendation(
        replicas=replicas,
        desired=replicas,
        signal=verdict.signal,
        active=(
            ConditionStatus.TRUE,
            Reason.SCALED_FROM_ZERO if replicas else Reason.IDLE,
            message,
        ),
        limited=within,
        history=ScalingHistory(
            events=rate_limits.record(spec, events, now), activity=verdict.activity
        ),
        scaled_to_zero=condition,
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
