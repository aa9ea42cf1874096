"""Where the current spec's engine stands: pinned, built, building or failed. Pure.

The build key is a hash of every engine input (model uri and sha256, backend, precision,
maxBatchSize, calibration, gpuProduct, the accuracy gates, which decide whether the
engine is published at all, and the image the build Job and the runtime pods run: the
spec's `runtime.image`, else the operator's default for the backend). It names the build
Job, so an operator restarted in the middle of a build finds the running Job instead of
starting a second one, and a change of any input starts a new build while the old engine
keeps serving. The image is an input because it carries the backend (TensorRT, ONNX
Runtime) whose version the engine is tied to: a new image builds again, and `kubeinfer
build` in it finds or builds the engine of its own version (the cache key holds the
version), where reusing the old engine would leave the new pods unable to load it. An
image reference that names no version (`:latest`) changes nothing here when what it
points to changes; the pods then refuse the old engine (exit 3) and the status says
EngineIncompatible.

Where a built digest comes from, in order: the pin; the serving or the shadow
candidate's ConfigMap, whose annotations record the build key its digest was built from,
or the status' engine, which records it too (so a finished Job may be garbage-collected
without a rebuild, also after a failed shadow removed the candidate); the termination
message of a succeeded build Job's pod.

The engine's input size (`inputBytesPerRow`, the bytes one row of its inputs takes as
binary tensors) comes with its digest: from the build Job's termination message, and
then from the runtime ConfigMap's annotation `kubeinfer.io/input-bytes-per-row`, where
the operator records it beside the digest. The runtime's request body limit is rendered
from it (`desired.runtime_config`); it is unknown for a pinned engine (nothing is
built) and then the runtime's default limit applies.

Retries: each attempt is its own Job, `<owner>-build-<hash>-<attempt>`, and what one
attempt has come to is `build_attempt.attempt_state`'s to say. A failed attempt
is kept (its reason and message stay visible in `kubectl describe job`, and Kubernetes
deletes it after ttlSecondsAfterFinished); once the backoff after it has passed, the next
attempt's Job is created. Deleting and recreating one Job name was rejected: between the
delete and the create the failure would be gone from the cluster, and a slow watch could
show the deleted Job as the new attempt's outcome.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.api.v1alpha1.inference_deployment import Backend
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.build_attempt import (
    AttemptPhase,
    AttemptState,
    BatchingFinding,
    attempt_number,
    attempt_state,
    finished,
    parse_batching,
    pods_of,
    positive_int,
)
from kubeinfer.operator.state.observed import KubeObject, ObservedState
from kubeinfer.operator.state.quality_readings import BuildAgreement, parse_build_agreement

ANNOTATION_INPUT_BYTES_PER_ROW = "kubeinfer.io/input-bytes-per-row"
ANNOTATION_AGREEMENT = "kubeinfer.io/engine-top1-agreement"
"""On the runtime ConfigMap: the build's top-1 agreement with fp32 (`BuildAgreement`'s
JSON), so the quality watch's baseline outlives the build Job."""
ANNOTATION_BATCHING = "kubeinfer.io/engine-batching"
"""On the runtime ConfigMap: whether the model batches, as its build found
(`BatchingFinding`'s JSON), so the status keeps saying it after the build Job is gone."""


class EnginePhase(StrEnum):
    PINNED = "Pinned"
    BUILT = "Built"
    BUILDING = "Building"
    FAILED = "Failed"


@dataclass(frozen=True)
class ServingEngine:
    """The engine the runtime currently runs (or last ran), read from its children."""

    version: str
    digest: str
    build_key: str | None
    input_bytes_per_row: int | None = None
    agreement: BuildAgreement | None = None
    batching: BatchingFinding | None = None


