"""How a new model version or engine replaces the serving one: the spec's `rollout`, with
the shadow test's settings and thresholds."""

from __future__ import annotations

from kubeinfer.contract.api_model import ApiModel
from kubeinfer.contract.runtime_config import MirrorPolicy
from kubeinfer.operator.api.v1alpha1.enums import RolloutStrategy
from pydantic import Field


class ShadowThresholds(ApiModel):
    """When a shadowed candidate is good enough to promote. Each is checked on the
    aggregates of every mirrored request compared so far, over all serving pods."""

    max_absolute_output_difference: float = Field(default=0.01, ge=0)
    """Largest acceptable absolute difference between one element of the candidate's output
    and the serving engine's, over every compared request. A request whose outputs differ
    in name, shape or datatype breaks it whatever its value. Broken at any time, the
    candidate fails at once (the largest difference can only grow)."""

    min_top1_agreement: float = Field(default=0.99, ge=0, le=1)
    """Smallest acceptable share of compared rows whose top-1 class (argmax over the last
    axis of outputs with at least 2 classes) agrees with the serving engine's (0..1).
    Checked once minSamples requests are compared; not applicable to models without such
    outputs."""

    max_p99_latency_regression_percent: float = Field(default=10, ge=0, le=1000)
    """Largest acceptable increase of the candidate's p99 latency over the serving
    engine's on the same mirrored requests, in percent. Both are the servers' own time
    for a request; the candidate receives only the mirrored share of the traffic, so its
    batches are smaller than serving's. Checked once minSamples requests are compared."""


class ShadowSpec(ApiModel):
    """Shadow testing: the serving pods mirror a share of their live requests to the
    candidate, compare its answers with their own, and the operator promotes it or rolls it
    back on the thresholds."""

    traffic_percent: int = Field(default=10, ge=1, le=100)
    """Share of live requests mirrored to the candidate, in percent."""

    replicas: int = Field(default=1, ge=1, le=100)
    """Candidate pods; fixed for the shadow's duration (autoscaling never changes it)."""

    min_samples: int = Field(default=1000, ge=1, le=10_000_000)
    """Mirrored requests compared before a verdict."""

    max_duration_seconds: int = Field(default=3600, ge=1, le=604_800)
    """Longest a shadow test runs, from the candidate's start; a candidate without
    minSamples compared requests by then fails (and is rolled back)."""

    thresholds: ShadowThresholds = Field(default_factory=ShadowThresholds)
    """Promotion thresholds."""

    mirror: MirrorPolicy = Field(default_factory=MirrorPolicy)
    """How the serving pods mirror: queue, concurrency and timeout. Mirrored work never
    delays or fails a live request; what does not fit is dropped and counted."""


class RolloutSpec(ApiModel):
    """How a new model version or engine replaces the serving one."""

    strategy: RolloutStrategy = RolloutStrategy.ROLLING
    """Rolling (replace pods as soon as the new engine is ready) or Shadow (run the new
    engine as a candidate beside the serving one, mirror live traffic to it, compare the
    answers request by request, then promote or roll back on the thresholds). The first
    engine of an InferenceDeployment has nothing to be compared with and is deployed
    directly."""

    shadow: ShadowSpec = Field(default_factory=ShadowSpec)
    """Shadow test settings, used with strategy Shadow."""
