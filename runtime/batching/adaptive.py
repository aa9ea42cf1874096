"""SLO-driven adaptive batching: the queue delay, preferred batch size and batches at once to
run with next, decided from what the batcher measured itself. Pure: no asyncio, no clock.

The batcher keeps a `MeasuredLoad`: its compute time per batch-size bucket
(`ComputeProfile`, a smoothed mean and mean deviation per power-of-two bucket, as TCP
estimates its round-trip time, RFC 6298), kept apart for batches that ran alone on the
engine and batches that ran beside another (`EngineProfile`), and the arrival rate of rows
(`ArrivalRate`, an exponentially decayed count). `next_setting` turns that, the rows queued
now and the latency target (the SLO's p99 less its margin) into a `BatchSetting`, which
`BatchSetting.applied_to` makes into the `BatchingPolicy` that `policy.next_decision`
reads, and the batches the scheduler lets run at once. The flush rules are the static
policy's: only these values change.

First, whether batches should overlap at all. Two batches side by side each take longer
than one alone; the slots are worth using together only when they still add throughput
(`EngineProfile.parallel_slots`: slots times the ratio of a batch's time alone to its time
beside another, from the buckets measured both ways; the configured slots until then). A
GPU overlapping copies with compute gains; CPU threads sharing cores and memory bandwidth
with each other and with the HTTP server mostly do not. Below OVERLAP_WORTH the policy
serializes: one batch runs at a time (`BatchSetting.concurrent_batches`), formed while the
one before it runs, and the slots count as one in the model below (with some hysteresis:
OVERLAP_HYSTERESIS). A delay alone cannot serialize: a full batch, or a queue past
maxBatchSize, starts at once on a free slot.

Then the latency model, per candidate batch size `b` (powers of two, and maxBatchSize):

    predicted p99 = delay + compute(b) + compute_p99(b) + backlog(b)

A request may wait `delay` for its batch to fill, then for the batch ahead of it on a
slot (at its mean), then for its own (at its tail); `backlog(b)` is the time the slots take
to clear the rows queued now in batches of `b`. A size is feasible when the budget left for
waiting (target - compute(b) - compute_p99(b) - backlog(b)) is not negative and the rows
it still waits for are expected to arrive within it. Throughput is what the objective
maximises, and it is the arrival rate whenever a size serves that rate (and the queue,
within the target) with room to spare (its slots busy at most UTILISATION_LIMIT of the
time): then the smallest such feasible size wins, the lowest latency at the same
throughput; otherwise the feasible size with the most rows per second of compute. The
delay is what waiting for it needs (twice the expected fill time), never more than the
budget.

When no size is feasible there are two cases. A backlog that no size clears within the
target (the server is behind): the most efficient size, waited for as its filling needs, to
catch up fastest. Otherwise the SLO is below what the engine can do: the smallest
predicted latency, no delay. Before any batch has been measured the configured static
values stay in force.

Predictions stay on the cautious side: below the smallest measured size a batch is taken
to cost as much as that size, above the largest it is taken to cost proportionally more
(no gain from batching that was not seen). Larger batches are measured anyway when a
queue builds (a flush takes up to maxBatchSize), and then become choices.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from kubeinfer.contract.runtime_config import BatchingPolicy

MEAN_GAIN = 1 / 8
"""Weight of a new batch's compute time in its bucket's mean (RFC 6298's alpha)."""
DEVIATION_GAIN = 1 / 4
"""Weight of a new batch's distance from the mean in the bucket's deviation (beta)."""
TAIL_DEVIATIONS = 4
"""Compute time's tail estimate: the mean plus this many mean deviations (RFC 6298's K)."""
ARRIVAL_WINDOW_SECONDS = 0.5
"""Time constant of the arrival rate: a change of rate shows within about this long."""
FILL_SLACK = 2.0
"""The delay allows this many times the expected time for the preferred size to fill, so
that a batch under an irregular arrival process still usually fills."""
UTILISATION_LIMIT = 0.5
"""A batch size serves the arrival rate when its slots would be busy at most this share of
the time: beyond it queues build in bursts, which the model's one batch ahead of a request
no longer covers."""
DECISION_INTERVAL_SECONDS = 0.02
"""How often the batcher asks for a new setting: often enough to follow a burst within a
few batches, rarely enough to cost nothing next to them."""
OVERLAP_WORTH = 1.25
"""Batches overlap on the slots only where that is measured to give at least this many
slots' worth of throughput: a batch started beside a running one slows it, which must buy
a quarter of a slot more at least."""
OVERLAP_HYSTERESIS = 0.1
"""Batches that overlap are serialized below OVERLAP_WORTH less this, and serialized ones
overlap again above OVERLAP_WORTH plus this: a measurement wavering around the bound (a
shared machine's) does not switch the batcher back and forth."""
MAX_QUEUE_DELAY_MICROSECONDS = 1_000_000
"""The largest delay chosen (maxQueueDelayMicroseconds' own bound)."""


def bucket_of(rows: int) -> int:
    """The power-of-two bucket of a batch: 1 -> 0, 2 -> 1, 3..4 -> 2, 5..8 -> 3, ..."""
    return (rows - 1).bit_length()


@dataclass(frozen=True, slots=True)
class ComputeEstimate:
    """What the batches of one bucket took: smoothed rows, compute seconds and deviation."""

    rows: float
    seconds: float
    deviation_seconds: float

    @property
    def tail_seconds(self) -> float:
        return self.seconds + TAIL_DEVIATIONS * self.deviation_seconds

    def measured(self, rows: int, seconds: float) -> ComputeEstimate:
        deviation = abs(seconds - self.seconds)
        return ComputeEstimate(
            self.rows + MEAN_GAIN * (rows - self.rows),
            self.seconds + MEAN_GAIN * (seconds - self.seconds),
            self.deviation_seconds + DEVIATION_GAIN * (deviation - self.deviation_seconds),
        )


@dataclass(frozen=True, slots=True)
class ComputePrediction:
    """The predicted compute time of one batch size: its mean and its tail (p99)."""

    seconds: float
    tail_seconds: float


@dataclass(frozen=True, slots=True)
class ComputeProfile:
    """The batcher's compute time per batch-size bucket, as measured by its own batches."""

    buckets: tuple[ComputeEstimate, ...] = ()
    """By bucket (`bucket_of`), those measured; sorted by bucket, hence by rows."""
    bucket_ids: tuple[int, ...] = ()

    def measured(self, rows: int, seconds: float) -> ComputeProfile:
        """With one more batch counted (a failed batch, with no time, is not)."""
        if rows < 1 or seconds <= 0:
            return self
        bucket = bucket_of(rows)
        ids = list(self.bucket_ids)
        estimates = list(self.buckets)
        if bucket in ids:
            at = ids.index(bucket)
            estimates[at] = estimates[at].measured(rows, seconds)
        else:
            # The first batch of a bucket: the deviation starts at half the time (RFC 6298),
            # so one lucky batch does not make a size look dependable.
            at = sum(1 for i in ids if i < bucket)
            ids.insert(at, bucket)
            estimates.insert(at, ComputeEstimate(float(rows), seconds, seconds / 2))
        return ComputeProfile(tuple(estimates), tuple(ids))

    def predict(self, rows: int) -> ComputePrediction | None:
        """The compute time of a batch of `rows`; None before any batch was measured.
        Between measured buckets, linear; below the smallest, that bucket's time; above the
        largest, proportional to rows (no gain from batching that was not measured)."""
        points = self.buckets
        if not points:
            return None
        first, last = points[0], points[-1]
        if rows <= first.rows:
            return ComputePrediction(first.seconds, first.tail_seconds)
        if rows >= last.rows:
            scale = rows / last.rows
            return ComputePrediction(last.seconds * scale, last.tail_seconds * scale)
        for low, high in itertools.pairwise(points):
            if rows <= high.rows:
                share = (rows - low.rows) / (high.rows - low.rows)
                return ComputePrediction(
                    low.seconds + share * (high.seconds - low.seconds),
                    low.tail_seconds + share * (high.tail_seconds - low.tail_seconds),
                )
        raise AssertionError("unreachable: rows is within the measured range")


@dataclass(frozen=True, slots=True)
class ArrivalRate:
    """Rows arriving per second: an exponentially decayed count of the rows queued, with
    time constant ARRIVAL_WINDOW_SECONDS."""

    decayed_rows: float = 0.0
    at: float | None = None

    def arrived(self, rows: int, now: float) -> ArrivalRate:
        return ArrivalRate(self._decayed(now) + rows, now)

    def rows_per_second(self, now: float) -> float:
        return self._decayed(now) / ARRIVAL_WINDOW_SECONDS

    def _decayed(self, now: float) -> float:
        if self.at is None:
            return 0.0
        return self.decayed_rows * math.exp(-max(0.0, now - self.at) / ARRIVAL_WINDOW_SECONDS)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """The compute times of batches that ran alone on the engine, and of batches that ran
    beside another (on another slot) for some of their time."""

    alone: ComputeProfile = ComputeProfile()
    beside: ComputeProfile = ComputeProfile()

    def measured(self, rows: int, seconds: float, *, beside: bool) -> EngineProfile:
        if beside:
            return replace(self, beside=self.beside.measured(rows, seconds))
        return replace(self, alone=self.alone.measured(rows, seconds))

    def parallel_slots(self, slots: int) -> float:
        """What `slots` slots running at once are worth, in slots of a batch alone: `slots`
        times the median, over the buckets measured both ways, of a batch's time alone
        over its time beside another (between 1 and `slots`; `slots` until measured)."""
        if slots <= 1:
            return 1.0
        beside = dict(zip(self.beside.bucket_ids, self.beside.buckets, strict=True))
        ratios = [
            alone.seconds / beside[bucket].seconds
            for bucket, alone in zip(self.alone.bucket_ids, self.alone.buckets, strict=True)
            if bucket in beside
        ]
        if not ratios:
            return float(slots)
        return min(float(slots), max(1.0, slots * statistics.median(ratios)))


@dataclass(frozen=True, slots=True)
class MeasuredLoad:
    """Everything the batcher measures for the adaptive policy."""

    engine: EngineProfile = EngineProfile()
    arrivals: ArrivalRate = ArrivalRate()

    def arrived(self, rows: int, now: float) -> MeasuredLoad:
        return replace(self, arrivals=self.arrivals.arrived(rows, now))

    def batch_ran(self, rows: int, compute_seconds: float, *, beside: bool) -> MeasuredLoad:
        return replace(self, engine=self.engine.measured(rows, compute_seconds, beside=beside))


class SettingReason(StrEnum):
    """Why the adaptive policy chose its setting."""

    UNMEASURED = "Unmeasured"
    """No batch measured yet: the configured static values apply."""
    WITHIN_SLO = "WithinSlo"
    """A batch size whose predicted p99 is within the target: the smallest that serves the
    load with room to spare, or else the most efficient."""
    BEHIND = "Behind"
    """The queue holds more than any batch size clears within the target: the most
    efficient size, to catch up."""
    SLO_UNREACHABLE = "SloUnreachable"
    """Even the fastest batch is predicted over the target: the lowest latency there is."""


@dataclass(frozen=True, slots=True)
class BatchSetting:
    """The two values the adaptive policy sets, and what it predicted for them."""

    queue_delay_microseconds: int
    preferred_batch_size: int
    reason: SettingReason
    predicted_p99_seconds: float | None = None
    parallel_slots: float | None = None
    """What the slots running at once were measured to be worth (`EngineProfile`)."""
    concurrent_batches: int | None = None
    """Most batches run at once: every execution slot (None, or their number), or 1 where
    the slots were measured to be worth less than OVERLAP_WORTH together."""

    @staticmethod
    def of_policy(policy: BatchingPolicy) -> BatchSetting:
        """The static policy's own values: its delay, and the size it waits for (its largest
        preferred size, or maxBatchSize)."""
        sizes = policy.preferred_batch_sizes
        return BatchSetting(
            policy.max_queue_delay_microseconds,
            sizes[-1] if sizes else policy.max_batch_size,
            SettingReason.UNMEASURED,
        )

    def applied_to(self, policy: BatchingPolicy) -> BatchingPolicy:
        """`policy` with this delay and preferred size; unchanged while unmeasured."""
        if self.reason is SettingReason.UNMEASURED:
            return policy
        return policy.model_copy(
            update={
                "max_queue_delay_microseconds": self.queue_delay_microseconds,
                "preferred_batch_sizes": [self.preferred_batch_size],
            }
        )


@dataclass(frozen=True, slots=True)
class LatencyTarget:
    """What the adaptive policy holds: the batcher's p99 under `seconds` (the SLO less its
    margin), with batches of at most `max_batch_size` rows on `execution_slots` slots."""

    seconds: float
    max_batch_size: int
    execution_slots: int

    @staticmethod
    def of_slo(
        slo_p99_latency_milliseconds: float,
        margin_percent: float,
        max_batch_size: int,
        execution_slots: int,
    ) -> LatencyTarget:
        return LatencyTarget(
            slo_p99_latency_milliseconds / 1000 * (1 - margin_percent / 100),
            max_batch_size,
            execution_slots,
        )


def candidate_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two below maxBatchSize, and maxBatchSize."""
    sizes = [1 << k for k in range(max_batch_size.bit_length()) if 1 << k < max_batch_size]
    return (*sizes, max_batch_size)


@dataclass(frozen=True, slots=True)
class _Option:
    size: int
    rows_per_second: float
    compute_seconds: float  # the batch ahead at its mean, then its own at its tail
    backlog_seconds: float
    fill_seconds: float

    def budget_seconds(self, target: LatencyTarget, backlog: bool = True) -> float:
        """What the target leaves for waiting (negative: over it already)."""
        return target.seconds - self.compute_seconds - (self.backlog_seconds if backlog else 0)

    @property
    def predicted_seconds(self) -> float:
        return self.compute_seconds + self.backlog_seconds


def _microseconds(seconds: float) -> int:
    return max(0, min(MAX_QUEUE_DELAY_MICROSECONDS, int(seconds * 1e6)))


def _options(
    target: LatencyTarget,
    compute: ComputeProfile,
    slots: float,
    arrival_rows_per_second: float,
    queued_rows: int,
) -> list[_Option] | None:
    options: list[_Option] = []
    rate = arrival_rows_per_second
    for size in candidate_sizes(target.max_batch_size):
        prediction = compute.predict(size)
        if prediction is None:
            return None
        to_come = max(0, size - max(1, queued_rows))  # rows the batch still waits for
        options.append(
            _Option(
                size,
                size / prediction.seconds,
                prediction.seconds + prediction.tail_seconds,
                math.ceil(queued_rows / size) * prediction.seconds / slots,
                to_come / rate if rate > 0 else (math.inf if to_come else 0.0),
            )
        )
    return options


def next_setting(
    target: LatencyTarget,
    engine: EngineProfile,
    arrival_rows_per_second: float,
    queued_rows: int,
    unmeasured: BatchSetting,
    previous: BatchSetting | None = None,
) -> BatchSetting:
    """The setting to run with next; see the module docstring for the model. `previous`
    (the setting in force) decides whether batches overlap while the slots' measured worth
    is within OVERLAP_HYSTERESIS of OVERLAP_WORTH."""
    parallel = engine.parallel_slots(target.execution_slots)
    serialized = previous is not None and previous.concurrent_batches == 1
    bound = OVERLAP_WORTH + (OVERLAP_HYSTERESIS if serialized else -OVERLAP_HYSTERESIS)
    overlap = parallel >= bound
    # The times that apply: beside another batch where batches overlap, alone where they
    # are serialized; the other kind until the one that applies is measured.
    first, other = (engine.beside, engine.alone) if overlap else (engine.alone, engine.beside)
    slots = parallel if overlap else 1.0
    options = _options(
        target, first if first.buckets else other, slots, arrival_rows_per_second, queued_rows
    )
    if options is None:
        return unmeasured

    def setting(delay: int, best: _Option, reason: SettingReason) -> BatchSetting:
        if overlap:
            predicted = best.predicted_seconds + delay / 1e6
            slots = target.execution_slots
            return BatchSetting(delay, best.size, reason, predicted, parallel, slots)
        # Serialized: one batch at a time, formed while the one before it runs (delay and
        # preferred size play no part then: a batch starts only on an idle engine).
        size = target.max_batch_size
        return BatchSetting(0, size, reason, best.predicted_seconds, parallel, 1)

    def efficiency(option: _Option) -> tuple[float, int]:
        # Highest throughput; between equals, the smaller size (the lower latency).
        return option.rows_per_second, -option.size

    feasible = [o for o in options if 0 <= o.fill_seconds <= o.budget_seconds(target)]
    if feasible:
        # Throughput is the arrival rate once a size serves it with room to spare: of those,
        # the smallest (the lowest latency); with none, the most efficient. The rows to
        # serve: those arriving, and the queue's within the target.
        needed = arrival_rows_per_second + queued_rows / target.seconds
        enough = [o for o in feasible if o.rows_per_second * slots * UTILISATION_LIMIT >= needed]
        best = min(enough, key=lambda o: o.size) if enough else max(feasible, key=efficiency)
        delay = min(best.budget_seconds(target), FILL_SLACK * best.fill_seconds)
        return setting(_microseconds(delay), best, SettingReason.WITHIN_SLO)
    if queued_rows and any(o.budget_seconds(target, backlog=False) >= 0 for o in options):
        # Some size would hold the target, but not with this queue ahead of it: the most
        # efficient size, waited for while its rows come, up to the target.
        best = max(options, key=efficiency)
        delay = min(target.seconds, FILL_SLACK * best.fill_seconds)
        return setting(_microseconds(delay), best, SettingReason.BEHIND)
    best = min(options, key=lambda o: (o.predicted_seconds, o.size))
    return setting(0, best, SettingReason.SLO_UNREACHABLE)


def status_of(
    policy: BatchingPolicy,
    slo_p99_latency_milliseconds: float | None,
    setting: BatchSetting,
    load: MeasuredLoad | None,
    now: float,
) -> dict[str, Any]:
    """The batching policy and the setting in force as JSON (the runtime's GET
    /v2/batching; camelCase, units in the names); `load` is None under Static."""
    status: dict[str, Any] = {
        "policy": str(policy.policy),
        "sloP99LatencyMilliseconds": slo_p99_latency_milliseconds,
        "maxBatchSize": policy.max_batch_size,
        "queueDelayMicroseconds": setting.queue_delay_microseconds,
        "preferredBatchSize": setting.preferred_batch_size,
    }
    if load is None or slo_p99_latency_milliseconds is None:
        return status

    def by_size(profile: ComputeProfile) -> list[dict[str, float]]:
        return [
            {
                "rows": estimate.rows,
                "meanMilliseconds": estimate.seconds * 1000,
                "tailMilliseconds": estimate.tail_seconds * 1000,
            }
            for estimate in profile.buckets
        ]

    predicted = setting.predicted_p99_seconds
    return status | {
        "sloMarginPercent": policy.slo_margin_percent,
        "targetP99Milliseconds": slo_p99_latency_milliseconds
        * (1 - policy.slo_margin_percent / 100),
        "reason": str(setting.reason),
        "predictedP99Milliseconds": None if predicted is None else predicted * 1000,
        "parallelSlots": setting.parallel_slots,
        "concurrentBatches": setting.concurrent_batches,
        "arrivalRowsPerSecond": load.arrivals.rows_per_second(now),
        "computeAlone": by_size(load.engine.alone),
        "computeBesideAnother": by_size(load.engine.beside),
    }