@dataclass(frozen=True)
class EngineState:
    """The current spec's engine. `job_attempt` is the attempt whose Job must exist (None:
    no Job wanted); `retry_at` is when a failed build is retried."""

    phase: EnginePhase
    build_key: str
    digest: str | None = None
    target: str | None = None
    job_attempt: int | None = None
    message: str = ""
    retry_at: datetime | None = None
    input_bytes_per_row: int | None = None
    agreement: BuildAgreement | None = None
    """The build's top-1 agreement with fp32, where the build reported one."""
    batching: BatchingFinding | None = None
    """Whether the model batches, where the build reported it."""

    @property
    def ready(self) -> bool:
        return self.digest is not None


def agreement_for(engine: EngineState, serving: ServingEngine) -> BuildAgreement | None:
    """The build agreement of the engine `serving` names: the current engine's, or what
    its own ConfigMap recorded."""
    if serving.digest == engine.digest and engine.agreement is not None:
        return engine.agreement
    return serving.agreement


def batching_for(engine: EngineState, serving: ServingEngine) -> BatchingFinding | None:
    """Whether the model of the engine `serving` names batches: the current engine's
    finding, or what its own ConfigMap recorded."""
    if serving.digest == engine.digest and engine.batching is not None:
        return engine.batching
    return serving.batching


def input_bytes_for(engine: EngineState, serving: ServingEngine) -> int | None:
    """The input size of the engine `serving` names: the current engine's, or what its
    own ConfigMap recorded."""
    if serving.digest == engine.digest and engine.input_bytes_per_row is not None:
        return engine.input_bytes_per_row
    return serving.input_bytes_per_row


def build_inputs(spec: InferenceDeploymentSpec, settings: OperatorSettings) -> dict[str, Any]:
    """Every input that changes the built engine or where it lands (the pin alone when
    pinned: nothing is built, and the runtime checks the pin against its image at start)."""
    engine = spec.engine
    if engine.pin is not None:
        return {"pin": engine.pin}
    calibration = engine.calibration
    inputs = {
        "image": settings.images.image_for(spec.runtime.image, engine.backend == Backend.TENSORRT),
        "model": {"uri": spec.model.source.uri, "sha256": spec.model.source.sha256},
        "backend": str(engine.backend),
        "precision": str(engine.precision),
        "maxBatchSize": engine.max_batch_size,
        "calibration": None
        if calibration is None
        else {"uri": calibration.uri, "sha256": calibration.sha256},
        "gpuProduct": spec.runtime.gpu_product,
        "accuracy": None if engine.accuracy is None else engine.accuracy.to_wire(),
    }
    # Where the engine is built to: pods on another claim would find no engine there, so a
    # new claim is a new build. Only named when set, so the keys of objects on their own
    # claim (the default) stay what they were.
    if engine.cache.existing_claim:
        inputs["cacheClaim"] = engine.cache.existing_claim
    return inputs


def build_key(spec: InferenceDeploymentSpec, settings: OperatorSettings) -> str:
    """sha256 (64 hex digits) of the engine inputs."""
    return names.stable_hash(build_inputs(spec, settings), 64)


def observed_serving(observed: ObservedState) -> ServingEngine | None:
    """The served engine: from the ConfigMap's annotations, else the Deployment's pod
    template (the ConfigMap was deleted), else the last status (both were deleted)."""
    for child in (observed.configmap, _pod_template(observed.deployment)):
        engine = _engine_of(child)
        if engine is not None:
            return engine
    serving = observed.status.serving
    if serving and serving.version and serving.engine_digest:
        return ServingEngine(serving.version, serving.engine_digest, None)
    return None


def observed_candidate(observed: ObservedState) -> ServingEngine | None:
    """The shadow candidate's engine, from its ConfigMap's annotations."""
    return _engine_of(observed.candidate_configmap)


def _engine_of(child: KubeObject | None) -> ServingEngine | None:
    meta = (child or {}).get("metadata") or {}
    annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    digest = annotations.get(names.ANNOTATION_ENGINE_DIGEST)
    if digest and labels.get(names.LABEL_VERSION):
        return ServingEngine(
            labels[names.LABEL_VERSION],
            digest,
            annotations.get(names.ANNOTATION_BUILD_KEY),
            positive_int(annotations.get(ANNOTATION_INPUT_BYTES_PER_ROW)),
            _recorded_agreement(annotations.get(ANNOTATION_AGREEMENT)),
            _recorded_batching(annotations.get(ANNOTATION_BATCHING)),
        )
    return None


