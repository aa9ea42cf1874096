"""The InferenceDeployment status: what the operator observed, and what kubectl reads."""

from __future__ import annotations

from datetime import datetime

from kubeinfer.contract.api_model import ApiModel
from kubeinfer.operator.api.v1alpha1.conditions import Condition
from kubeinfer.operator.api.v1alpha1.enums import (
    Backend,
    Phase,
    Precision,
    QualityGroupKind,
    QualityState,
    ShadowVerdict,
)
from kubeinfer.operator.api.v1alpha1.gpu_fleet import ProductEngineStatus
from pydantic import Field


class EngineBatchingStatus(ApiModel):
    """Whether the model batches, as its build found by trying the built engine with one
    row and with two different rows, compared with the rows run alone."""

    batches: bool | None = None
    """True: rows run together are answered as alone, and the runtime batches requests;
    false: they are not (a tokenizer in the graph that reads one text per run, a graph that
    mixes rows), and the runtime serves one request per run; unset: not found out at build
    (`reason` says why): the runtime finds out at start."""

    max_batch_size: int | None = Field(default=None, ge=1)
    """The maxBatchSize the runtime serves with: runtime.batching.maxBatchSize where the
    model batches, 1 where it does not (the spec's is set aside); unset where the runtime
    finds out at start."""

    reason: str = Field(default="", max_length=1024)
    """How the rows differed, or why it was not found out; empty where the model batches."""


class EngineStatus(ApiModel):
    """The engine the current generation uses."""

    digest: str | None = Field(default=None, max_length=71)
    """Content digest of the engine in the cache (sha256:...)."""

    backend: Backend | None = None
    """Backend the engine was built with."""

    precision: Precision | None = None
    """Precision the engine was built with."""

    target: str | None = Field(default=None, max_length=64)
    """What the engine was built for: `cpu`, or the GPU's compute capability (sm_90)."""

    max_batch_size: int | None = Field(default=None, ge=1)
    """Largest batch the engine's profile accepts."""

    build_key: str | None = Field(default=None, max_length=64)
    """Hash of the engine inputs the digest was built from: a digest is reused (never
    rebuilt) while the inputs hash the same, even after its build Job is gone."""

    batching: EngineBatchingStatus | None = None
    """Whether the model batches and the maxBatchSize the runtime serves with, as the build
    found (unset until it is built, and for a pinned engine: the runtime finds out at
    start, and says so in its log and /v2/batching)."""


class VersionStatus(ApiModel):
    """A model version and the engine it runs."""

    version: str | None = Field(default=None, max_length=63)
    """The model version."""

    engine_digest: str | None = Field(default=None, max_length=71)
    """The engine's digest."""


class CandidateStatus(VersionStatus):
    """The version under shadow test, or the last one tested. A Failed or Aborted candidate
    stays here, so the same engine is not tried again until the spec changes."""

    verdict: ShadowVerdict = ShadowVerdict.PENDING
    """Pending (mirroring and comparing), Passed (promotion under way), Failed (a threshold
    broke, or maxDurationSeconds passed without minSamples: rolled back), Aborted (by
    `kubeinfer abort`, or replaced by a newer spec) or Promoted (it serves now)."""

    reason: str = Field(default="", max_length=128)
    """Why the verdict is what it is, as one CamelCase word."""

    message: str = Field(default="", max_length=4096)
    """The verdict's figures against the thresholds, for humans."""

    start_time: datetime | None = None
    """When the candidate's shadow started (maxDurationSeconds counts from here)."""

    trial: str = Field(default="", max_length=64)
    """Hash of what was tested: the candidate's version and engine and the shadow
    settings. A Failed or Aborted candidate is tried again only when this changes."""

    samples: int = Field(default=0, ge=0)
    """Mirrored requests compared so far, over all serving pods."""

    mismatches: int = Field(default=0, ge=0)
    """Compared requests whose outputs differed in name, shape or datatype."""

    dropped: int = Field(default=0, ge=0)
    """Requests the mirror could not take (its queue was full)."""

    candidate_errors: int = Field(default=0, ge=0)
    """Mirrored requests the candidate answered with an error, or not within the mirror's
    timeout."""

    top1_agreement: float | None = Field(default=None, ge=0, le=1)
    """Share of compared rows whose top-1 class agreed (0..1)."""

    max_absolute_difference: float | None = Field(default=None, ge=0)
    """Largest absolute difference of one output element, candidate against serving."""

    serving_p99_milliseconds: float | None = Field(default=None, ge=0)
    """p99 latency of the serving pods on the mirrored requests."""

    candidate_p99_milliseconds: float | None = Field(default=None, ge=0)
    """p99 latency of the candidate on the same requests, measured the same way."""


