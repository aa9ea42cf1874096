"""The shadow verdict: is the candidate good enough to replace the serving engine? Pure.

A function of the shadow settings (thresholds, minSamples, maxDurationSeconds), the
aggregates the serving pods measured, when the candidate started, and `now`: the same
inputs always give the same verdict, so it is table-tested without a server
(Argo Rollouts' AnalysisRun and Flagger's canary analysis judge the same way).

Order of the checks, and why:
1. A request whose outputs differ in name, shape or datatype fails the candidate at once:
   no threshold makes a different interface acceptable.
2. The largest difference can only grow as more requests are compared, so breaking
   maxAbsoluteOutputDifference fails the candidate at once, before minSamples.
3. Top-1 agreement and the p99 regression are ratios and percentiles: judged only once
   minSamples requests are compared, then the candidate passes or fails.
4. maxDurationSeconds without minSamples fails it (rolled back, never promoted on too
   little evidence). Metrics that cannot be read leave the verdict Pending: missing data
   never promotes, and only the deadline fails.

Before any of these, and outside `judge` since it is no figure: a candidate whose pods
refuse its engine (built by another backend version than their image has; read from the
pods' container statuses) fails at once with reason EngineIncompatible
(`engine_incompatible`), rather than waiting out maxDurationSeconds for samples that
cannot come.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.api.v1alpha1.enums import ShadowVerdict
from kubeinfer.operator.api.v1alpha1.inference_deployment import ShadowSpec
from kubeinfer.operator.state.shadow_readings import ShadowAggregates


@dataclass(frozen=True)
class Verdict:
    """Pending, Passed or Failed, with a reason and the figures that led to it."""

    outcome: ShadowVerdict
    reason: Reason
    message: str


def engine_incompatible(message: str) -> Verdict:
    """The candidate's pods cannot load its engine (`message` says why): Failed now."""
    return Verdict(ShadowVerdict.FAILED, Reason.ENGINE_INCOMPATIBLE, message)


def latency_regression_percent(aggregates: ShadowAggregates) -> float | None:
    """How much slower the candidate's p99 is than serving's, in percent (negative:
    faster); None when either was not measured."""
    serving, candidate = aggregates.serving_p99_seconds, aggregates.candidate_p99_seconds
    if serving is None or candidate is None:
        return None
    if serving <= 0:
        return 0.0 if candidate <= 0 else float("inf")
    return (candidate / serving - 1.0) * 100.0


def summary(aggregates: ShadowAggregates) -> str:
    """The figures, in one line, for messages and Events."""
    parts = [f"{aggregates.compared} compared"]
    if aggregates.max_abs_difference is not None:
        parts.append(f"max |diff| {aggregates.max_abs_difference:.3g}")
    if aggregates.top1_agreement is not None:
        parts.append(f"top-1 agreement {aggregates.top1_agreement:.4f}")
    if aggregates.serving_p99_seconds is not None and aggregates.candidate_p99_seconds is not None:
        parts.append(
            f"p99 {aggregates.candidate_p99_seconds * 1e3:.2f} ms vs serving "
            f"{aggregates.serving_p99_seconds * 1e3:.2f} ms"
        )
    lost = aggregates.candidate_errors + aggregates.timeouts
    if lost:
        parts.append(f"{lost} candidate errors or timeouts")
    if aggregates.dropped:
        parts.append(f"{aggregates.dropped} dropped by the mirror")
    return ", ".join(parts)


def judge(
    shadow: ShadowSpec,
    aggregates: ShadowAggregates | None,
    started: datetime,
    now: datetime,
) -> Verdict:
    """The verdict on a candidate whose shadow started at `started`; `aggregates` is None
    when the metrics could not be read this time."""
    thresholds = shadow.thresholds
    deadline_passed = (now - started).total_seconds() >= shadow.max_duration_seconds
    if aggregates is None:
        if deadline_passed:
            return Verdict(
                ShadowVerdict.FAILED,
                Reason.INSUFFICIENT_SAMPLES,
                f"No aggregates could be read in {shadow.max_duration_seconds} s "
                "(maxDurationSeconds); the candidate is rolled back.",
            )
        return Verdict(
            ShadowVerdict.PENDING,
            Reason.METRICS_UNAVAILABLE,
            "The shadow's metrics cannot be read; the verdict waits.",
        )
    figures = summary(aggregates)
    if aggregates.mismatches:
        return Verdict(
            ShadowVerdict.FAILED,
            Reason.OUTPUT_MISMATCH,
            f"{aggregates.mismatches} compared requests got outputs of another name, shape "
            f"or datatype from the candidate ({figures}).",
        )
    limit = thresholds.max_absolute_output_difference
    if aggregates.max_abs_difference is not None and aggregates.max_abs_difference > limit:
        return Verdict(
            ShadowVerdict.FAILED,
            Reason.DIFFERENCE_TOO_LARGE,
            f"Max |diff| {aggregates.max_abs_difference:.3g} is above "
            f"maxAbsoluteOutputDifference {limit:g} ({figures}).",
        )
    if aggregates.compared >= shadow.min_samples:
        complete = _judge_complete(shadow, aggregates, figures)
        if complete.outcome == ShadowVerdict.PENDING and deadline_passed:
            return Verdict(ShadowVerdict.FAILED, complete.reason, complete.message)
        return complete
    if deadline_passed:
        return Verdict(
            ShadowVerdict.FAILED,
            Reason.INSUFFICIENT_SAMPLES,
            f"{aggregates.compared} of minSamples {shadow.min_samples} requests compared in "
            f"maxDurationSeconds {shadow.max_duration_seconds} ({figures}).",
        )
    return Verdict(
        ShadowVerdict.PENDING,
        Reason.SHADOW_RUNNING,
        f"{aggregates.compared} of {shadow.min_samples} samples ({figures}).",
    )


def _judge_complete(shadow: ShadowSpec, aggregates: ShadowAggregates, figures: str) -> Verdict:
    """The verdict once minSamples requests are compared."""
    thresholds = shadow.thresholds
    agreement = aggregates.top1_agreement
    if agreement is not None and agreement < thresholds.min_top1_agreement:
        return Verdict(
            ShadowVerdict.FAILED,
            Reason.TOP1_AGREEMENT_TOO_LOW,
            f"Top-1 agreement {agreement:.4f} is below minTop1Agreement "
            f"{thresholds.min_top1_agreement:g} ({figures}).",
        )
    regression = latency_regression_percent(aggregates)
    if regression is None:
        # minSamples compared requests always carry latencies; their absence means the
        # series are incomplete (e.g. a scrape in between), so wait rather than judge.
        return Verdict(
            ShadowVerdict.PENDING,
            Reason.LATENCY_NOT_MEASURED,
            f"The p99 latencies are not available yet ({figures}).",
        )
    limit = thresholds.max_p99_latency_regression_percent
    if regression > limit:
        return Verdict(
            ShadowVerdict.FAILED,
            Reason.LATENCY_REGRESSION,
            f"The candidate's p99 is {regression:.1f} % above serving's, more than "
            f"maxP99LatencyRegressionPercent {limit:g} ({figures}).",
        )
    return Verdict(
        ShadowVerdict.PASSED,
        Reason.THRESHOLDS_MET,
        f"All thresholds met on {aggregates.compared} requests ({figures}).",
    )
