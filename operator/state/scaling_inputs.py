"""What the autoscaler decides from, and what it returns: plain frozen values.

The reconciler's gather step fills `ScalingSignals` (from the metrics source) and
`ServingPods` (from the API); the reconciler keeps one `ScalingHistory` per object in
memory (as the HorizontalPodAutoscaler controller does: a restarted operator starts with an
empty history, which only makes it more careful: the down-stabilization window starts
over). `recommend` is a pure function of these and `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.conditions import ConditionValue


@dataclass(frozen=True)
class ScalingSignals:
    """The load, read from the serving pods' metrics in one pass."""

    requests_in_progress_per_replica: float | None = None
    """Requests queued or running per ready serving pod (the mean over the ready pods);
    None when it could not be read."""

    gpu_memory_used_ratio: float | None = None
    """The highest used/total ratio over the serving pods' GPUs; None where the pods have no
    GPU (not an error) or when it could not be read."""

    p99_seconds: float | None = None
    """The serving pods' recent p99 request latency (the status, and the SLO signal)."""

    p99_window_seconds: int | None = None
    """The window the p99 covers; None: since each pod started (the direct read)."""

    error: str = ""
    """Why the signals could not be read (the metrics source's message); empty when they
    were. With an error, the autoscaler holds the count and never scales down."""

    set_aside: tuple[str, ...] = ()
    """Readings that made no sense (a ratio of 40 from a mislabelled series, a negative
    depth), each said in a sentence: the figure is left out as if unread, and the others
    still count."""


@dataclass(frozen=True)
class SloMiss:
    """The latency objective missed: the p99 read, the objective, and for how long it has
    been missed since the count last changed (a p99 over a window lags a scale-up, so the
    time runs again from each change)."""

    p99_seconds: float
    objective_seconds: float
    missed_for_seconds: float


@dataclass(frozen=True)
class ServingPods:
    """The serving Deployment's pods as the API shows them."""

    desired: int
    """The Deployment's spec.replicas: the count last set."""

    ready: int
    """Pods ready to serve."""

    starting: int
    """Pods that exist and are not ready yet (and not terminating): capacity on its way."""

    oldest_starting_age_seconds: float | None = None
    """Age of the longest-starting pod, None without starting pods (a pod starting far
    longer than pods usually take is not counted on)."""

    startup_seconds: float | None = None
    """How long recent pods took from creation to ready (median); None before any was
    measured."""


@dataclass(frozen=True)
class ScaleEvent:
    """A change of the Deployment's replicas the autoscaler made."""

    time: datetime
    before: int
    after: int


@dataclass(frozen=True)
class ScalingHistory:
    """What the stabilization windows and the rate limits look back on."""

    recommendations: tuple[tuple[datetime, int], ...] = ()
    """(when, count) of each raw recommendation, within the longest window."""

    events: tuple[ScaleEvent, ...] = ()
    """The scale changes, within the longest rate-limit period."""

    committed: int | None = None
    """With startup awareness: the count a scale-up in progress is heading for (its pods
    are still starting); the queue that builds meanwhile is not new demand."""

    backlog: tuple[datetime, float] | None = None
    """With startup awareness, once a committed scale-up's pods are ready: when, and how
    many requests were queued or running over the ready pods (requests in progress per replica x
    ready) at the previous pass, to tell the backlog built during the startup draining
    from demand that grows."""

    activity: tuple[datetime, float | None] | None = None
    """With minReplicas 0: when a request was last seen (the request counter moving, a
    request in progress or held) and the counter's value then; the idle window counts
    from it. None: not seen yet (a restarted operator starts the window over)."""


@dataclass(frozen=True)
class WakeSignals:
    """What keeps an object with minReplicas 0 from zero pods, or wakes it, read in the
    pass: the requests its pods answered, the requests the activator holds for it, and its
    wake query."""

    requests_answered: float | None = None
    """The runtime's request counter summed over the serving pods, now (its changes are
    the activity; a restarted pod's reset is a change too); None unread or no pod."""

    held_requests: int | None = None
    """Requests the activator pods hold for this object, summed; None unread."""

    activator_routing: bool = False
    """Every ready activator pod routes this object's Service: it may go to zero."""

    activator_addresses: tuple[str, ...] = ()
    """The ready activator pods' addresses (the object's endpoints while at zero)."""

    activator_message: str = ""
    """Why the activator does not route it (not installed, route not loaded yet, not
    reachable), said in the ScaledToZero condition."""

    wake_query_value: float | None = None
    """spec.autoscaling.wakeOn.prometheus' value, read at zero only."""

    wake_query_error: str = ""
    """Why the wake query gave no value."""


@dataclass(frozen=True)
class Recommendation:
    """The count to set, why, and the history to keep for the next pass."""

    replicas: int
    """What the serving Deployment's replicas should be after this pass."""

    desired: int
    """What the signals call for, before stabilization, rate limits and bounds."""

    signal: str
    """Which signal decided: `requestsInProgressPerReplica`, `gpuMemoryUsedRatio`, or `none`."""

    active: ConditionValue
    """The ScalingActive condition."""

    limited: ConditionValue
    """The ScalingLimited condition."""

    history: ScalingHistory = field(default_factory=ScalingHistory)
    """The history to pass to the next call."""

    scaled_to_zero: ConditionValue | None = None
    """The ScaledToZero condition, with minReplicas 0 (`scaling.zero`)."""
