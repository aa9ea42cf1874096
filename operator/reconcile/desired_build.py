"""The engine build Job: `kubeinfer build` once for one set of engine inputs, its engine's
digest (and input size, accuracy report) in its container's termination message. Pure.

The Job runs the runtime's image as non-root with a read-only root filesystem, its
arguments a list (no spec field ever reaches a shell); a model or calibration set on a
claim (`pvc://CLAIM/PATH`) is mounted read-only and passed as a file, other schemes are
fetched by `kubeinfer build` itself.
"""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.api.v1alpha1.enums import Backend
from kubeinfer.operator.reconcile.child_meta import finish_child
from kubeinfer.operator.reconcile.desired import (
    CACHE_MOUNT,
    GPU_RESOURCE,
    SOURCES_MOUNT,
    TERMINATION_LOG,
    cache_claim,
    container_security,
    placement,
    pod_security,
)
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import KubeObject, OwnerRef


def _source_argument(uri: str, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> str:
    """A pvc://CLAIM/PATH source becomes a read-only mount and a file:// path; other
    schemes are fetched by `kubeinfer build` itself."""
    if not uri.startswith("pvc://"):
        return uri
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    sources = [v for v in volumes if v["name"].startswith("source-")]
    if claim not in [v["persistentVolumeClaim"]["claimName"] for v in sources]:
        # The model and the calibration data may share a claim: one mount serves both.
        volume = f"source-{len(sources)}"
        claim_ref = {"claimName": claim, "readOnly": True}
        volumes.append({"name": volume, "persistentVolumeClaim": claim_ref})
        mounts.append({"name": volume, "mountPath": f"{SOURCES_MOUNT}/{claim}", "readOnly": True})
    return f"file://{SOURCES_MOUNT}/{claim}/{path}"


def build_engine_job(
    owner: OwnerRef,
    spec: InferenceDeploymentSpec,
    settings: OperatorSettings,
    build_key: str,
    attempt: int,
) -> KubeObject:
    """The Job that runs `kubeinfer build` once for these inputs and reports the engine's
    digest in its container's termination message."""
    volumes: list[dict[str, Any]] = [
        {"name": "cache", "persistentVolumeClaim": {"claimName": cache_claim(spec, owner.name)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "cache", "mountPath": CACHE_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    argv = build_arguments(spec, volumes, mounts)
    container = _build_container(spec, settings, argv, mounts)
    template_labels = {
        names.LABEL_NAME: names.APP_NAME,
        names.LABEL_INSTANCE: owner.name,
        names.LABEL_MANAGED_BY: names.MANAGED_BY,
        names.LABEL_COMPONENT: names.COMPONENT_BUILD,
        names.LABEL_BUILD_KEY: build_key[: names.BUILD_KEY_LABEL_LENGTH],
    }
    labels = {
        **names.common_labels(owner.name, spec.model.version, names.COMPONENT_BUILD),
        names.LABEL_BUILD_KEY: build_key[: names.BUILD_KEY_LABEL_LENGTH],
        names.LABEL_BUILD_ATTEMPT: str(attempt),
    }
    body = {
        "spec": {
            "backoffLimit": settings.build.backoff_limit,
            "activeDeadlineSeconds": settings.build.active_deadline_seconds,
            "ttlSecondsAfterFinished": settings.build.ttl_seconds_after_finished,
            "template": {
                # No version label: a Job's template is immutable, and a version bump with
                # the same engine inputs reuses the Job.
                "metadata": {"labels": template_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pod_security(),
                    **placement(spec),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        }
    }
    name = names.build_job_name(owner.name, build_key, attempt)
    annotations = {names.ANNOTATION_BUILD_KEY: build_key}
    return finish_child("batch/v1", "Job", name, owner, labels, body, annotations)


def build_arguments(
    spec: InferenceDeploymentSpec, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> list[str]:
    """`kubeinfer build`'s argv for the spec's engine, as a list (never a shell line); a
    source on a claim adds its read-only mount to `volumes` and `mounts`."""
    engine, source = spec.engine, spec.model.source
    argv = ["build", "--model", _source_argument(source.uri, volumes, mounts)]
    if source.sha256:
        argv += ["--model-sha256", source.sha256]
    argv += [
        "--backend", str(engine.backend),
        "--precision", str(engine.precision),
        "--max-batch-size", str(engine.max_batch_size),
    ]  # fmt: skip
    if engine.calibration:
        argv += ["--calibration", _source_argument(engine.calibration.uri, volumes, mounts)]
        if engine.calibration.sha256:
            argv += ["--calibration-sha256", engine.calibration.sha256]
    gates = engine.accuracy
    if gates and gates.max_top1_drop is not None:
        argv += ["--max-top1-drop", str(gates.max_top1_drop)]
    if gates and gates.min_cosine is not None:
        argv += ["--min-cosine", str(gates.min_cosine)]
    if gates and gates.gate_outputs:
        argv += ["--gate-outputs", ",".join(gates.gate_outputs)]
    return [*argv, "--cache", CACHE_MOUNT, "--json", "--termination-message-path", TERMINATION_LOG]


def _build_container(
    spec: InferenceDeploymentSpec,
    settings: OperatorSettings,
    argv: list[str],
    mounts: list[dict[str, Any]],
) -> dict[str, Any]:
    """The build Job's one container: the runtime's image (`kubeinfer` is in it), the
    runtime's CPU and memory as requests, a GPU for a TensorRT build, the source's secret
    as its environment."""
    tensorrt = spec.engine.backend == Backend.TENSORRT
    resources: dict[str, Any] = {}
    requests = {
        k: v
        for k, v in (("cpu", spec.runtime.resources.cpu), ("memory", spec.runtime.resources.memory))
        if v
    }
    if requests:
        resources["requests"] = requests
    if tensorrt:
        resources["limits"] = {GPU_RESOURCE: "1"}
    container: dict[str, Any] = {
        "name": "build",
        "image": settings.images.image_for(spec.runtime.image, tensorrt),
        "imagePullPolicy": settings.images.pull_policy,
        "command": ["kubeinfer"],
        "args": argv,
        "env": [{"name": "HOME", "value": "/tmp"}],
        "securityContext": container_security(),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    if resources:
        container["resources"] = resources
    if spec.model.source.secret_ref:
        container["envFrom"] = [{"secretRef": {"name": spec.model.source.secret_ref.name}}]
    return container