class MetricsStatus(ApiModel):
    """The load figures the operator last read from the serving pods' metrics."""

    requests_in_progress_per_replica: float | None = Field(default=None, ge=0)
    """Requests queued or running per ready serving pod (the mean over the pods)."""

    gpu_memory_used_ratio: float | None = Field(default=None, ge=0, le=1)
    """Highest GPU memory used ratio among the serving pods' GPUs (0..1)."""

    p99_milliseconds: float | None = Field(default=None, ge=0)
    """p99 request latency of the serving pods in milliseconds."""

    read_time: datetime | None = None
    """When the figures were read as they stand: a later read of the same figures keeps
    it (the status is not written for the time alone)."""


class SloStatus(ApiModel):
    """The serving pods' p99 against spec.slo, as last read."""

    objective_p99_milliseconds: float = Field(gt=0)
    """spec.slo.p99LatencyMilliseconds."""

    p99_milliseconds: float | None = Field(default=None, ge=0)
    """The serving pods' p99 request latency (arrival to response); unset when it could not
    be measured (no request answered, the metrics unreadable)."""

    window_seconds: int | None = Field(default=None, ge=1)
    """The window the p99 covers; unset: since each serving pod started (the direct read of
    the pods' metrics has no past)."""

    met: bool | None = None
    """Whether the p99 is within the objective; unset when not measured."""

    missed_since: datetime | None = None
    """When the p99 was first read above the objective, in the miss going on now."""

    last_evaluated: datetime | None = None
    """When the operator last read the p99 against the objective."""


class CostStatus(ApiModel):
    """The cost of 1,000 inferences over the last window: what the serving pods on priced
    nodes cost in it (each pod's share of its node times the node's price per hour, for the
    seconds it ran, idle or not) over the inferences they answered in it. Written where the
    operator's settings price nodes (cost.pricePerNodeHour), in their currency."""

    per_thousand_inferences: float | None = Field(default=None, ge=0)
    """1000 x the pods' cost in the window / the inferences they answered in it; unset when
    they answered none (an idle window has a cost but no price per inference)."""

    window_seconds: int = Field(ge=1)
    """The window: the last cost.windowSeconds up to lastEvaluated."""

    inferences: int = Field(ge=0)
    """Inference requests the priced pods answered (HTTP 200) in the window."""

    pod_hours: float = Field(ge=0)
    """Hours the priced pods ran in the window, added up (two pods the whole hour: 2);
    time with no pod at all adds nothing."""

    last_evaluated: datetime
    """When the operator computed these figures (again every cost.refreshSeconds)."""


class AutoscalingStatus(ApiModel):
    """What the autoscaler decided last, and what it knows of the pods."""

    desired_replicas: int | None = Field(default=None, ge=0)
    """The count the signals call for now, within [minReplicas, maxReplicas], before the
    stabilization windows and the rate limits smooth it (what `replicas` heads for)."""

    last_scale_time: datetime | None = None
    """When the autoscaler last changed the runtime Deployment's replicas."""

    pod_startup_seconds: float | None = Field(default=None, ge=0)
    """How long the serving pods took from creation to ready (the median of the recent
    ones), measured from the pods: how long capacity takes to arrive."""


