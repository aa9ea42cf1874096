"""What the quality watch adds to one pass: its status and, when it finds drift, the
message of the Degraded condition. Pure.

The verdict (`verdict.judge_quality`) judges a window of tallies; this module decides
when there is a window to judge and what to say when there is none:

- the watch off: no status (it goes from the object) and no drift;
- the reference engine building or failing, or its pod not yet available, or the
  serving pods not running the spec's engine (a shadow of a new version under way): the
  watch waits, with the reason in its message;
- the metrics source unable to answer: the last figures are kept with the reason.

In the last two cases a drift already found stays found: no new evidence is no
recovery, so a reference pod restarting or a Prometheus hiccup never clears the
condition only for it to be raised again. Only a window judged healthy (significantly
back above every threshold, the verdict's hysteresis) clears it.

The baseline is the build's own top-1 agreement with fp32 on its validation rows,
overall and per reference class (`BuildAgreement`, recorded on the runtime ConfigMap);
a class the build did not report is held to the overall figure, and an engine without
a report (fp32, pinned, or built before builds reported it) to the floors alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.enums import QualityState
from kubeinfer.operator.api.v1alpha1.quality_watch import QualityWatchSpec
from kubeinfer.operator.api.v1alpha1.status import (
    QualityGroupRef,
    QualityGroupStatus,
    QualityWatchStatus,
)
from kubeinfer.operator.quality.fallback import FallbackReport
from kubeinfer.operator.quality.verdict import (
    BaselineAgreement,
    GroupJudgement,
    QualityBaseline,
    QualityMemory,
    QualityThresholds,
    QualityVerdict,
    judge_quality,
)
from kubeinfer.operator.state.quality_readings import (
    BuildAgreement,
    QualityGroup,
    WindowTallies,
)

NO_BASELINE = QualityBaseline(BaselineAgreement(1.0))
"""Without a build report: every group is held to its floor alone."""


@dataclass(frozen=True)
class QualityReport:
    """The watch's status (None: the watch is off) and, when it finds drift, the message
    of Degraded=True reason QualityDrift."""

    status: QualityWatchStatus | None = None
    drift: str | None = None
    fallback: str | None = None
    """Set while serving runs (or rolls to) the fallback engine: what to say of it."""


def baseline_of(agreement: BuildAgreement) -> QualityBaseline:
    """The verdict's baseline from the build's agreement, each figure with its row count
    (so the verdict holds it at its lower bound)."""
    return QualityBaseline(
        BaselineAgreement(agreement.agreements / agreement.rows, agreement.rows),
        {
            name: BaselineAgreement(agreements / rows, rows)
            for name, (rows, agreements) in agreement.by_class.items()
        },
    )


def thresholds_of(watch: QualityWatchSpec) -> QualityThresholds:
    """The verdict's thresholds, from the spec (no maxMeanAbsoluteDifference: unbounded)."""
    return QualityThresholds(
        min_samples=watch.min_samples,
        min_top1_agreement=watch.min_top1_agreement,
        min_class_agreement=watch.min_class_agreement,
        max_mean_absolute_difference=(
            float("inf")
            if watch.max_mean_absolute_difference is None
            else watch.max_mean_absolute_difference
        ),
    )


def memory_of(status: QualityWatchStatus | None) -> QualityMemory | None:
    """What the last verdict left, as the status kept it."""
    if status is None:
        return None
    return QualityMemory(
        frozenset(QualityGroup(g.kind, g.name) for g in status.drifting),
        status.mean_absolute_difference_too_large,
    )


def _drift_of(status: QualityWatchStatus) -> str | None:
    """The Degraded condition's message when the watch finds drift, else None: both
    onDrift actions raise the condition (Fallback also rolls serving, from the next pass,
    `quality.fallback`)."""
    return status.message if status.state == QualityState.DRIFTING else None


def waiting(
    watch: QualityWatchSpec,
    previous: QualityWatchStatus | None,
    reference_digest: str | None,
    why: str,
) -> QualityReport:
    """No window to judge this pass, for the reason `why` (a sentence). A drift found
    before stays, with its figures; otherwise the watch is Pending."""
    if previous is not None and previous.state == QualityState.DRIFTING:
        status = previous.model_copy(update={"reference_engine_digest": reference_digest})
        return QualityReport(status, _drift_of(status))
    status = QualityWatchStatus(
        state=QualityState.PENDING,
        message=why,
        reference_engine_digest=reference_digest,
        window_seconds=watch.window_seconds,
    )
    return QualityReport(status)


def unreadable(
    watch: QualityWatchSpec, previous: QualityWatchStatus | None, reference_digest: str, why: str
) -> QualityReport:
    """The metrics source could not answer: the last figures stay, the message says why."""
    if previous is None:
        return waiting(watch, previous, reference_digest, why)
    if previous.state == QualityState.PENDING:  # keeps when the watch began
        return QualityReport(previous.model_copy(update={"message": why}))
    if previous.state == QualityState.DRIFTING:
        return QualityReport(previous, _drift_of(previous))
    status = previous.model_copy(update={"message": f"{why} The figures are the last read."})
    return QualityReport(status)


