"""What each load signal calls for on its own: Kubernetes HPA's per-metric formula. Pure.

Follows `GetMetricReplicas` / `calcPlainMetricReplicas` in the HPA's
`pkg/controller/podautoscaler/replica_calculator.go`: usage ratio = value / target; within
`tolerance` of 1 the signal calls for the current count (noise moves nothing), else for
`ceil(ready * ratio)`, where ready is the count the value was averaged over. Like the HPA's
check that a recomputed ratio does not flip direction, a signal above its target never
calls for fewer pods than are set now, and one below never for more: with pods still
starting (ready < set) `ceil(ready * ratio)` alone could point the other way.

GPU memory is not a load that spreads evenly and it cannot be queued: a pod whose GPU runs
out fails requests. So it only ever pushes up: above the high watermark beyond tolerance
it calls for `ceil(ready * ratio)` and at least one pod more than now; above the watermark
within tolerance it calls for the current count, which (the largest recommendation wins)
keeps the count from falling; at or below the watermark it has no say.

Without a ready pod nothing can be measured (the requests in progress are a mean over ready pods),
so no signal is read and the count is held; so is it when the metrics source failed or
every signal is missing: missing data never scales down. With the requests in progress missing and
GPU memory read, GPU memory alone decides, and (it only pushes up) the count cannot fall:
as the HPA does with some metrics invalid, it may scale up, never down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.state.scaling_inputs import ScalingSignals, ServingPods, SloMiss

REQUESTS_IN_PROGRESS = "requestsInProgressPerReplica"
GPU_MEMORY = "gpuMemoryUsedRatio"
SLO_MISS = "p99LatencyAboveObjective"
NO_SIGNAL = "none"


@dataclass(frozen=True)
class Proposal:
    """One signal's recommendation."""

    signal: str
    """REQUESTS_IN_PROGRESS or GPU_MEMORY."""

    replicas: int | None
    """The count this signal calls for; None where it has no say (GPU memory at or below
    its high watermark)."""

    message: str
    """The value against its target and what it calls for, for `kubectl describe`."""


@dataclass(frozen=True)
class Unmeasured:
    """Why no signal could be read this pass."""

    message: str


def figure(value: float) -> str:
    """A figure for messages: at most two decimals, no trailing zeros (23.5, 8, 0.93)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def pods_word(count: int) -> str:
    return f"{count} pod" if count == 1 else f"{count} pods"


def _ratio_replicas(ready: int, ratio: float) -> int:
    # round() first: 3 * (8.8 / 8) is 3.3000000000000003 in floats; the HPA's float64
    # arithmetic has the same wrinkle, and no pod should hinge on the 16th digit.
    return math.ceil(round(ready * ratio, 9))


def queue_proposal(spec: AutoscalingSpec, value: float, pods: ServingPods) -> Proposal:
    """Requests in progress per replica against targetRequestsInProgressPerReplica."""
    target = spec.target_requests_in_progress_per_replica
    ratio = value / target
    current = pods.desired
    if abs(ratio - 1) <= spec.tolerance:
        replicas = current
    elif ratio > 1:
        replicas = max(current, _ratio_replicas(pods.ready, ratio))
    else:
        replicas = min(current, _ratio_replicas(pods.ready, ratio))
    return Proposal(
        REQUESTS_IN_PROGRESS,
        replicas,
        f"requests in progress per replica {figure(value)} (target {figure(target)}) calls for "
        f"{pods_word(replicas)}",
    )


def gpu_proposal(spec: AutoscalingSpec, value: float, pods: ServingPods) -> Proposal:
    """GPU memory used ratio against gpuMemoryHighWatermark."""
    watermark = spec.gpu_memory_high_watermark
    if value <= watermark:
        return Proposal(
            GPU_MEMORY,
            None,
            f"GPU memory used {figure(value)} is within its high watermark {figure(watermark)}",
        )
    current = pods.desired
    # A watermark of 0 means "any use at all is too much": every reading pushes up.
    ratio = value / watermark if watermark > 0 else math.inf
    if ratio - 1 <= spec.tolerance:
        replicas = current
        verb = "keeps"
    else:
        by_ratio = pods.ready + 1 if math.isinf(ratio) else _ratio_replicas(pods.ready, ratio)
        replicas = max(current + 1, by_ratio)
        verb = "calls for"
    return Proposal(
        GPU_MEMORY,
        replicas,
        f"GPU memory used {figure(value)} (high watermark {figure(watermark)}) {verb} "
        f"at least {pods_word(replicas)}",
    )


def slo_proposal(spec: AutoscalingSpec, miss: SloMiss, pods: ServingPods) -> Proposal:
    """The p99 above its objective, once missed for scaleUpOnSloMissAfterSeconds: the HPA's
    ratio (p99 / objective) and at least one pod more, beyond tolerance; within tolerance
    it keeps the count. Like GPU memory it only ever pushes up."""
    after = spec.scale_up_on_slo_miss_after_seconds or 0
    ratio = miss.p99_seconds / miss.objective_seconds
    figures = (
        f"p99 {figure(miss.p99_seconds * 1e3)} ms (objective "
        f"{figure(miss.objective_seconds * 1e3)} ms)"
    )
    if miss.missed_for_seconds < after:
        return Proposal(
            SLO_MISS, None, f"{figures} not yet missed for scaleUpOnSloMissAfterSeconds {after}"
        )
    figures += f" missed for scaleUpOnSloMissAfterSeconds {after}"
    current = pods.desired
    if ratio - 1 <= spec.tolerance:
        return Proposal(SLO_MISS, current, f"{figures} keeps at least {pods_word(current)}")
    replicas = max(current + 1, _ratio_replicas(pods.ready, ratio))
    return Proposal(SLO_MISS, replicas, f"{figures} calls for at least {pods_word(replicas)}")


def propose(
    spec: AutoscalingSpec,
    signals: ScalingSignals,
    pods: ServingPods,
    slo_miss: SloMiss | None = None,
) -> tuple[Proposal, ...] | Unmeasured:
    """Every signal's recommendation (requests in progress first), or why none could be read."""
    if signals.error:
        return Unmeasured(f"The metrics could not be read: {signals.error}")
    if pods.ready <= 0:
        starting = f" ({pods.starting} starting)" if pods.starting else ""
        return Unmeasured(f"No serving pod is ready to measure{starting}")
    queue, gpu = signals.requests_in_progress_per_replica, signals.gpu_memory_used_ratio
    if queue is None and gpu is None:
        return Unmeasured(
            "Neither the requests in progress nor GPU memory could be read from the pods"
        )
    proposals: list[Proposal] = []
    if queue is not None:
        proposals.append(queue_proposal(spec, queue, pods))
    else:
        proposals.append(
            Proposal(
                REQUESTS_IN_PROGRESS, None, "requests in progress per replica could not be read"
            )
        )
    if gpu is not None:
        proposals.append(gpu_proposal(spec, gpu, pods))
    if slo_miss is not None and spec.scale_up_on_slo_miss_after_seconds is not None:
        proposals.append(slo_proposal(spec, slo_miss, pods))
    return tuple(proposals)
