"""Scaling to and from zero pods: the step the HPA's algorithm lacks. Pure.

The HorizontalPodAutoscaler never recommends zero from a load signal, and neither does
`recommend`: a load of nothing is also what a metrics gap looks like. Zero comes only from
the idle window, as Knative's and KEDA's do: with `minReplicas: 0`, no request answered,
in progress or held by the activator for `scaleToZeroAfterSeconds`, and the activator
routing the object's Service, the count goes to zero. From zero, a request held by the
activator, the wake query above its threshold or a schedule's window opening brings it
back to one pod (or the window's floor), at once: no stabilization window or rate limit
delays a cold start that a client is waiting on.

A schedule's window is also a floor while pods run, whatever minReplicas is: the
autoscaler's lower bound is `floor` while one is open.

Missing data never takes the last pod away: a pass whose request counter could not be
read counts as a request seen, so the idle window starts over; so does a pass with pods
still starting (the wake's pod among them), whose requests may not have reached them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter
from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionValue, Reason
from kubeinfer.operator.api.v1alpha1.wake_on import WakeSchedule
from kubeinfer.operator.scaling.signals import pods_word
from kubeinfer.operator.state.scaling_inputs import (
    ScalingHistory,
    ScalingSignals,
    ServingPods,
    WakeSignals,
)

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE

HELD_REQUESTS = "heldRequests"
WAKE_QUERY = "wakeQuery"
SCHEDULE = "schedule"
IDLE = "idle"
"""The `signal` of a count this step set."""

Activity = tuple[datetime, float | None]


@dataclass(frozen=True)
class ZeroVerdict:
    """What this step says of the count."""

    replicas: int | None
    """The count to set, when this step decides it (zero, or a wake from zero); None: the
    autoscaler's recommendation stands, bounded below by `floor`."""

    floor: int
    """The autoscaler's lower bound: minReplicas, at least one, or an open window's
    replicas."""

    condition: ConditionValue | None
    """ScaledToZero (None with minReplicas above 0: the condition is not shown)."""

    signal: str = ""
    """What set `replicas` (HELD_REQUESTS, WAKE_QUERY, SCHEDULE, IDLE)."""

    activity: Activity | None = None
    """The history's activity for the next pass."""


def window_open(schedule: WakeSchedule, now: datetime) -> bool:
    """Whether `schedule`'s window holds `now` (an aware datetime): its latest start at
    or before `now`, in its time zone, is less than durationSeconds ago."""
    local = now.astimezone(ZoneInfo(schedule.time_zone))
    # croniter's get_prev is strictly before its start: a second later holds `now` itself.
    latest = croniter(schedule.start, local + timedelta(seconds=1)).get_prev(datetime)
    return local < latest + timedelta(seconds=schedule.duration_seconds)


def schedule_floor(spec: AutoscalingSpec, now: datetime) -> int:
    """The most replicas an open window asks for; 0 when none is open."""
    return max((s.replicas for s in spec.wake_on.schedules if window_open(s, now)), default=0)


def _activity(
    previous: Activity | None,
    signals: ScalingSignals,
    wake: WakeSignals,
    pods: ServingPods,
    now: datetime,
) -> Activity:
    """When a request was last seen, and the counter's value then (see ScalingHistory)."""
    seen = wake.requests_answered
    if previous is None:
        return now, seen
    since, previous_seen = previous
    unread = pods.ready > 0 and (seen is None or signals.error != "")
    moved = seen is not None and previous_seen is not None and seen != previous_seen
    busy = (signals.requests_in_progress_per_replica or 0) > 0 or (wake.held_requests or 0) > 0
    # Pods still starting are a scale-up under way (a wake from zero among them), whose
    # requests may not have reached them yet: the window starts when they serve.
    starting = pods.ready < pods.desired
    if unread or moved or busy or starting:
        return now, seen if seen is not None else previous_seen
    return since, seen if seen is not None else previous_seen


