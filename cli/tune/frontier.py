"""What a tuning sweep decides from its measurements: the sweep's grid, the
throughput/p99 frontier, the setting that meets the SLO at the highest throughput, and
what serving at that setting costs. Pure: values in, values out.

A point counts only when every request of its window succeeded: a setting that drops or
refuses requests has no p99 worth comparing (the failures would have been the slowest
requests), so it is reported but is never on the frontier nor chosen.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kubeinfer.contract.cost import PodUsage, WindowCost, window_cost
from kubeinfer.contract.runtime_config import BatchingPolicy, BatchingPolicyKind


@dataclass(frozen=True, order=True)
class Setting:
    """One point of the sweep: the batching settings a server runs with, under policy
    Static (the figures hold for those settings as given; Adaptive moves them)."""

    max_queue_delay_microseconds: int
    max_batch_size: int
    execution_slots: int

    def batching_policy(self) -> BatchingPolicy:
        return BatchingPolicy(
            policy=BatchingPolicyKind.STATIC,
            max_batch_size=self.max_batch_size,
            max_queue_delay_microseconds=self.max_queue_delay_microseconds,
            execution_slots=self.execution_slots,
        )

    def describe(self) -> str:
        return (
            f"maxQueueDelayMicroseconds={self.max_queue_delay_microseconds} "
            f"maxBatchSize={self.max_batch_size} executionSlots={self.execution_slots}"
        )


DEFAULT_MAX_BATCH_SIZES = (8, 32)


def default_max_batch_sizes(largest_request_rows: int) -> list[int]:
    """The batch sizes swept when none are given: 8 and 32, each raised to the largest
    request's rows (a smaller maxBatchSize would refuse that request)."""
    return sorted({max(size, largest_request_rows) for size in DEFAULT_MAX_BATCH_SIZES})


def sweep_grid(
    queue_delays_us: Sequence[int], max_batch_sizes: Sequence[int], execution_slots: Sequence[int]
) -> list[Setting]:
    """Every combination, in a stable order (batch size, then slots, then queue delay, so
    consecutive points differ in the queue delay first, as the seeds sweep it). Each value
    is checked against the `BatchingPolicy` bounds, so a value `kubeinfer serve` would
    refuse is refused here, before anything starts."""
    grid = [
        Setting(delay, size, slots)
        for size, slots, delay in itertools.product(
            sorted(set(max_batch_sizes)), sorted(set(execution_slots)), sorted(set(queue_delays_us))
        )
    ]
    for setting in grid:
        setting.batching_policy()  # raises pydantic's ValidationError, naming the field
    return grid


@dataclass(frozen=True)
class Measurement:
    """What one point of the sweep measured in its window."""

    setting: Setting
    window_seconds: float
    requests_per_second: float
    """Requests answered 200 per second of the window."""

    rows_per_second: float
    errors: int
    """Requests in the window that failed (any other status, a lost connection, no answer)."""

    p50_milliseconds: float
    p99_milliseconds: float
    requests_per_cpu_second: float | None = None
    """Requests the server answered per second of its CPU (a core-second), both as the
    server counted them over the measured run (None where they cannot be read)."""

    mean_batch_rows: float | None = None
    """The batches' mean size over the measured run, from the server's own histogram."""

    load_cpu_seconds: float | None = None
    """CPU the load generator used in its run: beside the server's, it tells whether the
    client rather than the server was the limit (they share the machine)."""

    failure: str | None = None
    """Why the point has no figures (its server did not start, the load broke off, or,
    under perf_analyzer, a request was not answered 200)."""

    error_sample: str | None = None
    """The first failed request's answer, when some failed."""

    @property
    def succeeded(self) -> bool:
        """Every request in the window answered, and some were."""
        return self.failure is None and self.errors == 0 and self.requests_per_second > 0


def meets_slo(point: Measurement, slo_p99_milliseconds: float) -> bool:
    return point.succeeded and point.p99_milliseconds <= slo_p99_milliseconds


