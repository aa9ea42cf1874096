"""What autoscaling adds to the status: ScalingActive and ScalingLimited, the load figures
(`status.metrics`, which the `P99` printer column reads), `status.autoscaling`, and an
Event for each change of the count with the signal that caused it. Pure.

With autoscaling on, the operator owns the serving Deployment's replicas and
`spec.runtime.replicas` (which `kubectl scale` and an HPA or KEDA ScaledObject targeting
the scale subresource write) is not used: ScalingActive says so whenever the two differ,
rather than ignoring it silently. With autoscaling off, the conditions are removed and
`runtime.replicas` is the count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.conditions import ConditionValue, Reason
from kubeinfer.operator.api.v1alpha1.inference_deployment import InferenceDeploymentSpec
from kubeinfer.operator.api.v1alpha1.status import AutoscalingStatus, MetricsStatus
from kubeinfer.operator.state.decision import Event
from kubeinfer.operator.state.scaling_inputs import (
    Recommendation,
    ScalingSignals,
    ServingPods,
)


@dataclass(frozen=True)
class ScalingReport:
    """The status' share of one pass' recommendation."""

    active: ConditionValue
    limited: ConditionValue
    autoscaling: AutoscalingStatus
    metrics: MetricsStatus | None
    events: tuple[Event, ...] = ()
    scaled_to_zero: ConditionValue | None = None


def scaling_report(
    spec: InferenceDeploymentSpec,
    recommendation: Recommendation,
    signals: ScalingSignals | None,
    pods: ServingPods,
    previous: AutoscalingStatus | None,
    previous_metrics: MetricsStatus | None,
    now: datetime,
) -> ScalingReport:
    """Conditions, figures and events for `recommendation`; `previous` and
    `previous_metrics` are what the status held (kept where nothing new was read)."""
    status, reason, message = recommendation.active
    if signals is not None and signals.set_aside:
        message = f"{message} {'; '.join(signals.set_aside)}.".strip()
    ignored = spec.runtime.replicas
    if ignored != recommendation.replicas:
        message = (
            f"{message} runtime.replicas ({ignored}, which `kubectl scale` sets) is not used "
            "while autoscaling is enabled."
        ).strip()
    changed = recommendation.replicas != pods.desired
    events: tuple[Event, ...] = ()
    last_scale = previous.last_scale_time if previous else None
    if changed:
        up = recommendation.replicas > pods.desired
        events = (
            Event(
                "Normal",
                Reason.SCALED_UP if up else Reason.SCALED_DOWN,
                f"Scaled the runtime from {pods.desired} to {recommendation.replicas} pods "
                f"({recommendation.signal}): {recommendation.active[2]}",
            ),
        )
        last_scale = now
    metrics = previous_metrics
    if signals is not None and not signals.error:
        metrics = _figures(signals, previous_metrics, now)
    startup = pods.startup_seconds
    bounds = spec.autoscaling
    autoscaling = AutoscalingStatus(
        desired_replicas=max(bounds.min_replicas, min(bounds.max_replicas, recommendation.desired)),
        last_scale_time=last_scale,
        pod_startup_seconds=round(startup, 1) if startup is not None else None,
    )
    return ScalingReport(
        (status, reason, message),
        recommendation.limited,
        autoscaling,
        metrics,
        events,
        recommendation.scaled_to_zero,
    )


def _figures(
    signals: ScalingSignals, previous: MetricsStatus | None, now: datetime
) -> MetricsStatus:
    """The figures read this pass, stamped `now` unless they are the ones the status
    already holds: then the status stays as it is (readTime included), so an autoscaled
    object whose load does not change writes nothing, as the HPA writes its status only
    when it changes (once per poll per object made a fleet's idle status writes)."""
    read = MetricsStatus(
        requests_in_progress_per_replica=_rounded(signals.requests_in_progress_per_replica),
        gpu_memory_used_ratio=_rounded(signals.gpu_memory_used_ratio),
        p99_milliseconds=_rounded(signals.p99_seconds and signals.p99_seconds * 1e3),
        read_time=now,
    )
    if previous is not None and previous.model_copy(update={"read_time": now}) == read:
        return previous
    return read


def _rounded(value: float | None) -> float | None:
    """Three significant decimals: the status is for reading, and a figure that moves in
    its tenth decimal must not make every pass write the status."""
    return None if value is None else round(value, 3)
