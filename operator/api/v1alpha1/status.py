"""The InferenceDeployment status: what the operator observed, and what kubectl reads."""

from __future__ import annotations

from typing import Literal

from kubeinfer.operator.api.v1alpha1.conditions import Condition
from kubeinfer.operator.api.v1alpha1.enums import Backend, Phase, Precision
from kubeinfer.runtime.config import ApiModel
from pydantic import Field


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


class VersionStatus(ApiModel):
    """A model version and the engine it runs."""

    version: str | None = Field(default=None, max_length=63)
    """The model version."""

    engine_digest: str | None = Field(default=None, max_length=71)
    """The engine's digest."""


class CandidateStatus(VersionStatus):
    """The version under shadow test."""

    samples: int = Field(default=0, ge=0)
    """Mirrored requests compared so far."""

    verdict: Literal["Pending", "Passed", "Failed"] = "Pending"
    """Outcome of the shadow test."""


class MetricsStatus(ApiModel):
    """Load figures last read from Prometheus."""

    queue_depth: float | None = Field(default=None, ge=0)
    """Requests queued across all pods."""

    p99_milliseconds: float | None = Field(default=None, ge=0)
    """p99 request latency in milliseconds."""

    gpu_memory_used_ratio: float | None = Field(default=None, ge=0, le=1)
    """Highest GPU memory used ratio among the pods (0..1)."""


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
    Reconciling and Stalled (for kstatus)."""

    engine: EngineStatus | None = None
    """The current generation's engine."""

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
    """Load figures from Prometheus."""
