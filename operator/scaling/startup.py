"""Startup awareness: pods that are starting are capacity on its way. Pure.

Why: a runtime pod serves nothing until its engine is loaded, often a minute or more. A
scale-up decided on a burst cannot show in the requests in progress before its pods are ready, and
meanwhile the queue on the pods already serving keeps growing, since the same demand still
falls on them alone. A plain HorizontalPodAutoscaler reads that growth as new demand and
scales up again, each pass of the startup time: the cascade of kubernetes/kubernetes#29989
(for CPU, which the HPA answers by ignoring the CPU of pods in their initialization
period; a queue has no such per-pod figure: it is the ready pods' backlog that grows).
And the queue is a stock, not a rate: the backlog built during the startup is still
there when the pods are ready, and read as the HPA reads it, it calls for a second
scale-up just as the first one's capacity starts to drain it.

The rule: a scale-up commits to the count it heads for (`ScalingHistory.committed`: the
stabilized recommendation within the bounds, before the rate limit). While the commitment
is in progress, a recommendation above it is held at it (reason PodsStarting); steps
*towards* it that the rate limit deferred go on, and recommendations at or below it pass
untouched (a burst that ends mid-startup may scale back down as the stabilization window
allows). It is in progress in two phases:

1. Starting: fewer pods are ready than committed, some are on their way (starting, or set
   and not created yet), and they are believable: the oldest starting pod is younger than
   `STARTUP_MARGIN` times the startup time measured from this object's pods (or
   `UNMEASURED_STARTUP_SECONDS` before any was measured). The signals cannot reflect the
   coming capacity, so they are no evidence of more demand.
2. Draining: the committed pods are ready (or all pods set are), and the queue that built
   meanwhile is still above target. Its total (requests in progress per replica x ready) is
   remembered (`ScalingHistory.backlog`); the first reading after the pods arrive is held
   (they may have arrived just before the pass), then the hold lasts while the total
   falls fast enough to be back at target within one startup time: a pod added now would
   be ready only after the backlog is gone, so it would not serve it. A total that does
   not fall (the capacity does not cover the arrivals) or falls more slowly ends the
   commitment at once, and the HPA's reading of it applies.

Once the commitment is over, the signals are read as the HPA reads them and a new
scale-up may commit again. A scale-down ends a commitment; a pass without metrics leaves
it as it is.

A pod starting for far longer than pods here take (crash-looping, unschedulable, image
pull failing) ends the commitment: the autoscaler then behaves as the plain HPA, so a
broken pod never stops it from adding capacity.

Limits, said plainly: (1) `ServingPods` gives the oldest starting pod's age only, so one
old stuck pod makes every starting pod unbelievable, and the autoscaler falls back to the
HPA's behaviour until that pod is ready or gone. (2) The committed count is only as good
as the reading it was computed from: a burst on pods with deep queues is read mostly as
backlog, which may already call for maxReplicas, and then there is nothing above it to
hold; and a reading of saturated pods says "at least this many", so a burst larger than
that reaches capacity one startup later than the plain HPA, which keeps adding pods
during the startup. (3) Demand that truly grows during a startup is recognised only when
the committed pods are ready. (4) A commitment whose pods can never be created (a quota,
an admission webhook) holds only counts above it, which could not be created either.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.scaling.signals import figure, pods_word
from kubeinfer.operator.state.scaling_inputs import ScalingHistory, ScalingSignals, ServingPods

STARTUP_MARGIN = 2.0
"""A starting pod is believed for this many times the measured startup time: a median
startup leaves half the pods slower, and an engine load varies with the node's disk and
network, so the margin is generous; past it the pod is taken for broken."""

Backlog = tuple[datetime, float]
"""(when, requests queued or running over the ready pods) of one reading."""

UNMEASURED_STARTUP_SECONDS = 300.0
"""The startup time assumed before any pod of the object was measured (before the
margin): long enough for a large engine to load, so a first burst does not cascade."""


@dataclass(frozen=True)
class Hold:
    """What startup awareness makes of this pass' recommendation."""

    recommended: int
    """The recommendation after the hold (the input where nothing was held)."""

    committed: int | None = None
    """The commitment still in progress (None: none)."""

    backlog: Backlog | None = None
    """This pass' backlog reading, in the draining phase."""

    message: str = ""
    """Why the recommendation was held, when it was."""


