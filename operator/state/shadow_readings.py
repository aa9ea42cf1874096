"""What the serving runtimes measured of one shadow candidate, as the operator reads it.

The metrics source (`kubeinfer.operator.metrics_sources`) fills this from Prometheus or from the
runtime pods' own /metrics; the verdict (`kubeinfer.operator.rollout.verdict`) judges it.
Every figure covers the whole shadow of one candidate engine (its digest), summed or
maximised over the serving pods.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShadowAggregates:
    """Running aggregates of one candidate's shadow, over every serving pod."""

    compared: int = 0
    """Mirrored requests whose answers were compared (mismatches included)."""

    mismatches: int = 0
    """Compared requests whose outputs differed in name, shape or datatype: each one is a
    disagreement, whatever the thresholds."""

    dropped: int = 0
    """Requests the mirror could not take (its queue was full)."""

    candidate_errors: int = 0
    """Mirrored requests the candidate answered with an error (or not at all)."""

    timeouts: int = 0
    """Mirrored requests the candidate did not answer within the mirror's timeout."""

    max_abs_difference: float | None = None
    """Largest absolute difference of one output element, candidate against serving; None
    when nothing was compared."""

    top1_rows: int = 0
    """Rows of classification-shaped outputs compared (argmax over the last axis)."""

    top1_agreements: int = 0
    """Of those rows, the ones whose argmax agreed."""

    serving_p99_seconds: float | None = None
    """p99 latency of the serving runtime on the mirrored requests."""

    candidate_p99_seconds: float | None = None
    """p99 latency of the candidate on the same requests, measured the same way (its own
    server-side time, reported in its answer)."""

    @property
    def top1_agreement(self) -> float | None:
        """Share of compared rows whose top-1 class agreed; None without any such row."""
        return self.top1_agreements / self.top1_rows if self.top1_rows else None


@dataclass(frozen=True)
class ShadowReading:
    """What the metrics source said of the running candidate in one pass: its aggregates,
    or why they could not be read (`aggregates` None, `error` the reason)."""

    aggregates: ShadowAggregates | None
    error: str = ""
