"""`onDrift: Fallback`: when the quality watch finds the served engine drifting, serving
rolls to the same model built at the watch's referencePrecision. Pure.

The fallback engine is the served model at the reference precision, built by the
serving backend: on ONNX Runtime that is the reference engine itself (one build, one
cache entry), on TensorRT a build of its own, so a GPU deployment keeps serving on its
GPUs.

A fallback is a latch, kept in `status.qualityWatch.fallback`: it starts on the pass
after the watch's verdict says Drifting for the engine serving (the verdict is
published, with its Event, before anything rolls), and it holds whatever the watch
reads meanwhile (serving then runs the reference's precision, so there is nothing
left to compare) until one of these ends it:

- the spec's engine inputs change (a new calibration set, a new model version): the new
  engine rolls out as any new engine does, and is watched afresh;
- onDrift is set back to Alert, or the watch is turned off: the spec's engine serves
  again, as the spec asks.

So serving never goes back and forth between the two engines on figures near a
threshold: only a change of the spec moves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.enums import (
    Backend,
    DriftAction,
    QualityState,
    RolloutStrategy,
)
from kubeinfer.operator.api.v1alpha1.inference_deployment import (
    InferenceDeploymentSpec,
    RolloutSpec,
)
from kubeinfer.operator.api.v1alpha1.status import QualityFallbackStatus, QualityWatchStatus
from kubeinfer.operator.state.engine_state import EngineState, ServingEngine


def uses_reference_engine(spec: InferenceDeploymentSpec) -> bool:
    """Whether the fallback engine is the reference engine itself (ONNX Runtime serving)."""
    return spec.engine.backend == Backend.ONNXRUNTIME


def fallback_spec(spec: InferenceDeploymentSpec) -> InferenceDeploymentSpec:
    """The spec whose engine is the fallback: the served model at referencePrecision,
    by the serving backend, without calibration, pin or accuracy gate (it is the full-
    precision side); rolled out at once (it is the engine the watch compared against)."""
    engine = spec.engine.model_copy(
        update={
            "precision": spec.quality_watch.reference_precision,
            "calibration": None,
            "pin": None,
            "accuracy": None,
        }
    )
    rollout = RolloutSpec(strategy=RolloutStrategy.ROLLING)
    return spec.model_copy(update={"engine": engine, "rollout": rollout})


def wanted(spec: InferenceDeploymentSpec) -> bool:
    """Whether the spec asks for a fallback on drift."""
    watch = spec.quality_watch
    return watch.enabled and watch.on_drift == DriftAction.FALLBACK


def fallback_latch(
    spec: InferenceDeploymentSpec,
    previous: QualityWatchStatus | None,
    engine: EngineState,
    serving: ServingEngine | None,
    now: datetime,
) -> QualityFallbackStatus | None:
    """The fallback this pass holds (None: serving follows the spec). `previous` is the
    stored watch status, `engine` the spec's engine, `serving` what the serving pods run
    now."""
    if not wanted(spec):
        return None
    latched = previous.fallback if previous is not None else None
    if latched is not None:
        return latched if latched.drifted_build_key == engine.build_key else None
    if previous is None or previous.state != QualityState.DRIFTING or engine.digest is None:
        return None
    if serving is None or serving.digest != engine.digest:
        return None
    if previous.engine_digest not in (None, engine.digest):
        return None  # a finding about another engine than the one serving
    return QualityFallbackStatus(
        precision=spec.quality_watch.reference_precision,
        drifted_engine_digest=engine.digest,
        drifted_build_key=engine.build_key,
        since=now,
        drift=previous.message,
    )


@dataclass(frozen=True)
class FallbackReport:
    """What a held fallback adds to the status: the latch with its engine, and the
    sentence the Degraded condition carries."""

    latch: QualityFallbackStatus
    message: str


def fallback_report(
    spec: InferenceDeploymentSpec, latch: QualityFallbackStatus, fallback: EngineState
) -> FallbackReport:
    """The latch with the fallback engine's digest once built, and what to say of it."""
    latch = latch.model_copy(update={"engine_digest": fallback.digest})
    drifted = f"The {spec.engine.precision} engine {latch.drifted_engine_digest} drifted"
    ends = (
        "It serves again once its engine inputs change (a new calibration set or model "
        "version) or onDrift is Alert."
    )
    if fallback.digest is None:
        message = (
            f"{drifted}; falling back to the model at {latch.precision}: {fallback.message} "
            f"{ends} The watch found: {latch.drift}"
        )
    else:
        message = (
            f"{drifted}; serving falls back to the {latch.precision} engine {fallback.digest} "
            f"since {latch.since:%Y-%m-%dT%H:%M:%SZ}. {ends} The watch found: {latch.drift}"
        )
    return FallbackReport(latch, message[:4096])