def _wakers(spec: AutoscalingSpec, wake: WakeSignals, floor: int) -> list[tuple[str, str, Reason]]:
    """(signal, sentence, reason) of each signal that wants pods now."""
    found = []
    if wake.held_requests:
        held = wake.held_requests
        said = f"{held} request{'s' if held != 1 else ''} held by the activator"
        found.append((HELD_REQUESTS, said, Reason.REQUESTS_HELD))
    query = spec.wake_on.prometheus
    value = wake.wake_query_value
    if query is not None and value is not None and value > query.threshold:
        said = f"the wake query is {value:g}, above its threshold {query.threshold:g}"
        found.append((WAKE_QUERY, said, Reason.WAKE_QUERY_ABOVE_THRESHOLD))
    if floor:
        found.append(
            (SCHEDULE, f"a schedule's window is open ({pods_word(floor)})", Reason.SCHEDULE_OPEN)
        )
    return found


def _at_zero(spec: AutoscalingSpec, wake: WakeSignals, floor: int, now: datetime) -> ZeroVerdict:
    wakers = _wakers(spec, wake, floor)
    if wakers:
        signal, _, reason = wakers[0]
        message = f"Woken from zero: {'; '.join(w[1] for w in wakers)}."
        return ZeroVerdict(
            max(1, floor), max(1, floor), (FALSE, reason, message), signal, (now, None)
        )
    message = _idle_message(spec)
    if wake.wake_query_error:
        message += f" The wake query gave no value: {wake.wake_query_error}."
    return ZeroVerdict(0, 1, (TRUE, Reason.IDLE, message), IDLE, None)


def _idle_message(spec: AutoscalingSpec) -> str:
    return (
        f"Zero pods: no request for scaleToZeroAfterSeconds {spec.scale_to_zero_after_seconds}; "
        "the activator holds the next requests while a pod starts."
    )


def decide(
    spec: AutoscalingSpec,
    history: ScalingHistory,
    signals: ScalingSignals,
    wake: WakeSignals,
    pods: ServingPods,
    now: datetime,
) -> ZeroVerdict:
    """This step's say on the count at `now` (see the module)."""
    floor = schedule_floor(spec, now)
    if spec.min_replicas > 0:
        return ZeroVerdict(None, max(spec.min_replicas, floor), None)
    if pods.desired == 0:
        verdict = _at_zero(spec, wake, floor, now)
        return verdict if verdict.replicas else _keep(verdict, history.activity)
    activity = _activity(history.activity, signals, wake, pods, now)
    bound = max(1, floor)
    wakers = [w for w in _wakers(spec, wake, floor) if w[0] != HELD_REQUESTS]
    if wakers:
        message = f"Kept from zero: {'; '.join(w[1] for w in wakers)}."
        return ZeroVerdict(None, bound, (FALSE, wakers[0][2], message), activity=activity)
    window = spec.scale_to_zero_after_seconds
    if (now - activity[0]).total_seconds() < window:
        message = f"Serving: zero pods once no request comes for scaleToZeroAfterSeconds {window}."
        return ZeroVerdict(None, bound, (FALSE, Reason.RECENTLY_ACTIVE, message), activity=activity)
    if not wake.activator_routing:
        message = (
            f"No request for scaleToZeroAfterSeconds {window}, but the pods are kept: "
            f"{wake.activator_message or 'the activator does not route this object'}."
        )
        return ZeroVerdict(
            None, bound, (FALSE, Reason.ACTIVATOR_NOT_ROUTING, message), activity=activity
        )
    return ZeroVerdict(0, bound, (TRUE, Reason.IDLE, _idle_message(spec)), IDLE, activity)


def _keep(verdict: ZeroVerdict, activity: Activity | None) -> ZeroVerdict:
    """`verdict` at zero, keeping the activity as it was (nothing is seen at zero)."""
    return ZeroVerdict(verdict.replicas, verdict.floor, verdict.condition, verdict.signal, activity)
