"""The autoscaling section of the InferenceDeployment spec (`spec.autoscaling`)."""

from __future__ import annotations

from kubeinfer.contract.api_model import ApiModel, CrossFieldRule
from kubeinfer.operator.api.v1alpha1.wake_on import WakeOnSpec
from pydantic import Field


class AutoscalingSpec(ApiModel):
    """Scaling on requests in progress and GPU memory pressure, with the semantics of Kubernetes'
    HorizontalPodAutoscaler (tolerance, stabilization windows, rate limits per direction),
    and aware that runtime pods take time to load their engine."""

    cross_field_rules = (
        CrossFieldRule(
            cel="self.minReplicas <= self.maxReplicas",
            message="minReplicas must be at most maxReplicas",
            field="minReplicas",
            holds=lambda a: a.min_replicas <= a.max_replicas,
        ),
        CrossFieldRule(
            cel="!has(self.wakeOn) || !has(self.wakeOn.prometheus) || self.minReplicas == 0",
            message="wakeOn.prometheus wakes an object from zero pods: it needs minReplicas 0",
            field="wakeOn.prometheus",
            holds=lambda a: a.wake_on.prometheus is None or a.min_replicas == 0,
        ),
        CrossFieldRule(
            cel="!has(self.wakeOn) || !has(self.wakeOn.schedules) || "
            "self.wakeOn.schedules.all(s, !has(s.replicas) || s.replicas <= self.maxReplicas)",
            message="a schedule's replicas must be at most maxReplicas",
            field="wakeOn.schedules",
            holds=lambda a: all(s.replicas <= a.max_replicas for s in a.wake_on.schedules),
        ),
    )

    enabled: bool = False
    """Scale automatically; runtime.replicas (and `kubectl scale`) is then ignored, and a
    condition says so."""

    min_replicas: int = Field(default=1, ge=0, le=1000)
    """Fewest pods. 0 scales to zero: after scaleToZeroAfterSeconds without a request the
    serving pods are removed and the Service's traffic goes to the activator, which holds
    the next requests while a pod starts (docs/scale-to-zero.md); Ready stays True and the
    ScaledToZero condition says so. The autoscaler itself never goes below one pod: only
    the idle window takes the last one away."""

    scale_to_zero_after_seconds: int = Field(default=300, ge=10, le=7 * 24 * 3600)
    """With minReplicas 0: how long without a request answered or in progress before the
    last pod is removed."""

    wake_on: WakeOnSpec = Field(default_factory=WakeOnSpec)
    """Signals other than a held request that start pods: a Prometheus query (work waiting
    upstream; at zero only) and schedules (hours when traffic is known to come, a floor
    on the count during them, so a batch job does not wait for a cold start)."""

    max_replicas: int = Field(default=4, ge=1, le=1000)
    """Most pods."""

    target_requests_in_progress_per_replica: float = Field(default=8, gt=0, le=100_000)
    """Requests queued or running per ready pod that the autoscaler aims for (the mean over
    the serving pods): it calls for ready pods x depth / target, rounded up, as Kubernetes'
    HorizontalPodAutoscaler computes a pods metric."""

    gpu_memory_high_watermark: float = Field(default=0.9, ge=0, le=1)
    """GPU memory used ratio (0..1, the highest over the pods' GPUs) above which the
    autoscaler never removes a pod; above it by more than `tolerance`, it adds pods (ready
    pods x used / watermark, rounded up, and at least one). GPU memory never removes pods:
    the requests in progress do."""

    tolerance: float = Field(default=0.1, ge=0, le=1)
    """A signal within this relative distance of its target changes nothing (0.1: 10 %),
    so noise does not move the count."""

    scale_up_on_slo_miss_after_seconds: int | None = Field(default=None, ge=0, le=3600)
    """Also scale up once the p99 has been above spec.slo.p99LatencyMilliseconds for this
    long (the SLOMet condition False): ready pods x p99 / objective, rounded up, and at
    least one pod more. Like GPU memory, a met SLO never removes pods. Unset: the SLO is
    no scaling signal."""

    scale_up_stabilization_seconds: int = Field(default=0, ge=0, le=3600)
    """Scale up only to the lowest count recommended over this window."""

    scale_down_stabilization_seconds: int = Field(default=300, ge=0, le=3600)
    """Scale down only to the highest count recommended over this window (a restarted
    operator starts it over from the current count)."""

    scale_up_max_percent: int = Field(default=100, ge=1, le=10_000)
    """At most this many percent more pods per scaleUpPeriodSeconds (or
    scaleUpMaxPods, whichever allows more)."""

    scale_up_max_pods: int = Field(default=4, ge=1, le=1000)
    """At most this many more pods per scaleUpPeriodSeconds (or scaleUpMaxPercent,
    whichever allows more)."""

    scale_up_period_seconds: int = Field(default=15, ge=1, le=1800)
    """The period of the scale-up limits, counted from the pods set at its start."""

    scale_down_max_percent: int = Field(default=50, ge=1, le=100)
    """At most this many percent fewer pods per scaleDownPeriodSeconds."""

    scale_down_period_seconds: int = Field(default=60, ge=1, le=1800)
    """The period of the scale-down limit, counted from the pods set at its start."""

    count_starting_pods: bool = True
    """Count pods that are starting as capacity on its way: a scale-up commits to the count
    it heads for, and while its pods load their engine (counted on for up to twice the
    startup time measured from this object's pods, 300 s assumed before one was measured),
    and then while the queue that built meanwhile drains fast enough to be gone before
    another pod could start, the autoscaler adds no pods beyond that count (reason
    PodsStarting): that queue is not new demand, so a burst does not trigger a second
    scale-up before the first one's pods serve. A pod starting longer than that is not
    counted on. False: Kubernetes' HorizontalPodAutoscaler's behaviour."""