def _recorded_agreement(text: str | None) -> BuildAgreement | None:
    try:
        return parse_build_agreement(json.loads(text)) if text else None
    except ValueError:
        return None


def _recorded_batching(text: str | None) -> BatchingFinding | None:
    try:
        return parse_batching(json.loads(text)) if text else None
    except ValueError:
        return None


def _pod_template(deployment: KubeObject | None) -> KubeObject | None:
    return ((deployment or {}).get("spec") or {}).get("template")


def backoff_seconds(attempt: int, settings: OperatorSettings) -> float:
    """Delay after failed attempt `attempt` (0-based): doubling from the base, capped."""
    return float(
        min(
            settings.build.backoff_seconds * 2 ** min(attempt, 30),
            settings.build.backoff_max_seconds,
        )
    )


def engine_state(observed: ObservedState, settings: OperatorSettings, now: datetime) -> EngineState:
    """Where the engine of `observed.spec` stands, and which build Job must exist (the
    Jobs of inputs no engine of the object has are `stale_jobs`)."""
    spec = observed.spec
    key = build_key(spec, settings)
    mine = jobs_of(observed, key)
    previous = observed.status.engine

    def target(digest: str, otherwise: str | None) -> str | None:
        """The status' target where it is of this digest (learnt from its build)."""
        return previous.target if previous and previous.digest == digest else otherwise

    if spec.engine.pin is not None:
        return EngineState(
            EnginePhase.PINNED,
            key,
            digest=spec.engine.pin,
            target=target(spec.engine.pin, None),
            message=f"Engine {spec.engine.pin} is pinned; the runtime verifies it at start.",
        )
    cpu_target = "cpu" if spec.engine.backend == Backend.ONNXRUNTIME else None
    recorded = recorded_engine(observed, key)
    if recorded is not None:
        return EngineState(
            EnginePhase.BUILT,
            key,
            digest=recorded.digest,
            target=target(recorded.digest, cpu_target),
            message=_built_message(observed, now, recorded.digest, mine),
            input_bytes_per_row=recorded.input_bytes_per_row,
            agreement=recorded.agreement,
            batching=recorded.batching,
        )
    if not mine:
        return _building(observed.owner.name, key, 0)
    return _latest_attempt(observed, settings, now, key, mine, cpu_target)


def _built_message(
    observed: ObservedState, now: datetime, digest: str, mine: list[KubeObject]
) -> str:
    """A recorded engine's message: it names the Job that built it while that Job is
    there, as the pass that read the engine from the Job did, so the passes after it
    compute the same status and write none."""
    if mine:
        latest, outcome = _latest_outcome(observed, mine, now)
        if outcome.phase == AttemptPhase.SUCCEEDED and outcome.report.digest == digest:
            return _built_by(digest, latest["metadata"]["name"])
    return f"Engine {digest} was built for these inputs."


def _latest_outcome(
    observed: ObservedState, mine: list[KubeObject], now: datetime
) -> tuple[KubeObject, AttemptState]:
    """The latest attempt's Job among `mine` (not empty) and what it has come to."""
    latest = max(mine, key=attempt_number)
    pods = pods_of(latest["metadata"]["name"], observed.job_pods)
    return latest, attempt_state(latest, pods, now)


def _built_by(digest: str | None, job_name: str) -> str:
    return f"Engine {digest} was built by Job {job_name}."


def jobs_of(observed: ObservedState, key: str) -> list[KubeObject]:
    """The object's build Jobs of build key `key`."""
    short = key[: names.BUILD_KEY_LABEL_LENGTH]
    return [job for job in _own_jobs(observed) if _labels(job).get(names.LABEL_BUILD_KEY) == short]


