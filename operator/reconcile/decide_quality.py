"""The quality watch's part of one pass (`decide` composes it). Pure.

The reference engine is built like any engine, from the reference's own spec
(`quality.reference`), its Jobs kept apart from the serving engine's; its runtime is one
CPU pod behind a Service of its own; the serving pods' mirror file names it while it has
a pod available and serving runs the spec's engine; the watch's status and drift come
from `quality.report` on the window the gather step read.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.quality import fallback
from kubeinfer.operator.quality import report as quality
from kubeinfer.operator.quality.fallback import FallbackReport
from kubeinfer.operator.quality.reference import reference_spec
from kubeinfer.operator.quality.report import QualityReport
from kubeinfer.operator.reconcile import desired as build
from kubeinfer.operator.reconcile.rollout_progress import available
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import (
    EngineState,
    ServingEngine,
    agreement_for,
    build_key,
    engine_state,
    observed_serving,
)
from kubeinfer.operator.state.observed import KubeObject, ObservedState
from kubeinfer.operator.state.quality_readings import QualityReading


def reference_engine(
    observed: ObservedState, settings: OperatorSettings, now: datetime
) -> EngineState | None:
    """The quality watch's reference engine (None with the watch off): built like any
    engine, from the reference's own spec, its Jobs kept apart from the serving engine's
    (and a fallback's)."""
    if not observed.spec.quality_watch.enabled:
        return None
    reference = replace(observed, spec=reference_spec(observed.spec))
    return engine_state(reference, settings, now)


def reference_children(
    observed: ObservedState, settings: OperatorSettings, reference: EngineState
) -> list[KubeObject]:
    """The reference runtime once its engine exists: one pod on CPU, its own Service
    (the serving Service never selects it)."""
    if reference.digest is None:
        return []
    spec, owner = reference_spec(observed.spec), observed.owner
    version, role = spec.model.version, names.ROLE_REFERENCE
    config = build.runtime_config(
        spec, settings, version, reference.digest, role, reference.input_bytes_per_row
    )
    configmap = build.build_runtime_configmap(
        owner,
        config,
        reference.build_key,
        settings.images.image_for(spec.runtime.image, tensorrt=False),
        role,
        reference.input_bytes_per_row,
    )
    return [
        configmap,
        build.build_runtime_deployment(owner, spec, settings, configmap, 1, role),
        build.build_service(owner, version, role, spec.runtime.grpc_port),
    ]


def watched_reference(
    observed: ObservedState,
    serving: ServingEngine,
    engine: EngineState,
    reference: EngineState | None,
) -> tuple[str, str] | None:
    """(version, digest) of the reference the serving pods mirror to: only while they
    serve the spec's own engine (the reference is built from the spec's model, so during
    a shadow of a new version the watch pauses) and the reference has a pod available."""
    if (
        reference is None
        or reference.digest is None
        or serving.digest != engine.digest
        or not available(observed.reference_deployment)
    ):
        return None
    return observed.spec.model.version, reference.digest


def fallback_key(spec: InferenceDeploymentSpec, settings: OperatorSettings) -> tuple[str, ...]:
    """The build key of a fallback engine built apart from the reference (TensorRT), when
    the spec asks for a fallback on drift: its Jobs are no one else's stale ones."""
    if not fallback.wanted(spec) or fallback.uses_reference_engine(spec):
        return ()
    return (build_key(fallback.fallback_spec(spec), settings),)


def fallback_engine(
    observed: ObservedState,
    settings: OperatorSettings,
    now: datetime,
    engine: EngineState,
    reference: EngineState | None,
) -> tuple[FallbackReport | None, EngineState | None]:
    """The fallback this pass holds (`quality.fallback`), and its engine: the reference
    engine on ONNX Runtime, else the fallback spec's own (built like any engine)."""
    spec = observed.spec
    latch = fallback.fallback_latch(
        spec, observed.status.quality_watch, engine, observed_serving(observed), now
    )
    if latch is None or reference is None:
        return None, None
    if fallback.uses_reference_engine(spec):
        state = reference
    else:
        state = engine_state(replace(observed, spec=fallback.fallback_spec(spec)), settings, now)
    return fallback.fallback_report(spec, latch, state), state


def quality_report(
    observed: ObservedState,
    reading: QualityReading | None,
    serving: ServingEngine | None,
    engine: EngineState,
    reference: EngineState | None,
    now: datetime,
    held: FallbackReport | None = None,
) -> QualityReport:
    """The quality watch's status and drift for this pass (`quality.report`) on the window
    the gather step read (`reading`; None: none was read); `held`, the fallback this pass
    holds."""
    if reference is None:
        return QualityReport()
    watch, previous = observed.spec.quality_watch, observed.status.quality_watch
    if previous is not None and held is not None:
        return quality.fallen_back(previous, held)
    if previous is not None and previous.fallback is not None:
        previous = None  # a fallback ended: the engine now served is watched afresh
    if reference.digest is None:
        return quality.waiting(
            watch, previous, None, f"The reference engine is not ready: {reference.message}"
        )
    if serving is None or watched_reference(observed, serving, engine, reference) is None:
        why = (
            "The serving pods do not run the spec's engine yet."
            if serving is None or serving.digest != engine.digest
            else f"The reference runtime {names.reference_name(observed.owner.name)} has no "
            "pod available yet."
        )
        return quality.waiting(watch, previous, reference.digest, why)
    if previous is not None and (
        previous.engine_digest != serving.digest or previous.watching_since is None
    ):
        previous = None  # figures of another engine, or none: this one is watched afresh
    if previous is None:
        return quality.starting(watch, reference.digest, serving.digest, now)
    if reading is None or reading.window is None:
        why = reading.error if reading and reading.error else "No figures were read yet."
        return quality.unreadable(watch, previous, reference.digest, why)
    agreement = agreement_for(engine, serving)
    baseline = quality.NO_BASELINE if agreement is None else quality.baseline_of(agreement)
    covered = reading.covered_seconds
    coverage = (
        f"The counts cover {covered:.0f} s of the {watch.window_seconds} s window so far."
        if covered is not None and covered < watch.window_seconds
        else None
    )
    return quality.judged(
        watch, previous, reference.digest, reading.window, now, baseline,
        reading.set_aside, serving.digest, coverage,
    )  # fmt: skip