def dominates(a: Measurement, b: Measurement) -> bool:
    """`a` is at least as good as `b` on both axes (throughput up, p99 down) and better
    on one."""
    at_least = (
        a.requests_per_second >= b.requests_per_second and a.p99_milliseconds <= b.p99_milliseconds
    )
    better = (
        a.requests_per_second > b.requests_per_second or a.p99_milliseconds < b.p99_milliseconds
    )
    return at_least and better


def pareto_frontier(points: Sequence[Measurement]) -> list[Measurement]:
    """The points no other point dominates (among those that succeeded), by throughput
    ascending: the best p99 each throughput can have. Points with equal figures are all
    kept."""
    usable = [p for p in points if p.succeeded]
    frontier = [p for p in usable if not any(dominates(q, p) for q in usable)]
    return sorted(frontier, key=lambda p: (p.requests_per_second, p.p99_milliseconds, p.setting))


@dataclass(frozen=True)
class Choice:
    """The point that meets the SLO at the highest throughput, or, when none does, the
    one that came closest."""

    point: Measurement | None
    meets_slo: bool
    reason: str


def choose(points: Sequence[Measurement], slo_p99_milliseconds: float) -> Choice:
    """Among the points that meet the SLO, the highest throughput (ties: the lower p99,
    then the smaller setting). None meets it: the succeeded point with the lowest p99,
    else the point that failed the fewest requests."""
    meeting = [p for p in points if meets_slo(p, slo_p99_milliseconds)]
    if meeting:
        best = max(
            meeting,
            key=lambda p: (p.requests_per_second, -p.p99_milliseconds, _negated(_size(p))),
        )
        return Choice(best, True, f"the highest throughput with p99 <= {slo_p99_milliseconds:g} ms")
    succeeded = [p for p in points if p.succeeded]
    if succeeded:
        closest = min(succeeded, key=lambda p: (p.p99_milliseconds, _size(p)))
        return Choice(
            closest,
            False,
            f"no point has p99 <= {slo_p99_milliseconds:g} ms; the lowest p99 was "
            f"{closest.p99_milliseconds:.2f} ms",
        )
    measured = [p for p in points if p.failure is None and p.errors > 0]
    if measured:

        def failed_share(p: Measurement) -> float:
            answered = p.requests_per_second * p.window_seconds
            return p.errors / (answered + p.errors)

        fewest = min(measured, key=lambda p: (failed_share(p), _size(p)))
        return Choice(
            fewest,
            False,
            f"every point failed requests; the fewest failed at {fewest.errors} "
            f"({failed_share(fewest):.1%})",
        )
    return Choice(None, False, "no point was measured")


def _size(point: Measurement) -> tuple[int, int, int]:
    """Orders ties toward the smaller setting: less waiting, fewer slots, smaller batches
    (less memory held for the same figures)."""
    s = point.setting
    return (s.max_queue_delay_microseconds, s.execution_slots, s.max_batch_size)


def _negated(key: tuple[int, int, int]) -> tuple[int, int, int]:
    return (-key[0], -key[1], -key[2])


def window_cost_of(point: Measurement, node_cost_per_hour: float) -> WindowCost:
    """What the point's window cost and 1,000 of its inferences, by the formula the
    operator's status.cost and the dashboard use (`kubeinfer.contract.cost`): one server
    holding the whole node (the node serving only this) for the window, over the requests
    it answered in it (an inference is a request answered, whatever its rows)."""
    pod = PodUsage(
        node_share=1.0, node_price_per_hour=node_cost_per_hour, running_seconds=point.window_seconds
    )
    answered = max(0.0, point.requests_per_second * point.window_seconds)
    return window_cost([pod], answered if math.isfinite(answered) else 0.0)


def eta_seconds(points_done: int, points_total: int, elapsed_seconds: float) -> float | None:
    """Time left at the mean pace of the points done so far (None before the first)."""
    if points_done <= 0:
        return None
    return elapsed_seconds / points_done * (points_total - points_done)