def stale_jobs(observed: ObservedState, wanted_keys: Iterable[str]) -> tuple[str, ...]:
    """The names (sorted) of the object's unfinished build Jobs of none of `wanted_keys`,
    the build keys of the engines it needs: stale, their inputs no longer apply."""
    wanted = {key[: names.BUILD_KEY_LABEL_LENGTH] for key in wanted_keys}
    return tuple(
        sorted(
            job["metadata"]["name"]
            for job in _own_jobs(observed)
            if _labels(job).get(names.LABEL_BUILD_KEY) not in wanted and not finished(job)
        )
    )


def _own_jobs(observed: ObservedState) -> list[KubeObject]:
    owner = observed.owner.name
    return [job for job in observed.jobs if _labels(job).get(names.LABEL_INSTANCE) == owner]


def _latest_attempt(
    observed: ObservedState,
    settings: OperatorSettings,
    now: datetime,
    key: str,
    mine: list[KubeObject],
    cpu_target: str | None,
) -> EngineState:
    """The engine as the latest build attempt of `key` leaves it: building, awaiting its
    report, built, failed until its backoff ends, or the next attempt once it has."""
    owner = observed.owner.name
    latest, outcome = _latest_outcome(observed, mine, now)
    attempt, job_name = attempt_number(latest), latest["metadata"]["name"]
    if outcome.phase == AttemptPhase.RUNNING:
        return _building(owner, key, attempt)
    if outcome.phase == AttemptPhase.AWAITING_REPORT:
        return EngineState(
            EnginePhase.BUILDING,
            key,
            message=f"Job {job_name} completed; waiting for its pod's termination message.",
        )
    if outcome.phase == AttemptPhase.SUCCEEDED:
        report = outcome.report
        return EngineState(
            EnginePhase.BUILT,
            key,
            digest=report.digest,
            target=report.target or cpu_target,
            message=_built_by(report.digest, job_name),
            input_bytes_per_row=report.input_bytes_per_row,
            agreement=report.agreement,
            batching=report.batching,
        )
    retry_at = retry_time(outcome, attempt, settings)
    if retry_at is None or now >= retry_at:
        return _building(owner, key, attempt + 1)
    return EngineState(
        EnginePhase.FAILED,
        key,
        message=f"Job {job_name} failed: {outcome.failure}. "
        f"Retrying at {retry_at:%Y-%m-%dT%H:%M:%SZ}.",
        retry_at=retry_at,
    )


def retry_time(failed: AttemptState, attempt: int, settings: OperatorSettings) -> datetime | None:
    """When the attempt after failed attempt `attempt` (0-based) may start: the backoff
    after the failure; None when the Job does not say when it failed (retried at once)."""
    if failed.failed_at is None:
        return None
    return failed.failed_at + timedelta(seconds=backoff_seconds(attempt, settings))


def recorded_engine(observed: ObservedState, key: str) -> ServingEngine | None:
    """An engine built for build key `key`, where one is recorded: the serving, the
    shadow candidate's or the quality reference's ConfigMap, else the status' engine."""
    previous = observed.status.engine
    known = [
        observed_serving(observed),
        observed_candidate(observed),
        _engine_of(observed.reference_configmap),
    ]
    found = previous.batching if previous else None
    reported = None if found is None else BatchingFinding(found.batches, found.reason)
    if previous and previous.digest and previous.build_key:
        known.append(ServingEngine("", previous.digest, previous.build_key, batching=reported))
    for engine in known:
        if engine and engine.build_key == key:
            if engine.batching is None and previous and previous.digest == engine.digest:
                # The pod template records no finding: the status still holds the build's.
                return replace(engine, batching=reported)
            return engine
    return None


def _labels(job: KubeObject) -> dict[str, str]:
    return (job.get("metadata") or {}).get("labels") or {}


def _building(owner: str, key: str, attempt: int) -> EngineState:
    """The message depends only on the attempt, so passes during one build write the same
    status; the failure that led to a retry was reported by its own Event."""
    job_name = names.build_job_name(owner, key, attempt)
    retry = f" (attempt {attempt + 1})" if attempt else ""
    return EngineState(
        EnginePhase.BUILDING,
        key,
        job_attempt=attempt,
        message=f"Job {job_name} is building the engine{retry}.",
    )
