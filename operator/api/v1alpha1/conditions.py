"""Status conditions, as Kubernetes' metav1.Condition describes them.

One enum of types and one of reasons feed both the code and the schema. `set_condition`
keeps `lastTransitionTime` when a condition's status has not changed, so a reconcile
that finds nothing new writes an identical status (and the operator patches nothing).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from kubeinfer.contract.api_model import ApiModel
from pydantic import Field


class ConditionType(StrEnum):
    READY = "Ready"
    ENGINE_READY = "EngineReady"
    AVAILABLE = "Available"
    PROGRESSING = "Progressing"
    SHADOW_PASSED = "ShadowPassed"
    DEGRADED = "Degraded"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"
    SCALING_ACTIVE = "ScalingActive"
    SCALING_LIMITED = "ScalingLimited"
    SLO_MET = "SLOMet"
    """Present while spec.slo sets an objective: whether the serving pods' p99 meets it."""
    ANSWERS_CORRECT = "AnswersCorrect"
    """Present while spec.knownAnswers turns the operator's checks on: whether every
    serving pod checked answered its known-answer set correctly."""
    SCALED_TO_ZERO = "ScaledToZero"
    """Present while autoscaling.minReplicas is 0: whether the object is at zero pods (its
    Service's traffic going to the activator), and what would keep it from going there or
    wake it."""
    CACHE_ATTACH_RISK = "CacheAttachRisk"
    """Present (True) only while the engine cache claim is ReadWriteOnce and the pods that
    mount it may land on more than one node."""


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Reason(StrEnum):
    """Every reason the operator writes: CamelCase, machine-readable, stable."""

    RECONCILING = "Reconciling"
    INVALID_SPEC = "InvalidSpec"
    FORBIDDEN = "Forbidden"
    ENGINE_PINNED = "EnginePinned"
    ENGINE_BUILT = "EngineBuilt"
    ENGINE_BUILDING = "EngineBuilding"
    ENGINE_BUILD_FAILED = "EngineBuildFailed"
    DEPLOYMENT_AVAILABLE = "DeploymentAvailable"
    DEPLOYMENT_UNAVAILABLE = "DeploymentUnavailable"
    ROLLING_OUT = "RollingOut"
    ROLLOUT_COMPLETE = "RolloutComplete"
    ROLLOUT_STALLED = "RolloutStalled"
    PODS_NOT_READY = "PodsNotReady"
    """The runtime's template is rolled out and some of its pods are not ready (lost with
    a node, evicted by a drain, or new with a scale-up): they are being started."""
    ENGINE_INCOMPATIBLE = "EngineIncompatible"
    """Runtime pods refuse their engine (exit code 3): it was built by another backend
    version than their image has."""
    RUNTIME_FAILING = "RuntimeFailing"
    """Runtime pods cannot start for another reason (another exit code, an image that
    cannot be pulled)."""
    WAITING_FOR_ENGINE = "WaitingForEngine"
    NO_GPU_NODES = "NoGpuNodes"
    """A mixed GPU fleet has no eligible GPU node: no engine can be built anywhere."""
    SHADOW_RUNNING = "ShadowRunning"
    SHADOW_PASSED = "ShadowPassed"
    SHADOW_FAILED = "ShadowFailed"
    SHADOW_ABORTED = "ShadowAborted"
    SHADOW_PROMOTED = "ShadowPromoted"
    SLO_MET = "SLOMet"
    SLO_MISSED = "SLOMissed"
    SLO_UNMEASURED = "SLOUnmeasured"
    QUALITY_DRIFT = "QualityDrift"
    """The quality watch found the served engine's answers drifting from its reference's."""
    QUALITY_HEALTHY = "QualityHealthy"
    QUALITY_FALLBACK = "QualityFallback"
    """Serving runs the reference-precision engine in place of the spec's, which drifted."""
    MEAN_ABSOLUTE_DIFFERENCE_TOO_LARGE = "MeanAbsoluteDifferenceTooLarge"
    OUTPUT_MISMATCH = "OutputMismatch"
    """The shadow verdict's reasons from here to MANUAL_ABORT: a candidate's outputs differ
    from the serving engine's in name, shape or datatype."""
    DIFFERENCE_TOO_LARGE = "DifferenceTooLarge"
    TOP1_AGREEMENT_TOO_LOW = "Top1AgreementTooLow"
    LATENCY_REGRESSION = "LatencyRegression"
    LATENCY_NOT_MEASURED = "LatencyNotMeasured"
    INSUFFICIENT_SAMPLES = "InsufficientSamples"
    THRESHOLDS_MET = "ThresholdsMet"
    MANUAL_PROMOTION = "ManualPromotion"
    MANUAL_ABORT = "ManualAbort"
    PROMOTING = "Promoting"
    NO_CANDIDATE = "NoCandidate"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    # Autoscaling (the names Kubernetes' HorizontalPodAutoscaler uses, where it has one)
    VALID_METRIC_FOUND = "ValidMetricFound"
    REPLICAS_IGNORED = "ReplicasIgnored"
    DESIRED_WITHIN_RANGE = "DesiredWithinRange"
    TOO_FEW_REPLICAS = "TooFewReplicas"
    TOO_MANY_REPLICAS = "TooManyReplicas"
    SCALE_UP_LIMIT = "ScaleUpLimit"
    SCALE_DOWN_LIMIT = "ScaleDownLimit"
    SCALE_UP_STABILIZED = "ScaleUpStabilized"
    SCALE_DOWN_STABILIZED = "ScaleDownStabilized"
    PODS_STARTING = "PodsStarting"
    GPU_MEMORY_HIGH = "GpuMemoryHigh"
    IDLE = "Idle"
    """ScaledToZero True: no request for scaleToZeroAfterSeconds; the activator holds the
    next ones."""
    RECENTLY_ACTIVE = "RecentlyActive"
    SCHEDULE_OPEN = "ScheduleOpen"
    WAKE_QUERY_ABOVE_THRESHOLD = "WakeQueryAboveThreshold"
    REQUESTS_HELD = "RequestsHeld"
    ACTIVATOR_NOT_ROUTING = "ActivatorNotRouting"
    SCALED_FROM_ZERO = "ScaledFromZero"
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    READ_WRITE_ONCE_ACROSS_NODES = "ReadWriteOnceAcrossNodes"
    AS_EXPECTED = "AsExpected"
    ANSWERS_CORRECT = "AnswersCorrect"
    ANSWERS_UNCHECKED = "AnswersUnchecked"
    """No serving pod has answered its known-answer set yet."""
    KNOWN_ANSWERS_FAILED = "KnownAnswersFailed"
    ANSWERS_DIFFER_FROM_PEERS = "AnswersDifferFromPeers"
    READY = "Ready"
    NOT_READY = "NotReady"