class QualityGroupRef(ApiModel):
    """A sub-population the quality watch judges: a reference top-1 class or a slice."""

    kind: QualityGroupKind
    """overall, class (the reference's top-1 class index) or slice (the slice header's
    value, or `other`)."""

    name: str = Field(default="", max_length=64)
    """The class or the slice; empty for overall."""


class QualityGroupStatus(QualityGroupRef):
    """One group's figures over the window."""

    samples: int = Field(ge=0)
    """Compared rows in the window."""

    top1_agreement: float = Field(ge=0, le=1)
    """Share of them whose top-1 class agreed with the reference's."""

    threshold: float = Field(ge=0, le=1)
    """What it is judged against: the lower of its floor and its build baseline's bound."""


class QualityFallbackStatus(ApiModel):
    """Serving fell back to the reference-precision engine (onDrift: Fallback): the
    operator's memory of the episode, so it holds until the drifted engine's inputs
    change, whatever the watch reads meanwhile."""

    precision: Precision
    """The fallback engine's precision (the watch's referencePrecision)."""

    engine_digest: str | None = Field(default=None, max_length=71)
    """The fallback engine; unset while it is being built."""

    drifted_engine_digest: str = Field(max_length=71)
    """The spec's engine that drifted."""

    drifted_build_key: str = Field(max_length=64)
    """Its engine inputs' key: the fallback holds while the spec's engine inputs are these."""

    since: datetime
    """When the operator decided to fall back."""

    drift: str = Field(default="", max_length=4096)
    """The watch's finding that led to it."""


class QualityWatchStatus(ApiModel):
    """The quality watch's last evaluation."""

    state: QualityState = QualityState.PENDING
    """Pending (the reference is being built or started, or no figure was read yet),
    Healthy, Drifting, or InsufficientSamples (fewer than minSamples compared rows)."""

    message: str = Field(default="", max_length=4096)
    """What the evaluation found, with its figures."""

    reference_engine_digest: str | None = Field(default=None, max_length=71)
    """The reference engine (the served model at referencePrecision)."""

    window_seconds: int = Field(default=0, ge=0)
    """The sliding window judged."""

    samples: int = Field(default=0, ge=0)
    """Compared rows in the window, over every serving pod."""

    effective_sample_percent: float | None = Field(default=None, ge=0, le=100)
    """The share of answered requests compared with the reference over the window, in
    percent: samplePercent, less what the reference could not keep up with (dropped,
    failed or late)."""

    top1_agreement: float | None = Field(default=None, ge=0, le=1)
    """Overall top-1 agreement with the reference in the window."""

    mean_absolute_difference: float | None = Field(default=None, ge=0)
    """Mean over compared requests of their largest absolute element difference."""

    worst_class: QualityGroupStatus | None = None
    """The class with the lowest agreement among those with minSamples rows."""

    worst_slice: QualityGroupStatus | None = None
    """The slice with the lowest agreement among those with minSamples rows."""

    drifting: list[QualityGroupRef] = Field(default_factory=list, max_length=64)
    """The groups found drifting: each recovers only once significantly back above its
    threshold, so the condition does not flap at the boundary."""

    mean_absolute_difference_too_large: bool = False
    """Whether the mean difference was above maxMeanAbsoluteDifference (with the same
    hysteresis)."""

    last_evaluated: datetime | None = None
    """When the operator last judged the window on figures that had changed: a pass that
    reads the figures already recorded leaves this status as it was."""

    engine_digest: str | None = Field(default=None, max_length=71)
    """The served engine these figures judge (a new engine starts a new watch)."""

    watching_since: datetime | None = None
    """When the watch began comparing that engine with the reference: the window never
    reaches back before it, so another engine's answers never count in its figures."""

    fallback: QualityFallbackStatus | None = None
    """Set while serving runs the reference-precision engine after drift (onDrift:
    Fallback)."""


