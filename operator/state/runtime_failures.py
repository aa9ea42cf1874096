"""Runtime pods that cannot start, read from their container statuses. Pure.

A runtime pod that cannot load its engine exits, and the kubelet restarts it with a
growing back-off (CrashLoopBackOff). The Deployment only sees a pod that is not ready:
with maxUnavailable 0 the old pods keep serving and the rollout waits, until its
progress deadline, without saying why. The kubelet does know why: the container's last
termination carries `kubeinfer serve`'s exit code and its termination message (the
runtime container reports it with FallbackToLogsOnError). This module turns that into
the status' reason and message:

- exit code 3 (`EXIT_ENGINE_INCOMPATIBLE`): the engine was built by another backend
  version than the pod's image has: EngineIncompatible;
- any other non-zero exit, or an image that cannot be pulled: RuntimeFailing.

A container counts while it is not ready and its latest termination (the current one,
else the last) failed, whether the kubelet is waiting to restart it or it is starting
again; once it is ready it no longer counts, whatever it went through. The message names
the first failing pod by name with its engine, the exit code and what the runtime said,
and nothing that changes with every restart (the restart count, the back-off), so a
crash loop does not rewrite the status on every pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import KubeObject

EXIT_ENGINE_INCOMPATIBLE = 3
"""`kubeinfer serve`'s exit code for an engine built by another backend version
(`kubeinfer.runtime.engine_cache.EXIT_ENGINE_INCOMPATIBLE`, which this module does not
import: the cache brings the engine loaders into the operator's import graph; a test
holds the two equal)."""
RUNTIME_CONTAINER = "runtime"
MESSAGE_LIMIT = 1500
"""Characters of the runtime's own message kept (a termination message holds 4096)."""
IMAGE_WAITING_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
)
"""Waiting reasons after which the container cannot start without a change."""


@dataclass(frozen=True)
class RuntimeFailure:
    """Why runtime pods cannot start: the reason, and a message for the status."""

    reason: Reason
    message: str

    @property
    def engine_incompatible(self) -> bool:
        return self.reason == Reason.ENGINE_INCOMPATIBLE


def unsettled(deployment: KubeObject | None) -> bool:
    """Whether a Deployment's pods may hold a failure worth reading: it exists and its
    controller has not reported every desired pod updated and ready, with none left
    over. A settled Deployment's pods are all ready, so they are not listed: an object
    without problems costs no request."""
    if deployment is None:
        return False
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    replicas = spec.get("replicas", 1)
    generation = (deployment.get("metadata") or {}).get("generation")
    seen = generation is None or int(status.get("observedGeneration") or 0) >= int(generation)
    counts = [int(status.get(k) or 0) for k in ("replicas", "updatedReplicas", "readyReplicas")]
    return not (seen and counts == [replicas] * 3)


def _container(pod: KubeObject) -> dict[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == RUNTIME_CONTAINER:
            return dict(status)
    return None


def _failure_of(pod: KubeObject) -> tuple[Reason, str] | None:
    """(reason, what happened) for one pod, or None when it is not failing."""
    status = _container(pod)
    if status is None or status.get("ready"):
        return None
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    terminated = state.get("terminated") or (status.get("lastState") or {}).get("terminated")
    if terminated and terminated.get("exitCode"):
        code = int(terminated["exitCode"])
        said = " ".join(str(terminated.get("message") or "").split())[:MESSAGE_LIMIT]
        reason = terminated.get("reason") or "Error"
        text = f"its runtime container exited with code {code} ({reason})"
        if said:
            text += f": {said}"
        if code == EXIT_ENGINE_INCOMPATIBLE:
            return Reason.ENGINE_INCOMPATIBLE, text
        return Reason.RUNTIME_FAILING, text
    if waiting.get("reason") in IMAGE_WAITING_REASONS:
        said = " ".join(str(waiting.get("message") or "").split())[:MESSAGE_LIMIT]
        text = f"its runtime container cannot start ({waiting['reason']})"
        return Reason.RUNTIME_FAILING, f"{text}: {said}" if said else text
    return None


def _digest(pod: KubeObject) -> str | None:
    """The engine the pod runs (its template's annotation)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(names.ANNOTATION_ENGINE_DIGEST)


def runtime_failure(
    pods: Iterable[KubeObject], what: str = "runtime", digest: str | None = None
) -> RuntimeFailure | None:
    """The failure of the first failing pod by name (an incompatible engine first: it is
    the one that needs a new build), or None when no pod is failing. Pods being deleted
    are left out, and with `digest` the pods of other engines (a replaced candidate's).
    `what` names the pods in the message ("runtime", "shadow candidate")."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or (digest is not None and _digest(pod) != digest):
            continue
        failure = _failure_of(pod)
        if failure is not None:
            found.append((failure[0] != Reason.ENGINE_INCOMPATIBLE, meta.get("name", ""), pod))
    if not found:
        return None
    found.sort(key=lambda item: item[:2])
    _, name, pod = found[0]
    reason, text = _failure_of(pod)  # type: ignore[misc]
    engine = f" (engine {_digest(pod)})" if _digest(pod) else ""
    others = f" {len(found)} {what} pods are failing." if len(found) > 1 else ""
    remedy = (
        " A change of runtime.image builds the engine again (a tag that moves to a new "
        "version does not); a pinned engine must be one built by this image."
        if reason == Reason.ENGINE_INCOMPATIBLE
        else ""
    )
    return RuntimeFailure(
        reason, f"The {what} pod {name}{engine} cannot start: {text}.{others}{remedy}"
    )
