"""The autoscaler's decision: how many serving pods the load calls for now. Pure.

`recommend(spec, history, signals, pods, now)` runs the steps of Kubernetes' HPA
(`pkg/controller/podautoscaler/horizontal.go`, `replica_calculator.go`), with one step the
HPA lacks, each in a module named for it:

1. `signals`: each signal's recommendation (usage ratio against its target, tolerance,
   GPU memory and a sustained SLO miss only pushing up); the largest wins and names the
   deciding signal. Metrics that failed, or none read, or no ready pod to read them
   from: the count is held (ScalingActive False, MetricsUnavailable), never scaled down
   on missing data, and nothing is recorded, so the autoscaler resumes by itself when
   the signals return.
2. `startup`: with `countStartingPods`, a recommendation above the count a scale-up in
   progress heads for is held while its pods start, and then while the queue that built
   meanwhile drains (PodsStarting).
3. `stabilization`: the windows over the recorded recommendations (Scale*Stabilized).
4. `rate_limits`: the per-direction policies over the recorded scale events
   (Scale*Limit).
5. the bounds, last, as the user's word: [minReplicas, maxReplicas] (TooFew/TooMany).
   They apply even without metrics, as the HPA moves a count outside its bounds back
   into them before it reads any metric.

The history returned records this pass' recommendation (after step 2: a backlog held as
"not new demand" is not demand the down window should keep pods for either), the scale
event when the count changes, and the commitment; it is pruned, so it stays bounded
however long the operator runs. Conditions: ScalingActive says whether the signals were
read and what they call for; ScalingLimited says which step kept the count from what they
call for (the last one that changed it), or DesiredWithinRange when none did. Messages
state figures and settings only (no "in 12 s"), so a pass that finds nothing new writes
the same conditions.
"""

from __future__ import annotations

from datetime import datetime

from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionValue, Reason
from kubeinfer.operator.scaling import rate_limits, stabilization, startup
from kubeinfer.operator.scaling.signals import (
    GPU_MEMORY,
    NO_SIGNAL,
    REQUESTS_IN_PROGRESS,
    Proposal,
    Unmeasured,
    pods_word,
    propose,
)
from kubeinfer.operator.state.scaling_inputs import (
    Recommendation,
    ScaleEvent,
    ScalingHistory,
    ScalingSignals,
    ServingPods,
    SloMiss,
)

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE


def _sentence(text: str) -> str:
    """`text` capitalized, with a full stop (the parts it is built from have none)."""
    return text[:1].upper() + text[1:] + "."


def _bounded(spec: AutoscalingSpec, wanted: int) -> tuple[int, ConditionValue | None]:
    """`wanted` within [minReplicas, maxReplicas], and the condition if that moved it."""
    if wanted < spec.min_replicas:
        message = f"{pods_word(wanted)} wanted; minReplicas is {spec.min_replicas}"
        return spec.min_replicas, (TRUE, Reason.TOO_FEW_REPLICAS, _sentence(message))
    if wanted > spec.max_replicas:
        message = f"{pods_word(wanted)} wanted; maxReplicas is {spec.max_replicas}"
        return spec.max_replicas, (TRUE, Reason.TOO_MANY_REPLICAS, _sentence(message))
    return wanted, None


def _within_range(spec: AutoscalingSpec, replicas: int) -> ConditionValue:
    return (
        FALSE,
        Reason.DESIRED_WITHIN_RANGE,
        f"{pods_word(replicas)}, within minReplicas {spec.min_replicas} and maxReplicas "
        f"{spec.max_replicas}.",
    )


def _largest(proposals: tuple[Proposal, ...], current: int) -> tuple[int, str]:
    """The largest recommendation and its signal (the first on a tie); the current count,
    from no signal, when none has a say. With the requests in progress unread, GPU memory alone has
    a say, and it never calls for fewer pods than now: nothing removes one."""
    best: Proposal | None = None
    for proposal in proposals:
        if proposal.replicas is not None and (
            best is None or best.replicas is None or proposal.replicas > best.replicas
        ):
            best = proposal
    if best is None or best.replicas is None:
        return current, NO_SIGNAL
    return best.replicas, best.signal


def _unmeasured(
    spec: AutoscalingSpec,
    history: ScalingHistory,
    pods: ServingPods,
    why: Unmeasured,
    now: datetime,
) -> Recommendation:
    """Holds the count (within the bounds) while no signal can be read."""
    current = pods.desired
    replicas, bounded = _bounded(spec, current)
    events = history.events
    if replicas != current:
        events = (*events, ScaleEvent(now, current, replicas))
    kept = (
        f"the count is held at {pods_word(current)}"
        if replicas == current
        else "the count is only brought within its bounds"
    )
    active = (
        FALSE,
        Reason.METRICS_UNAVAILABLE,
        f"{why.message}; {kept}, never scaled down on missing data.",
    )
    return Recommendation(
        replicas=replicas,
        desired=current,
        signal=NO_SIGNAL,
        active=active,
        limited=bounded or _within_range(spec, replicas),
        history=ScalingHistory(
            recommendations=stabilization.record(spec, history.recommendations, now),
            events=rate_limits.record(spec, events, now),
            committed=history.committed if spec.count_starting_pods else None,
            backlog=history.backlog if spec.count_starting_pods else None,
        ),
    )


