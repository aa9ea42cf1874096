"""What one build Job attempt has come to: running, done and waiting for its pod's report,
succeeded with an engine, or failed. Pure.

Each attempt is its own Job (`<owner>-build-<hash>-<attempt>`, the attempt also in the
label `kubeinfer.io/build-attempt`); `engine_state` picks the latest attempt of the
current build key and decides, from what `attempt_state` says of it, whether the engine
is built, still building, or failed and when to try again.

A succeeded attempt is known by its pod: `kubeinfer build --json` writes the engine's
digest (and its target, input size and whether the model batches) to the build
container's termination message.
A Job can be Complete before the watch has delivered its pod, so a Complete Job whose
pod has said nothing yet waits `MISSING_MESSAGE_GRACE` before the attempt counts as
failed (NoDigest).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import KubeObject
from kubeinfer.operator.state.quality_readings import BuildAgreement, parse_build_agreement

BUILD_CONTAINER = "build"
DIGEST_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")
MISSING_MESSAGE_GRACE = timedelta(seconds=60)
"""How long after a Job's completion its pod may still be missing from what was gathered
(the pod's watch event can trail the Job's) before the attempt counts as failed."""
FAILURE_REPORT_LIMIT = 2000
"""Characters of the build's own failure message kept in the status."""


class AttemptPhase(StrEnum):
    RUNNING = "Running"
    AWAITING_REPORT = "AwaitingReport"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


REASON_LIMIT = 1024
"""Characters of the build's batching reason kept (the status field's limit)."""


@dataclass(frozen=True)
class BatchingFinding:
    """Whether the model batches, as the build's trial run of its engine found: `batches`
    True, False (the runtime serves it one request per run), or None (not found out at
    build; the runtime finds out at start); `reason` says how or why."""

    batches: bool | None
    reason: str = ""

    def to_wire(self) -> dict[str, Any]:
        """The compact JSON form, as the build writes it."""
        return {"batches": self.batches, "batchingReason": self.reason}


def parse_batching(document: Any) -> BatchingFinding | None:
    """The finding of a build's JSON (its termination message, or the ConfigMap's
    annotation): `batches` true, false or null, and `batchingReason`; None where the
    document says nothing of it (a build before it was recorded)."""
    if not isinstance(document, dict) or "batches" not in document:
        return None
    batches, reason = document["batches"], document.get("batchingReason")
    if batches is not None and not isinstance(batches, bool):
        return None
    return BatchingFinding(batches, reason[:REASON_LIMIT] if isinstance(reason, str) else "")


@dataclass(frozen=True)
class BuildReport:
    """What a build Job's termination message says of the engine it built."""

    digest: str | None = None
    target: str | None = None
    input_bytes_per_row: int | None = None
    agreement: BuildAgreement | None = None
    """The build's top-1 agreement with fp32 (reduced-precision builds with validation
    data only)."""
    batching: BatchingFinding | None = None
    """Whether the model batches (None: the build did not say)."""


@dataclass(frozen=True)
class AttemptState:
    """`report` is the succeeded build's; `failure` says why a failed attempt failed and
    `failed_at` when (None when the Job does not say)."""

    phase: AttemptPhase
    report: BuildReport = field(default_factory=BuildReport)
    failure: str = ""
    failed_at: datetime | None = None


def attempt_state(job: KubeObject, pods: Sequence[KubeObject], now: datetime) -> AttemptState:
    """Where the attempt `job` stands; `pods` are its pods (`pods_of`)."""
    status = job.get("status") or {}
    if _true_condition(job, "Complete"):
        for terminated in build_terminations(pods):
            report = parse_build_report(terminated.get("message"))
            if report.digest and not terminated.get("exitCode"):
                return AttemptState(AttemptPhase.SUCCEEDED, report=report)
        completed = parse_time(status.get("completionTime"))
        if completed is None or now - completed < MISSING_MESSAGE_GRACE:
            return AttemptState(AttemptPhase.AWAITING_REPORT)
        return AttemptState(
            AttemptPhase.FAILED,
            failure="NoDigest: the build Job completed but no pod reported an engine digest "
            "in its termination message",
            failed_at=completed + MISSING_MESSAGE_GRACE,
        )
    failed = _true_condition(job, "Failed")
    if failed is None:
        return AttemptState(AttemptPhase.RUNNING)
    return AttemptState(
        AttemptPhase.FAILED,
        failure=_failure_text(failed, pods),
        failed_at=parse_time(failed.get("lastTransitionTime"))
        or parse_time(status.get("startTime")),
    )


