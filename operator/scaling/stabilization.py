"""Stabilization windows over the recent recommendations: Kubernetes HPA's
`stabilizeRecommendationWithBehaviors` (`pkg/controller/podautoscaler/horizontal.go`). Pure.

Scale up only to the lowest recommendation of the last scaleUpStabilizationSeconds, scale
down only to the highest of the last scaleDownStabilizationSeconds (this pass' own
recommendation included in both): one high reading does not add pods when the up window
is set, and one low reading does not remove any for five minutes by default, so the count
does not flap with the load's noise.

An empty record is seeded with the current count (`seeded`), so a restarted operator is
only more careful than one that ran on.

The history keeps only the recommendations a future window can still pick: one older than
both windows is gone (as the HPA reuses the slot of an outdated sample), and so is one a
newer recommendation dominates in every window it could still be part of (a newer value as
high or higher, for the down window's maximum; as low or lower, for the up window's
minimum). So what is kept is bounded by the number of passes a window spans and by the
distinct values in it, however long the operator runs, and every window reads the same
extremum it would read from the full record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec

Recommendations = tuple[tuple[datetime, int], ...]


@dataclass(frozen=True)
class Stabilized:
    """The count the windows allow, with what they looked at."""

    replicas: int
    lowest_up: int
    """The lowest recommendation in the up window (this pass' included)."""
    highest_down: int
    """The highest recommendation in the down window (this pass' included)."""


def _within(when: datetime, now: datetime, seconds: int) -> bool:
    # The HPA keeps samples strictly after the cutoff: a 0 s window is this pass alone.
    return when > now - timedelta(seconds=seconds)


def stabilize(
    spec: AutoscalingSpec,
    recommendations: Recommendations,
    recommended: int,
    current: int,
    now: datetime,
) -> Stabilized:
    """The count between the up window's lowest and the down window's highest
    recommendation that is nearest to `current`."""
    lowest_up = recommended
    highest_down = recommended
    for when, replicas in recommendations:
        if _within(when, now, spec.scale_up_stabilization_seconds):
            lowest_up = min(lowest_up, replicas)
        if _within(when, now, spec.scale_down_stabilization_seconds):
            highest_down = max(highest_down, replicas)
    replicas = min(max(current, lowest_up), highest_down)
    return Stabilized(replicas, lowest_up, highest_down)


def seeded(recommendations: Recommendations, current: int, now: datetime) -> Recommendations:
    """The record to stabilize over: an empty one (a restarted operator, or one emptied
    while the metrics could not be read) starts with the current count as if recommended
    now, the last count the lost record led to. So a restart never scales down before a
    full down window has passed (and, with an up window, never up before one)."""
    return recommendations or ((now, current),)


def record(
    spec: AutoscalingSpec,
    recommendations: Recommendations,
    now: datetime,
    recommended: int | None = None,
) -> Recommendations:
    """The recommendations to keep, in time order, with this pass' `recommended` (if any)
    last: it is always kept, so the record shows what this pass saw."""
    up_seconds = spec.scale_up_stabilization_seconds
    down_seconds = spec.scale_down_stabilization_seconds
    kept: list[tuple[datetime, int]] = []
    lowest_newer: float = float("inf")
    highest_newer: float = float("-inf")
    if recommended is not None:
        kept.append((now, recommended))
        lowest_newer = highest_newer = recommended
    # Newest first: an older entry stays only if some window can still pick it, that is if
    # it is still inside that window and beats every newer entry there.
    for when, replicas in reversed(recommendations):
        if when > now:
            continue  # from a clock that went back: no window can place it
        useful_up = _within(when, now, up_seconds) and replicas < lowest_newer
        useful_down = _within(when, now, down_seconds) and replicas > highest_newer
        if useful_up or useful_down:
            kept.append((when, replicas))
        lowest_newer = min(lowest_newer, replicas)
        highest_newer = max(highest_newer, replicas)
    return tuple(reversed(kept))
