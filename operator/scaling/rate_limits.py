"""How fast the count may change, per direction: Kubernetes HPA's behaviour policies
(`calculateScaleUpLimitWithScalingRules`, `calculateScaleDownLimitWithBehaviors` and
`convertDesiredReplicasWithBehaviorRate` in `pkg/controller/podautoscaler/horizontal.go`).
Pure.

Each limit counts from the replicas at the start of its period (now minus the period),
found by undoing the changes made since (the scale events inside the period), so a series
of small steps cannot add up to more than one period allows:

- up: at most max(start * (1 + scaleUpMaxPercent / 100) rounded up, start +
  scaleUpMaxPods) per scaleUpPeriodSeconds: the HPA's two policies with selectPolicy Max
  (rounded up, as the HPA does, so a percent of a small count still adds a pod);
- down: at most start * (1 - scaleDownMaxPercent / 100), rounded down as the HPA's integer
  conversion does, per scaleDownPeriodSeconds.

Both in integer arithmetic (the percents are whole): the HPA's float64 has 50 x 1.1 =
55.00000000000001, which it rounds up to 56, and 10 x (1 - 0.8) = 1.9999999999999996,
which it truncates to 1; no pod should hinge on the 16th digit.

A limit never moves the count the other way: one already used up holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.state.scaling_inputs import ScaleEvent


@dataclass(frozen=True)
class RateLimited:
    """The count the limits allow, and the limit that held it back (None if none did)."""

    replicas: int
    reason: Reason | None = None
    message: str = ""


def _start_of_period(
    events: tuple[ScaleEvent, ...], current: int, period_seconds: int, now: datetime
) -> int:
    """The count at the start of the period: now's, with the period's changes undone."""
    cutoff = now - timedelta(seconds=period_seconds)
    changed = sum(e.after - e.before for e in events if cutoff < e.time <= now)
    return max(0, current - changed)


def scale_up_limit(
    spec: AutoscalingSpec, events: tuple[ScaleEvent, ...], current: int, now: datetime
) -> int:
    """The most pods the up policies allow now (never fewer than `current`)."""
    start = _start_of_period(events, current, spec.scale_up_period_seconds, now)
    by_percent = -(-start * (100 + spec.scale_up_max_percent) // 100)  # rounded up
    return max(current, by_percent, start + spec.scale_up_max_pods)


def scale_down_limit(
    spec: AutoscalingSpec, events: tuple[ScaleEvent, ...], current: int, now: datetime
) -> int:
    """The fewest pods the down policy allows now (never more than `current`)."""
    start = _start_of_period(events, current, spec.scale_down_period_seconds, now)
    return min(current, start * (100 - spec.scale_down_max_percent) // 100)


def limit_rate(
    spec: AutoscalingSpec,
    events: tuple[ScaleEvent, ...],
    wanted: int,
    current: int,
    now: datetime,
) -> RateLimited:
    """`wanted`, or as far towards it as the policy of its direction allows now."""
    if wanted > current:
        limit = scale_up_limit(spec, events, current, now)
        if wanted > limit:
            return RateLimited(
                limit,
                Reason.SCALE_UP_LIMIT,
                f"scaleUpMaxPercent {spec.scale_up_max_percent} % or scaleUpMaxPods "
                f"{spec.scale_up_max_pods} per scaleUpPeriodSeconds "
                f"{spec.scale_up_period_seconds} allow {limit}",
            )
    elif wanted < current:
        limit = scale_down_limit(spec, events, current, now)
        if wanted < limit:
            return RateLimited(
                limit,
                Reason.SCALE_DOWN_LIMIT,
                f"scaleDownMaxPercent {spec.scale_down_max_percent} % per "
                f"scaleDownPeriodSeconds {spec.scale_down_period_seconds} allows {limit}",
            )
    return RateLimited(wanted)


def record(
    spec: AutoscalingSpec, events: tuple[ScaleEvent, ...], now: datetime
) -> tuple[ScaleEvent, ...]:
    """The events a limit can still count: those inside the longer of the two periods."""
    longest = max(spec.scale_up_period_seconds, spec.scale_down_period_seconds)
    cutoff = now - timedelta(seconds=longest)
    return tuple(e for e in events if cutoff < e.time <= now)
