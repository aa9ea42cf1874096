"""The latency objective's part of one pass: the serving pods' p99 against
`spec.slo.p99LatencyMilliseconds`, for `status.slo` and the SLOMet condition, and how long
it has been missed (the autoscaler's SLO signal). Pure.

A miss is no failure of the object (Degraded stays for what the operator cannot fix by
itself: builds, pods, drift); it is a fact about load and sizing, which the SLOMet
condition, its Warning Event and the autoscaler (with scaleUpOnSloMissAfterSeconds) act
on. A reading that cannot be taken (no request answered, the metrics unreadable) leaves
the condition Unknown and keeps when the miss began: no evidence is no recovery, so a
Prometheus hiccup never restarts the clock of a sustained miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionValue, Reason
from kubeinfer.operator.api.v1alpha1.inference_deployment import SloSpec
from kubeinfer.operator.api.v1alpha1.status import SloStatus
from kubeinfer.operator.state.scaling_inputs import ScalingSignals


@dataclass(frozen=True)
class SloReport:
    """`status.slo`, the SLOMet condition, and for how long the objective has been missed
    (None: it is met, or not measured now)."""

    status: SloStatus
    condition: ConditionValue
    missed_for_seconds: float | None = None


def _milliseconds(value: float) -> str:
    return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"


def slo_report(
    slo: SloSpec,
    signals: ScalingSignals | None,
    previous: SloStatus | None,
    now: datetime,
) -> SloReport | None:
    """The report for this pass (None without an objective). `signals` is what the gather
    step read (None: nothing was read), `previous` the stored `status.slo`."""
    objective = slo.p99_latency_milliseconds
    if objective is None:
        return None
    kept = (
        previous
        if previous is not None and previous.objective_p99_milliseconds == objective
        else None
    )
    base = SloStatus(objective_p99_milliseconds=objective, last_evaluated=now)
    p99 = signals.p99_seconds if signals is not None and not signals.error else None
    if p99 is None:
        why = (
            "the metrics were not read"
            if signals is None
            else f"the metrics could not be read: {signals.error}"
            if signals.error
            else "no request was answered in the window"
        )
        status = base.model_copy(update={"missed_since": kept.missed_since if kept else None})
        return SloReport(
            status,
            (ConditionStatus.UNKNOWN, Reason.SLO_UNMEASURED, f"The p99 is not measured: {why}."),
        )
    window = signals.p99_window_seconds if signals is not None else None
    over = f"over the last {window} s" if window else "since the serving pods started"
    measured = round(p99 * 1e3, 3)
    figures = f"p99 {_milliseconds(measured)} {over}, objective {_milliseconds(objective)}"
    if measured <= objective:
        status = base.model_copy(
            update={"p99_milliseconds": measured, "window_seconds": window, "met": True}
        )
        return SloReport(status, (ConditionStatus.TRUE, Reason.SLO_MET, f"Met: {figures}."))
    since = kept.missed_since if kept and kept.missed_since else now
    status = base.model_copy(
        update={
            "p99_milliseconds": measured,
            "window_seconds": window,
            "met": False,
            "missed_since": since,
        }
    )
    message = f"Missed: {figures}; missed since {since:%Y-%m-%dT%H:%M:%SZ}."
    return SloReport(
        status,
        (ConditionStatus.FALSE, Reason.SLO_MISSED, message),
        missed_for_seconds=(now - since).total_seconds(),
    )