ConditionValue = tuple[ConditionStatus, Reason, str]
"""(status, reason, message) of one condition, as the deciders return it."""


class Condition(ApiModel):
    """One aspect of the InferenceDeployment's state (metav1.Condition)."""

    type: ConditionType
    """Which aspect: Ready (the summary, for `kubectl wait --for=condition=Ready`), EngineReady,
    Available, Progressing, ShadowPassed, Degraded, Reconciling and Stalled (the
    abnormal-true pair kstatus, and so Flux, reads), ScalingActive and ScalingLimited (the
    autoscaler's, as an HPA reports them)."""

    status: ConditionStatus
    """True, False or Unknown."""

    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """Why the condition last changed, as one CamelCase word."""

    message: str = Field(default="", max_length=32768)
    """What happened, for humans."""

    last_transition_time: datetime
    """When the status last changed from one value to another."""

    observed_generation: int = Field(default=0, ge=0)
    """The metadata.generation the condition was computed from."""


def set_condition(
    conditions: list[Condition],
    type: ConditionType,
    status: ConditionStatus,
    reason: Reason | str,
    message: str,
    generation: int,
    now: datetime,
) -> list[Condition]:
    """Returns `conditions` with `type` set; the transition time moves only on a change of
    status, and the order of the list is kept (new types are appended)."""
    new = Condition(
        type=type,
        status=status,
        reason=str(reason),
        message=message,
        last_transition_time=now,
        observed_generation=generation,
    )
    for index, existing in enumerate(conditions):
        if existing.type == type:
            if existing.status == status:
                new = new.model_copy(update={"last_transition_time": existing.last_transition_time})
            return [*conditions[:index], new, *conditions[index + 1 :]]
    return [*conditions, new]