def _gpu_floor(proposals: tuple[Proposal, ...], current: int) -> ConditionValue | None:
    """GpuMemoryHigh when GPU memory above its watermark keeps a count the requests in progress
    would lower (a scale-up on GPU memory is no limit: ScalingActive names the signal)."""
    gpu = next((p for p in proposals if p.signal == GPU_MEMORY), None)
    queue = next((p for p in proposals if p.signal == REQUESTS_IN_PROGRESS), None)
    if gpu is None or queue is None or gpu.replicas != current or queue.replicas is None:
        return None
    if queue.replicas >= current:
        return None
    return (
        TRUE,
        Reason.GPU_MEMORY_HIGH,
        _sentence(
            f"{gpu.message}; the requests in progress alone call for {pods_word(queue.replicas)}"
        ),
    )


def recommend(
    spec: AutoscalingSpec,
    history: ScalingHistory,
    signals: ScalingSignals,
    pods: ServingPods,
    now: datetime,
    slo_miss: SloMiss | None = None,
) -> Recommendation:
    """The count to set now, why, and the history for the next pass (see the module);
    `slo_miss`, the latency objective missed, for the SLO signal."""
    current = pods.desired
    proposals = propose(spec, signals, pods, slo_miss)
    if isinstance(proposals, Unmeasured):
        return _unmeasured(spec, history, pods, proposals, now)
    raw, signal = _largest(proposals, current)
    active = (
        TRUE,
        Reason.VALID_METRIC_FOUND,
        _sentence("; ".join(p.message for p in proposals)),
    )

    held = startup.hold(spec, history, raw, signals, pods, now)
    recorded = stabilization.seeded(history.recommendations, current, now)
    stable = stabilization.stabilize(spec, recorded, held.recommended, current, now)
    rated = rate_limits.limit_rate(spec, history.events, stable.replicas, current, now)
    replicas, bounded = _bounded(spec, rated.replicas)
    target, _ = _bounded(spec, stable.replicas)

    limited = bounded or _why_limited(spec, proposals, current, raw, replicas, held, stable, rated)

    events = history.events
    if replicas != current:
        events = (*events, ScaleEvent(now, current, replicas))
    committed, backlog = startup.commit(spec, held, current, replicas, target)
    return Recommendation(
        replicas=replicas,
        desired=raw,
        signal=signal,
        active=active,
        limited=limited,
        history=ScalingHistory(
            recommendations=stabilization.record(spec, recorded, now, held.recommended),
            events=rate_limits.record(spec, events, now),
            committed=committed,
            backlog=backlog,
        ),
    )


def _why_limited(
    spec: AutoscalingSpec,
    proposals: tuple[Proposal, ...],
    current: int,
    raw: int,
    replicas: int,
    held: startup.Hold,
    stable: stabilization.Stabilized,
    rated: rate_limits.RateLimited,
) -> ConditionValue:
    """ScalingLimited within minReplicas and maxReplicas: what kept the count from the
    signals' `raw`, the last step first (the rate limits, stabilization, pods starting),
    else a GPU memory floor, else how the count stands within its range."""
    if rated.reason is not None:
        wanted = f"{pods_word(stable.replicas)} wanted; {rated.message}"
        return TRUE, rated.reason, _sentence(wanted)
    if stable.replicas != held.recommended:
        return _stabilized(spec, held.recommended, current, stable)
    if held.recommended != raw:
        said = f"The signals call for {pods_word(raw)}; {held.message}"
        return TRUE, Reason.PODS_STARTING, _sentence(said)
    return _gpu_floor(proposals, current) or _within_range(spec, replicas)


def _stabilized(
    spec: AutoscalingSpec, recommended: int, current: int, stable: stabilization.Stabilized
) -> ConditionValue:
    if recommended > current:
        return (
            TRUE,
            Reason.SCALE_UP_STABILIZED,
            f"{pods_word(recommended)} recommended; scaling up only to the lowest "
            f"recommendation over scaleUpStabilizationSeconds "
            f"{spec.scale_up_stabilization_seconds}: {stable.lowest_up}.",
        )
    return (
        TRUE,
        Reason.SCALE_DOWN_STABILIZED,
        f"{pods_word(recommended)} recommended; scaling down only to the highest "
        f"recommendation over scaleDownStabilizationSeconds "
        f"{spec.scale_down_stabilization_seconds}: {stable.highest_down}.",
    )
