"""A recorded burst replayed through the autoscaler's `recommend`, against simulated
serving pods: the trace replay that `tests/operator/scaling/test_scaling_trace_replay.py` checks
and `tests/benchmarks/autoscaling_trace_replay.py` prints as a table.

The model, kept small enough to reason about:

- Load: open-loop arrivals (clients do not wait for each other), `idle_rps` requests/s,
  then `burst_factor` times that for `burst_seconds`, then idle again.
- Pods: each ready pod serves up to `throughput_rps` requests/s, each request taking
  `service_seconds` when it does not wait (so a pod holds at most throughput x service
  requests in flight); a pod is ready `startup_seconds` after it is created; the
  Deployment creates pods at once and deletes starting pods first, then the newest.
- Queue: one fluid count N of requests queued or in flight over the ready pods (the
  Service spreads them evenly): it gains the arrivals and loses min(N / service_seconds,
  ready x throughput_rps) per second; beyond ready x (in flight + `max_queue_per_pod`)
  arrivals are refused (the runtime's bounded admission answers 503). The autoscaler reads
  N / ready as the queue depth per replica, as the runtime's gauges give it (queued plus
  in flight, over the ready pods); no GPU signal (CPU pods).
- The operator: `recommend` is called every `pass_seconds` (the resync), its history
  carried from pass to pass, and the Deployment set to what it returns.

The figures (`Outcome`): pods needed (the count at which the burst's queue depth per
replica is at target), time from the burst's start until that many are ready, overshoot
(the most pods ever set over those needed), direction changes of the count, time from the
burst's end until the count is back at minReplicas, the share of the burst's requests
refused, and the pod-minutes spent. Everything is deterministic: same setup, same figures.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.scaling.recommend import recommend
from kubeinfer.operator.state.scaling_inputs import ScalingHistory, ScalingSignals, ServingPods

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Workload:
    """Idle, a burst of `burst_factor` times the idle load, idle again."""

    idle_rps: float = 16.0
    burst_factor: float = 8.0
    burst_start_seconds: float = 120.0
    burst_seconds: float = 300.0
    total_seconds: float = 1500.0

    @property
    def burst_end_seconds(self) -> float:
        return self.burst_start_seconds + self.burst_seconds

    def rate(self, t: float) -> float:
        """Arrivals per second at `t`."""
        bursting = self.burst_start_seconds <= t < self.burst_end_seconds
        return self.idle_rps * (self.burst_factor if bursting else 1.0)


@dataclass(frozen=True)
class PodModel:
    """How a serving pod behaves."""

    throughput_rps: float = 20.0
    service_seconds: float = 0.5
    startup_seconds: float = 60.0
    max_queue_per_pod: int = 1024
    """The runtime's default batching.maxQueueSize."""

    @property
    def in_flight(self) -> float:
        return self.throughput_rps * self.service_seconds


@dataclass(frozen=True)
class Setup:
    """One replay: the autoscaling spec, the load, the pods and the operator's pace."""

    spec: AutoscalingSpec
    workload: Workload = field(default_factory=Workload)
    pod: PodModel = field(default_factory=PodModel)
    pass_seconds: float = 15.0
    pass_offset_seconds: float = 7.0
    """When the first pass runs: the burst starts at a multiple of 15 s, so an offset of
    7 s puts each pass 7 s into the 15 s that follow (a burst starts anywhere between
    two passes; the middle is the typical case)."""
    tick_seconds: float = 0.05


@dataclass(frozen=True)
class Sample:
    """What one pass saw and decided."""

    t: float
    desired: int
    ready: int
    starting: int
    requests_in_progress_per_replica: float | None
    replicas: int
    reason: str


@dataclass(frozen=True)
class Outcome:
    """The figures of one replay."""

    needed: int
    time_to_capacity_seconds: float | None
    peak_replicas: int
    direction_changes: int
    back_to_min_seconds: float | None
    refused_share: float
    pod_minutes: float
    """Pods set, integrated over the replay: what the capacity cost."""
    samples: tuple[Sample, ...]

    @property
    def overshoot(self) -> float:
        return self.peak_replicas / self.needed


def needed_pods(setup: Setup) -> int:
    """Pods at which the burst's queue depth per replica is at its target."""
    burst_rps = setup.workload.idle_rps * setup.workload.burst_factor
    in_system = burst_rps * setup.pod.service_seconds
    return math.ceil(round(in_system / setup.spec.target_requests_in_progress_per_replica, 9))


def direction_changes(counts: list[int]) -> int:
    """How often the count turned from rising to falling or back."""
    changes, last = 0, 0
    for before, after in itertools.pairwise(counts):
        step = (after > before) - (after < before)
        if step and last and step != last:
            changes += 1
        last = step or last
    return changes