class WrongAnswersStatus(ApiModel):
    """A pod taken out of serving because its engine answered wrong: its known-answer
    set failed, or its answers differed from its peers' on the same engine and hardware.
    The pod itself is kept (relabelled, out of its ReplicaSet) as evidence."""

    pod: str = Field(max_length=253)
    """The pod, still in the namespace (`kubectl logs` it)."""

    node: str = Field(default="", max_length=253)
    """The node it ran on."""

    gpu_product: str | None = Field(default=None, max_length=128)
    """The node's nvidia.com/gpu.product, on a GPU node."""

    gpu_uuid: str | None = Field(default=None, max_length=128)
    """The GPU's UUID, where the node's labels name one (nvidia.com/gpu.uuid)."""

    cpu_model: str | None = Field(default=None, max_length=256)
    """The node's CPU model as its labels name it (node feature discovery's
    cpu-model vendor, family and id), else its architecture."""

    engine_digest: str = Field(default="", max_length=71)
    """The engine it served."""

    reason: str = Field(max_length=64)
    """KnownAnswersFailed (its set failed) or AnswersDifferFromPeers."""

    output: str = Field(default="", max_length=256)
    """The output that answered wrong (empty where peers disagreed)."""

    probe: int | None = Field(default=None, ge=0)
    """The probe that answered worst (or first differed from its peers')."""

    error: float | None = Field(default=None, ge=0)
    """That probe's error (relative L2, or probes that differ for labels); unset where it
    was not finite (a NaN or infinity)."""

    tolerance: float | None = Field(default=None, ge=0)
    """The output's tolerance."""

    message: str = Field(default="", max_length=2048)
    """What the pod answered, in words."""

    detected: datetime
    """When the operator took it out of serving."""


class InferenceDeploymentStatus(ApiModel):
    """The observed state, written only by the operator."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation this status describes."""

    phase: Phase = Phase.PENDING
    """Pending, BuildingEngine, Deploying, Shadowing, Ready, Degraded or Failed."""

    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready (the summary), EngineReady, Available, Progressing, ShadowPassed, Degraded,
    Reconciling and Stalled (for kstatus), ScalingActive and ScalingLimited."""

    engine: EngineStatus | None = None
    """The current generation's engine (unset on a mixed GPU fleet: see engines)."""

    engines: list[ProductEngineStatus] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["gpuProduct"],
        },
    )
    """On a mixed GPU fleet: each eligible GPU product's engine, nodes and pods."""

    engines_ready: str | None = Field(default=None, max_length=32)
    """On a mixed GPU fleet: built engines/eligible GPU products, for `kubectl get`."""

    serving: VersionStatus | None = None
    """The version that serves live traffic."""

    candidate: CandidateStatus | None = None
    """The version under shadow test, if any."""

    replicas: int = Field(default=0, ge=0)
    """Desired runtime pods (the scale subresource reads this)."""

    ready_replicas: int = Field(default=0, ge=0)
    """Runtime pods ready to serve."""

    ready: str = Field(default="0/0", max_length=32)
    """readyReplicas/replicas, for `kubectl get`."""

    selector: str = Field(default="", max_length=1024)
    """Label selector of the runtime pods, for the scale subresource and HPAs."""

    metrics: MetricsStatus | None = None
    """The load figures last read from the serving pods' metrics (Prometheus, or the pods'
    own /metrics)."""

    autoscaling: AutoscalingStatus | None = None
    """The autoscaler's view, while autoscaling is enabled."""

    quality_watch: QualityWatchStatus | None = None
    """The quality watch's view, while the watch is enabled."""

    slo: SloStatus | None = None
    """The p99 against spec.slo, while an objective is set."""

    cost: CostStatus | None = None
    """The cost of 1,000 inferences over the last window, where the operator's settings
    price nodes."""

    wrong_answers: list[WrongAnswersStatus] = Field(default_factory=list, max_length=32)
    """Pods taken out of serving for wrong answers, newest first, while they exist."""

    suspect_nodes: list[str] = Field(default_factory=list, max_length=32)
    """Nodes where pods of different engines answered wrong: the node (its device, its
    CPU) is suspect rather than one engine."""