def expected_startup_seconds(pods: ServingPods) -> float:
    """How long a pod takes to become ready here: measured, or assumed before that."""
    measured = pods.startup_seconds
    return measured if measured is not None and measured > 0 else UNMEASURED_STARTUP_SECONDS


def _startup_words(pods: ServingPods) -> str:
    if pods.startup_seconds is not None and pods.startup_seconds > 0:
        return f"startup measured {figure(pods.startup_seconds)} s"
    return f"startup not measured yet, {figure(UNMEASURED_STARTUP_SECONDS)} s assumed"


def starting(committed: int | None, pods: ServingPods) -> bool:
    """Whether the commitment is in its starting phase (see the module); a starting pod
    past belief (`_stale`) has already ended it."""
    if committed is None or pods.ready >= committed:
        return False
    return pods.starting > 0 or pods.desired > pods.ready  # starting, or set and not created


def _stale(pods: ServingPods) -> bool:
    """A starting pod is older than any believable startup (the age is None without
    starting pods)."""
    age = pods.oldest_starting_age_seconds
    return age is not None and age > STARTUP_MARGIN * expected_startup_seconds(pods)


def _drain(
    spec: AutoscalingSpec,
    history: ScalingHistory,
    signals: ScalingSignals,
    pods: ServingPods,
    now: datetime,
) -> tuple[Backlog, str] | None:
    """In the draining phase: this pass' backlog reading and why it holds, or None when
    the commitment is over (the backlog is gone, or it does not drain fast enough, or the
    requests in progress could not be read)."""
    depth = signals.requests_in_progress_per_replica
    if depth is None:
        return None
    total = depth * pods.ready
    at_target = spec.target_requests_in_progress_per_replica * (1 + spec.tolerance) * pods.ready
    if total <= at_target:  # also without a ready pod: then there is nothing to drain
        return None
    reading = (now, total)
    startup = _startup_words(pods)
    depth_words = f"requests in progress per replica {figure(depth)}"
    previous = history.backlog
    if previous is None:
        return reading, (
            f"the queue that built while they started is read once more now that they are "
            f"ready ({depth_words}; {startup})"
        )
    seconds = (now - previous[0]).total_seconds()
    fallen = previous[1] - total
    if seconds <= 0 or fallen <= 0:
        return None
    if (total - at_target) * seconds / fallen > expected_startup_seconds(pods):
        return None
    was = previous[1] / pods.ready
    return reading, (
        f"the queue that built while they started drains fast enough to be gone before "
        f"another pod could start ({depth_words}, down from {figure(was)} at the last pass; "
        f"{startup})"
    )


def hold(
    spec: AutoscalingSpec,
    history: ScalingHistory,
    recommended: int,
    signals: ScalingSignals,
    pods: ServingPods,
    now: datetime,
) -> Hold:
    """Holds a recommendation above a commitment in progress at the commitment."""
    committed = history.committed
    if not spec.count_starting_pods or committed is None or _stale(pods):
        return Hold(recommended)
    ceiling = max(committed, pods.desired)
    if starting(committed, pods):
        on_the_way = ceiling - pods.ready
        why = (
            f"{on_the_way} of them {'is' if on_the_way == 1 else 'are'} on the way "
            f"({pods.starting} starting, {_startup_words(pods)}): the queue that builds "
            "meanwhile is not new demand"
        )
        backlog = None
    else:
        drained = _drain(spec, history, signals, pods, now)
        if drained is None:
            return Hold(recommended)
        backlog, why = drained
    if recommended <= ceiling:
        return Hold(recommended, committed, backlog)
    return Hold(ceiling, committed, backlog, f"held at {pods_word(ceiling)} while {why}")


def commit(
    spec: AutoscalingSpec, held: Hold, current: int, replicas: int, target: int
) -> tuple[int | None, Backlog | None]:
    """The commitment and backlog reading to remember after this pass. A scale-up
    (`replicas` above `current`) without a commitment in progress commits to `target`,
    the stabilized count within the bounds, which the rate limit may defer; a scale-down
    ends any."""
    if not spec.count_starting_pods or replicas < current:
        return None, None
    if held.committed is not None:
        return held.committed, held.backlog
    if replicas > current:
        return max(target, replicas), None
    return None, None