def replay(setup: Setup) -> Outcome:
    """Runs the load against the pods, the autoscaler deciding every pass. Time runs in
    whole ticks, so a pod becomes ready exactly on the tick its startup ends."""
    spec, workload, pod = setup.spec, setup.workload, setup.pod
    dt = setup.tick_seconds
    startup_ticks = round(pod.startup_seconds / dt)
    pass_ticks = round(setup.pass_seconds / dt)
    created: list[int] = [-startup_ticks] * spec.min_replicas  # serving before the replay
    in_system = workload.idle_rps * pod.service_seconds
    history = ScalingHistory()
    samples: list[Sample] = []
    counts = [len(created)]
    needed = needed_pods(setup)
    time_to_capacity: float | None = None
    back_to_min: float | None = None
    refused = burst_arrivals = pod_seconds = 0.0
    next_pass = round(setup.pass_offset_seconds / dt)
    for tick in range(round(workload.total_seconds / dt)):
        t = tick * dt
        ready = sum(1 for c in created if tick - c >= startup_ticks)
        if tick >= next_pass:
            next_pass += pass_ticks
            starting_ages = [(tick - c) * dt for c in created if tick - c < startup_ticks]
            pods = ServingPods(
                desired=len(created),
                ready=ready,
                starting=len(starting_ages),
                oldest_starting_age_seconds=max(starting_ages) if starting_ages else None,
                startup_seconds=pod.startup_seconds,
            )
            depth = in_system / ready if ready else None
            result = recommend(
                spec, history, ScalingSignals(depth), pods, T0 + timedelta(seconds=t)
            )
            history = result.history
            samples.append(
                Sample(t, len(created), ready, len(starting_ages), depth, result.replicas,
                       result.limited[1])
            )  # fmt: skip
            created = _scaled(created, result.replicas, tick, startup_ticks)
            counts.append(len(created))
        if time_to_capacity is None and t >= workload.burst_start_seconds and ready >= needed:
            time_to_capacity = t - workload.burst_start_seconds
        if t >= workload.burst_end_seconds:
            if len(created) != spec.min_replicas:
                back_to_min = None  # (again) above the minimum: not back yet
            elif back_to_min is None:
                back_to_min = t - workload.burst_end_seconds
        pod_seconds += len(created) * dt
        arrivals = workload.rate(t) * dt
        capacity = ready * (pod.in_flight + pod.max_queue_per_pod)
        admitted = max(0.0, min(arrivals, capacity - in_system))
        served = min(in_system / pod.service_seconds, ready * pod.throughput_rps) * dt
        in_system = max(0.0, in_system + admitted - served)
        if workload.burst_start_seconds <= t < workload.burst_end_seconds:
            burst_arrivals += arrivals
            refused += arrivals - admitted
    return Outcome(
        needed=needed,
        time_to_capacity_seconds=time_to_capacity,
        peak_replicas=max(counts),
        direction_changes=direction_changes(counts),
        back_to_min_seconds=back_to_min,
        refused_share=refused / burst_arrivals if burst_arrivals else 0.0,
        pod_minutes=pod_seconds / 60,
        samples=tuple(samples),
    )


def _scaled(created: list[int], replicas: int, tick: int, startup_ticks: int) -> list[int]:
    """The pods after the Deployment is set to `replicas`: new ones created now; removed
    ones starting first, then the newest ready (as the ReplicaSet controller picks)."""
    if replicas >= len(created):
        return created + [tick] * (replicas - len(created))
    kept_first = sorted(created, key=lambda c: (tick - c < startup_ticks, c))
    return kept_first[:replicas]


STARTUPS = (30.0, 60.0, 120.0)
"""The startup times the replay compares (seconds from pod creation to ready)."""


def burst_setup(
    startup_seconds: float,
    aware: bool,
    *,
    max_queue_per_pod: int = 64,
    burst_factor: float = 8.0,
    max_replicas: int = 32,
    pass_offset_seconds: float = 7.0,
) -> Setup:
    """The recorded burst: 16 requests/s (one pod at its target of 8 queued or running),
    8x that for 5 minutes, idle again; pods serving 20 requests/s at 0.5 s each; the
    HPA's default policies (AutoscalingSpec's defaults), minReplicas 1. A queue of 64 per
    pod is about 3 s of a pod's work, as a latency-bound runtime sets maxQueueSize; the
    runtime's default 1024 is the deep-queue case."""
    spec = AutoscalingSpec(
        enabled=True, min_replicas=1, max_replicas=max_replicas, count_starting_pods=aware
    )
    return Setup(
        spec=spec,
        workload=Workload(burst_factor=burst_factor),
        pod=PodModel(startup_seconds=startup_seconds, max_queue_per_pod=max_queue_per_pod),
        pass_offset_seconds=pass_offset_seconds,
    )