def _group_status(judgement: GroupJudgement | None) -> QualityGroupStatus | None:
    if judgement is None or judgement.top1_agreement is None:
        return None
    return QualityGroupStatus(
        kind=judgement.group.kind,
        name=judgement.group.name,
        samples=judgement.samples,
        top1_agreement=judgement.top1_agreement,
        threshold=judgement.threshold,
    )


def _effective_percent(watch: QualityWatchSpec, window: WindowTallies) -> float | None:
    if window.requests is None:
        return None
    percent = window.requests.effective_percent(watch.sample_percent)
    return None if percent is None else round(percent, 3)


def judged(
    watch: QualityWatchSpec,
    previous: QualityWatchStatus | None,
    reference_digest: str,
    window: WindowTallies,
    now: datetime,
    baseline: QualityBaseline = NO_BASELINE,
    notes: tuple[str, ...] = (),
    engine_digest: str | None = None,
    coverage: str | None = None,
) -> QualityReport:
    """The verdict on this pass's window, as the status records it; `notes` (sentences:
    readings set aside) and `coverage` (how much of the window the counts cover, while
    they do not cover it all) follow the verdict's message.

    A pass that finds the figures as the last one recorded them leaves the status as it
    was (`_settled`): only the time would change (`lastEvaluated`, the coverage), and a
    status write per pass for nothing new is what the operator never does."""
    verdict: QualityVerdict = judge_quality(
        thresholds_of(watch), baseline, window, memory_of(previous)
    )
    sentences = (verdict.message, *notes, *((coverage,) if coverage else ()))
    status = QualityWatchStatus(
        state=verdict.state,
        message=" ".join(sentences)[:4096],
        reference_engine_digest=reference_digest,
        window_seconds=watch.window_seconds,
        samples=window.overall.samples,
        effective_sample_percent=_effective_percent(watch, window),
        top1_agreement=window.overall.top1_agreement,
        mean_absolute_difference=window.overall.mean_absolute_difference,
        worst_class=_group_status(verdict.worst_class),
        worst_slice=_group_status(verdict.worst_slice),
        drifting=[QualityGroupRef(kind=j.group.kind, name=j.group.name) for j in verdict.drifting][
            :64
        ],
        mean_absolute_difference_too_large=verdict.mean_absolute_difference_too_large,
        last_evaluated=now,
        engine_digest=engine_digest,
        watching_since=previous.watching_since if previous else now,
    )
    if previous is not None and _settled(status, previous, " ".join((verdict.message, *notes))):
        status = previous
    return QualityReport(status, _drift_of(status))


def _settled(status: QualityWatchStatus, previous: QualityWatchStatus, verdict: str) -> bool:
    """Whether `status` says what `previous` said, but for the time: the same figures and
    verdict, the message the same before its coverage sentence."""
    timeless = {"last_evaluated", "message"}
    if status.model_dump(exclude=timeless) != previous.model_dump(exclude=timeless):
        return False
    return (previous.message or "")[: len(verdict)] == verdict[:4096]


def starting(
    watch: QualityWatchSpec, reference_digest: str, engine_digest: str, now: datetime
) -> QualityReport:
    """The serving pods begin comparing `engine_digest` with the reference on this pass:
    the window is judged from the next one, reaching back no further than now."""
    status = QualityWatchStatus(
        state=QualityState.PENDING,
        message=f"The watch begins comparing engine {engine_digest} with the reference.",
        reference_engine_digest=reference_digest,
        window_seconds=watch.window_seconds,
        engine_digest=engine_digest,
        watching_since=now,
    )
    return QualityReport(status)


def window_to_read(
    watch: QualityWatchSpec,
    previous: QualityWatchStatus | None,
    serving_digest: str | None,
    now: datetime,
) -> int | None:
    """The window the gather step reads, in seconds: the spec's, cut at when the watch
    began on the engine serving (`watching_since`); None where it has not begun on that
    engine (nothing of it to read yet)."""
    if previous is None or previous.watching_since is None:
        return None
    if serving_digest is None or previous.engine_digest != serving_digest:
        return None
    elapsed = int((now - previous.watching_since).total_seconds())
    return max(1, min(watch.window_seconds, elapsed))


def fallen_back(previous: QualityWatchStatus, report: FallbackReport) -> QualityReport:
    """Serving runs (or rolls to) the fallback engine: nothing is compared meanwhile (the
    serving answers are the reference's precision); the last verdict's figures stay, with
    the latch, and the drift stays raised with what was done about it."""
    status = previous.model_copy(
        update={"fallback": report.latch, "message": report.message, "state": QualityState.DRIFTING}
    )
    return QualityReport(status, report.message, report.message)
