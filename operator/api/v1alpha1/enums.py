"""The InferenceDeployment API's enumerations, shared by the spec and the status."""

from __future__ import annotations

from enum import StrEnum


class Backend(StrEnum):
    TENSORRT = "tensorrt"
    ONNXRUNTIME = "onnxruntime"


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


class RolloutStrategy(StrEnum):
    SHADOW = "Shadow"
    ROLLING = "Rolling"


class Phase(StrEnum):
    PENDING = "Pending"
    BUILDING_ENGINE = "BuildingEngine"
    DEPLOYING = "Deploying"
    SHADOWING = "Shadowing"
    READY = "Ready"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class ShadowVerdict(StrEnum):
    PENDING = "Pending"
    PASSED = "Passed"
    FAILED = "Failed"
    ABORTED = "Aborted"
    PROMOTED = "Promoted"


class DriftAction(StrEnum):
    """What the operator does when the quality watch finds drift."""

    ALERT = "Alert"
    """Degraded=True with reason QualityDrift, a Warning Event, the figures in the status;
    serving is untouched."""

    FALLBACK = "Fallback"
    """As Alert, and serving rolls to the model built at the watch's referencePrecision,
    where it stays until the drifting engine's inputs change or onDrift changes."""


class QualityState(StrEnum):
    """Where the quality watch stands (`status.qualityWatch.state`)."""

    PENDING = "Pending"
    HEALTHY = "Healthy"
    DRIFTING = "Drifting"
    INSUFFICIENT_SAMPLES = "InsufficientSamples"


class QualityGroupKind(StrEnum):
    """What a quality tally counts: all traffic, one reference top-1 class, one slice."""

    OVERALL = "overall"
    CLASS = "class"
    SLICE = "slice"