def finished(job: KubeObject) -> bool:
    """Whether the Job has run to its end, successfully or not."""
    return bool(_true_condition(job, "Complete") or _true_condition(job, "Failed"))


def attempt_number(job: KubeObject) -> int:
    """The attempt a build Job is (0-based), from its label."""
    value = ((job.get("metadata") or {}).get("labels") or {}).get(names.LABEL_BUILD_ATTEMPT)
    return int(value) if value and value.isdigit() else 0


def pods_of(job_name: str, pods: Sequence[KubeObject]) -> list[KubeObject]:
    """The pods of Job `job_name`: by the Job's label (`batch.kubernetes.io/job-name`
    since Kubernetes 1.27, `job-name` before) or by owner reference."""
    result = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        owners = {ref.get("name") for ref in meta.get("ownerReferences") or []}
        if job_name in (labels.get("batch.kubernetes.io/job-name"), labels.get("job-name")):
            result.append(pod)
        elif job_name in owners:
            result.append(pod)
    return result


def parse_time(value: Any) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339, `Z` suffix) as an aware datetime, or None."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)  # Python 3.11+ reads the Z suffix
    except ValueError:
        return None


def parse_termination_message(message: str | None) -> tuple[str | None, str | None]:
    """(digest, target) from `kubeinfer build --json`'s termination message: a JSON object
    with `digest` (and optionally `target`), or any text containing one engine digest."""
    report = parse_build_report(message)
    return report.digest, report.target


def parse_build_report(message: str | None) -> BuildReport:
    """The build's report from its termination message (`parse_termination_message`),
    with `inputBytesPerRow` when it is a positive integer and `accuracy` (the top-1
    agreement with fp32, overall and per class) when it makes sense."""
    if not message:
        return BuildReport(None)
    try:
        document = json.loads(message)
    except ValueError:
        document = None
    if isinstance(document, dict):
        digest, target = document.get("digest"), document.get("target")
        if isinstance(digest, str) and DIGEST_PATTERN.fullmatch(digest):
            return BuildReport(
                digest,
                target if isinstance(target, str) else None,
                positive_int(document.get("inputBytesPerRow")),
                parse_build_agreement(document.get("accuracy")),
                parse_batching(document),
            )
    match = DIGEST_PATTERN.search(message)
    return BuildReport(match.group(0) if match else None)


def positive_int(value: Any) -> int | None:
    """`value` as a positive integer (also from its decimal text), or None."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if type(value) is int and value > 0 else None


def _true_condition(job: KubeObject, type_: str) -> dict[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return dict(condition)
    return None


def build_terminations(pods: Sequence[KubeObject]) -> list[dict[str, Any]]:
    """The build container's `state.terminated` of each pod that has one."""
    result = []
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated")
            if status.get("name") == BUILD_CONTAINER and terminated:
                result.append(terminated)
    return result


def _failure_text(failed: dict[str, Any], pods: Sequence[KubeObject]) -> str:
    """The Job's Failed condition in its words, and what the build itself said last."""
    reason = failed.get("reason") or "Failed"
    text = f"{reason}: {failed.get('message') or 'the build Job failed'}"
    said = [t.get("message", "").strip() for t in build_terminations(pods) if t.get("exitCode")]
    if said and said[-1]:
        text += f"; the build reported: {said[-1][:FAILURE_REPORT_LIMIT]}"
    return text
