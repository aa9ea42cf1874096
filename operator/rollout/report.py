"""What a shadow rollout adds to the status: the ShadowPassed condition, and what it says
in Progressing, Degraded and the phase while a candidate is tested. Pure.

`kubectl get infd` shows the phase `Shadowing` while a candidate is Pending;
`kubectl wait --for=condition=ShadowPassed` waits for a verdict that let it through.
A Failed or Aborted candidate of the current spec leaves the object Degraded (and, for
kstatus, Stalled): serving is untouched, but what the spec asks for is not running and
will not be until someone changes the spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionValue, Reason
from kubeinfer.operator.api.v1alpha1.enums import Phase, RolloutStrategy, ShadowVerdict
from kubeinfer.operator.api.v1alpha1.inference_deployment import InferenceDeploymentSpec
from kubeinfer.operator.rollout.shadow import RolloutPlan

TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


@dataclass(frozen=True)
class ShadowReport:
    """`shadow_passed` is the ShadowPassed condition (None: not shown, as with the Rolling
    strategy and no shadow ever); `progress` replaces Progressing and the Ready summary
    while a shadow runs, promotes or blocks the spec; `degraded` is set when it blocks;
    `phase` overrides the derived phase."""

    shadow_passed: ConditionValue | None = None
    progress: ConditionValue | None = None
    degraded: ConditionValue | None = None
    phase: Phase | None = None


def report(spec: InferenceDeploymentSpec, plan: RolloutPlan) -> ShadowReport:
    """The status' view of this pass' rollout plan."""
    record = plan.record
    if record is None:
        if spec.rollout.strategy != RolloutStrategy.SHADOW:
            return ShadowReport()
        return ShadowReport(
            shadow_passed=(UNKNOWN, Reason.NO_CANDIDATE, "No candidate has been shadow-tested.")
        )
    who = f"Version {record.version} (engine {record.engine_digest})"
    serving = plan.serving.version if plan.serving else "none"
    detail = f"{record.reason}: {record.message}" if record.message else record.reason
    if record.verdict == ShadowVerdict.PENDING:
        running = f"{who} is under shadow test; version {serving} serves. {record.message}"
        return ShadowReport(
            shadow_passed=(UNKNOWN, Reason.SHADOW_RUNNING, running),
            progress=(TRUE, Reason.SHADOW_RUNNING, running),
            phase=Phase.SHADOWING,
        )
    if record.verdict == ShadowVerdict.PASSED:
        promoting = f"{who} passed its shadow test and serving rolls to it. {record.message}"
        return ShadowReport(
            shadow_passed=(TRUE, Reason.SHADOW_PASSED, promoting),
            progress=(TRUE, Reason.PROMOTING, promoting),
        )
    if record.verdict == ShadowVerdict.PROMOTED:
        promoted = f"{who} passed and was promoted. {record.message}".strip()
        return ShadowReport(shadow_passed=(TRUE, Reason.SHADOW_PROMOTED, promoted))
    failed = record.verdict == ShadowVerdict.FAILED
    reason = Reason.SHADOW_FAILED if failed else Reason.SHADOW_ABORTED
    outcome = "failed its shadow test" if failed else "was aborted"
    text = f"{who} {outcome} ({detail}). Version {serving} keeps serving."
    if not plan.blocked:
        return ShadowReport(shadow_passed=(FALSE, reason, text))
    blocked = f"{text} Change the spec to try again."
    return ShadowReport(
        shadow_passed=(FALSE, reason, blocked),
        progress=(FALSE, reason, blocked),
        degraded=(TRUE, reason, blocked),
        phase=Phase.DEGRADED,
    )
