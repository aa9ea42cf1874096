"""The adaptive batching policy (`kubeinfer.runtime.batching.adaptive`), pure: what it
measures (compute time per batch-size bucket, alone and beside another batch, the arrival
rate), what slots running together are worth, and the setting it returns for a measured
state, as tables; a property over random states (a setting said to be within
the SLO is predicted within it, and is a setting the batcher can run).

The tables use an engine whose batch of `b` rows takes 8 ms + 0.5 ms * b, every time
(no deviation): per slot 118 rows/s at 1 row, 222 at 2, 400 at 4, 667 at 8, 1000 at 16,
1333 at 32, 1600 at 64; two slots, as fast side by side as alone unless a test says
otherwise, maxBatchSize 64, and an SLO less its 20 % margin.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.adaptive import (
    ARRIVAL_WINDOW_SECONDS,
    MAX_QUEUE_DELAY_MICROSECONDS,
    OVERLAP_HYSTERESIS,
    OVERLAP_WORTH,
    ArrivalRate,
    BatchSetting,
    ComputeEstimate,
    ComputeProfile,
    EngineProfile,
    LatencyTarget,
    SettingReason,
    bucket_of,
    candidate_sizes,
    next_setting,
)

MS = 1e-3


def steady_profile(
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64), slower: float = 1.0
) -> ComputeProfile:
    estimates = tuple(ComputeEstimate(float(b), slower * (8 + 0.5 * b) * MS, 0.0) for b in sizes)
    return ComputeProfile(estimates, tuple(bucket_of(b) for b in sizes))


def side_by_side(profile: ComputeProfile) -> EngineProfile:
    """An engine whose batches take as long beside another as alone: slots add up."""
    return EngineProfile(alone=profile, beside=profile)


UNMEASURED = BatchSetting(2000, 64, SettingReason.UNMEASURED)


def decide(
    slo_ms: float,
    rate: float,
    queued: int = 0,
    *,
    slots: int = 2,
    margin: float = 20,
    engine: EngineProfile | None = None,
) -> BatchSetting:
    target = LatencyTarget.of_slo(slo_ms, margin, 64, slots)
    return next_setting(target, engine or side_by_side(steady_profile()), rate, queued, UNMEASURED)


# --- what is measured --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "bucket"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (1024, 10)]
)
def test_batches_count_in_power_of_two_buckets(rows: int, bucket: int) -> None:
    assert bucket_of(rows) == bucket


@pytest.mark.parametrize(
    ("maximum", "sizes"),
    [(1, (1,)), (2, (1, 2)), (12, (1, 2, 4, 8, 12)), (64, (1, 2, 4, 8, 16, 32, 64))],
)
def test_candidate_sizes_are_powers_of_two_and_the_maximum(
    maximum: int, sizes: tuple[int, ...]
) -> None:
    assert candidate_sizes(maximum) == sizes


def test_nothing_is_predicted_before_a_batch_is_measured() -> None:
    assert ComputeProfile().predict(8) is None


def test_a_first_batch_counts_with_half_its_time_as_deviation() -> None:
    profile = ComputeProfile().measured(8, 0.010)
    predicted = profile.predict(8)
    assert predicted is not None
    assert predicted.seconds == pytest.approx(0.010)
    assert predicted.tail_seconds == pytest.approx(0.010 + 4 * 0.005)


def test_a_later_batch_moves_the_mean_by_an_eighth_and_the_deviation_by_a_quarter() -> None:
    profile = ComputeProfile().measured(8, 0.010).measured(7, 0.018)
    (estimate,) = profile.buckets
    assert estimate.rows == pytest.approx(8 + (7 - 8) / 8)
    assert estimate.seconds == pytest.approx(0.010 + 0.008 / 8)
    assert estimate.deviation_seconds == pytest.approx(0.005 + (0.008 - 0.005) / 4)


def test_a_steady_engine_deviation_fades() -> None:
    profile = ComputeProfile()
    for _ in range(60):
        profile = profile.measured(4, 0.010)
    predicted = profile.predict(4)
    assert predicted is not None and predicted.tail_seconds == pytest.approx(0.010, rel=1e-6)


@pytest.mark.parametrize(("rows", "seconds"), [(0, 0.01), (4, 0.0), (4, -1.0)])
def test_failed_or_empty_batches_are_not_measured(rows: int, seconds: float) -> None:
    assert ComputeProfile().measured(rows, seconds) == ComputeProfile()


def test_buckets_stay_sorted_by_size_whatever_order_they_come_in() -> None:
    profile = ComputeProfile()
    for rows in (16, 1, 64, 4):
        profile = profile.measured(rows, rows * MS)
    assert [e.rows for e in profile.buckets] == [1, 4, 16, 64]
    assert profile.bucket_ids == (0, 2, 4, 6)


@pytest.mark.parametrize(
    ("rows", "milliseconds"),
    [
        (1, 10.0),  # below the smallest measured size: no cheaper than it
        (4, 10.0),  # measured
        (10, 13.0),  # between 4 (10 ms) and 16 (16 ms): linear
        (16, 16.0),
        (64, 64.0),  # above the largest: proportional, no batching gain assumed
    ],
)
def test_predictions_interpolate_and_stay_cautious_outside_what_was_measured(
    rows: int, milliseconds: float
) -> None:
    profile = ComputeProfile(
        (ComputeEstimate(4.0, 10 * MS, 0.0), ComputeEstimate(16.0, 16 * MS, 0.0)), (2, 4)
    )
    predicted = profile.predict(rows)
    assert predicted is not None and predicted.seconds == pytest.approx(milliseconds * MS)


def test_the_arrival_rate_converges_to_the_rows_per_second_arriving() -> None:
    rate, now = ArrivalRate(), 100.0
    for _ in range(2000):  # 4 rows every 10 ms: 400 rows/s, for 20 s
        now += 0.010
        rate = rate.arrived(4, now)
    assert rate.rows_per_second(now) == pytest.approx(400, rel=0.02)


def test_the_arrival_rate_decays_with_its_window() -> None:
    rate = ArrivalRate(decayed_rows=100.0, at=5.0)
    assert rate.rows_per_second(5.0) == pytest.approx(100 / ARRIVAL_WINDOW_SECONDS)
    later = rate.rows_per_second(5.0 + ARRIVAL_WINDOW_SECONDS)
    assert later == pytest.approx(100 / ARRIVAL_WINDOW_SECONDS / math.e)
    assert ArrivalRate().rows_per_second(5.0) == 0


# --- the setting for a measured state ----------------------------------------------------

WITHIN, BEHIND, UNREACHABLE = (
    SettingReason.WITHIN_SLO,
    SettingReason.BEHIND,
    SettingReason.SLO_UNREACHABLE,
)


@pytest.mark.parametrize(
    ("case", "slo_ms", "rate", "queued", "delay_us", "size", "reason"),
    [
        ("idle: a batch of one, no wait", 110, 0, 0, 0, 1, WITHIN),
        # two slots of one row each serve 235 rows/s, busy half the time at 118/s
        ("one row at a time serves the rate with room", 110, 100, 0, 0, 1, WITHIN),
        # 200 rows/s: 2 rows serve 444/s; the delay lets a batch of 2 fill: twice the 5 ms
        # the second row takes to come
        ("the smallest size that serves the rate", 110, 200, 0, 10_000, 2, WITHIN),
        ("a higher rate, a larger batch", 110, 1000, 0, 30_000, 16, WITHIN),
        # 1500 rows/s: 64 rows would serve it, but leave 8 ms to wait and need 42 ms to fill;
        # 32 rows leave 40 ms (88 - 2 * 24) and fill in 21 ms, whose double is cut to 40.
        ("the most efficient size that fills within the SLO", 110, 1500, 0, 40_000, 32, WITHIN),
        ("a looser SLO lets the largest size fill", 200, 1500, 0, 80_000, 64, WITHIN),
        # 31 rows queued: one more to come (0.7 ms), and a slot's 12 ms of backlog
        ("rows already queued need little wait", 110, 1500, 31, 1_333, 32, WITHIN),
        # 40 rows to clear within 88 ms: 8 rows on two slots serve 1333 rows/s, twice that
        ("the queue counts in the rate to serve", 110, 0, 40, 0, 8, WITHIN),
        # 8.5 ms for one row, ahead and then its own, is over 80 % of a 20 ms SLO
        ("an SLO below the engine's speed: the lowest latency", 20, 500, 0, 0, 1, UNREACHABLE),
        # 400 rows queued: 64 at a time on two slots clear them in 140 ms, past 88 ms
        ("a backlog past the SLO: the most efficient size", 110, 500, 400, 0, 64, BEHIND),
    ],
)
def test_the_setting_for_a_measured_state(
    case: str,
    slo_ms: float,
    rate: float,
    queued: int,
    delay_us: int,
    size: int,
    reason: SettingReason,
) -> None:
    setting = decide(slo_ms, rate, queued)
    assert (setting.preferred_batch_size, setting.reason) == (size, reason), case
    assert setting.queue_delay_microseconds == pytest.approx(delay_us, abs=2), case
    assert (setting.parallel_slots, setting.concurrent_batches) == (2, 2)


def test_before_any_batch_is_measured_the_configured_values_apply() -> None:
    assert decide(110, 1000, engine=EngineProfile()) == UNMEASURED


def test_the_margin_is_kept_out_of_the_budget() -> None:
    # 1500 rows/s with a 150 ms SLO: 64 rows (80 ms of compute, 42 ms to fill) fit in it
    # all, not in the 120 ms left of it with 20 % kept back
    assert decide(150, 1500, margin=0).preferred_batch_size == 64
    assert decide(150, 1500, margin=20).preferred_batch_size == 32
    assert decide(150, 1500, margin=90).reason is UNREACHABLE


def test_the_prediction_is_the_wait_and_two_batches() -> None:
    setting = decide(110, 200)  # 2 rows: 9 ms ahead, 9 ms its own, 10 ms of waiting
    assert setting.predicted_p99_seconds == pytest.approx(0.028)


def test_the_batch_ahead_counts_at_its_mean_and_its_own_at_its_tail() -> None:
    jittery = ComputeProfile((ComputeEstimate(1.0, 10 * MS, 2 * MS),), (0,))
    setting = decide(1000, 0, engine=side_by_side(jittery))
    assert setting.predicted_p99_seconds == pytest.approx((10 + 10 + 4 * 2) * MS)


def test_an_unmeasured_size_above_the_largest_is_never_waited_for() -> None:
    # Only batches of 1 and 2 were seen: 4 and more are taken to cost proportionally more,
    # so nothing beyond 2 rows looks more efficient than 2 rows.
    setting = decide(500, 3000, engine=side_by_side(steady_profile((1, 2))))
    assert setting.preferred_batch_size == 2


def test_a_noisy_engine_gets_a_smaller_batch_than_a_steady_one() -> None:
    steady = steady_profile()
    noisy = ComputeProfile(
        tuple(ComputeEstimate(e.rows, e.seconds, e.seconds / 4) for e in steady.buckets),
        steady.bucket_ids,
    )
    shaky = decide(110, 1500, engine=side_by_side(noisy))
    assert shaky.preferred_batch_size < decide(110, 1500).preferred_batch_size


# --- overlapping batches, or not ---------------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "slower_beside", "parallel"),
    [
        (1, 1.0, 1.0),  # one slot is one slot
        (2, None, 2.0),  # never measured side by side: the configured slots
        (2, 1.0, 2.0),  # side by side as fast as alone: slots add up
        (2, 1.25, 1.6),  # a GPU overlapping copies with compute
        (2, 2.0, 1.0),  # two threads sharing the same cores: no gain
        (2, 4.0, 1.0),  # worse than one: still counted as one
        (4, 2.0, 2.0),
    ],
)
def test_what_the_slots_are_worth_together(
    slots: int, slower_beside: float | None, parallel: float
) -> None:
    beside = ComputeProfile() if slower_beside is None else steady_profile(slower=slower_beside)
    engine = EngineProfile(alone=steady_profile(), beside=beside)
    assert engine.parallel_slots(slots) == pytest.approx(parallel)


def test_the_slots_worth_is_the_median_over_the_sizes_measured_both_ways() -> None:
    alone = steady_profile((1, 8, 64, 128))
    beside = ComputeProfile(
        (
            ComputeEstimate(1.0, 8.5 * MS * 1.25, 0.0),  # 0.8 of the speed alone
            ComputeEstimate(8.0, 1.0, 0.0),  # a hiccup: far slower
            ComputeEstimate(64.0, 40 * MS * 1.1, 0.0),  # 0.91
        ),
        (0, 3, 6),
    )  # 128 rows: never beside another
    assert EngineProfile(alone, beside).parallel_slots(2) == pytest.approx(1.6)


def test_batches_are_measured_alone_or_beside_another() -> None:
    engine = EngineProfile().measured(4, 0.01, beside=False).measured(8, 0.03, beside=True)
    assert [e.rows for e in engine.alone.buckets] == [4]
    assert [e.rows for e in engine.beside.buckets] == [8]


def test_slots_that_do_not_add_up_serialize_the_batches() -> None:
    # Beside another a batch takes twice as long: two slots are worth one. One batch
    # runs at a time; the prediction is one slot's: 200 rows/s served by 4-row batches,
    # 2 * 10 ms.
    engine = EngineProfile(alone=steady_profile(), beside=steady_profile(slower=2.0))
    setting = decide(110, 200, engine=engine)
    assert (setting.parallel_slots, setting.concurrent_batches) == (1.0, 1)
    assert (setting.preferred_batch_size, setting.queue_delay_microseconds) == (64, 0)
    assert setting.reason is WITHIN
    assert setting.predicted_p99_seconds == pytest.approx(0.020)


@pytest.mark.parametrize(
    ("slower_beside", "previously_serialized", "serialized"),
    [
        (1 / 0.70, False, False),  # 2 slots * 0.70 of the speed: worth 1.40
        (1 / 0.56, False, True),  # 1.12: below 1.25 - 0.1
        (1 / 0.60, False, False),  # 1.20: overlapping still
        (1 / 0.60, True, True),  # 1.20: serialized still
        (1 / 0.66, True, True),  # 1.32: serialized still
        (1 / 0.68, True, False),  # 1.36: above 1.25 + 0.1
    ],
)
def test_overlap_or_not_keeps_its_course_near_the_bound(
    slower_beside: float, previously_serialized: bool, serialized: bool
) -> None:
    engine = EngineProfile(alone=steady_profile(), beside=steady_profile(slower=slower_beside))
    previous = BatchSetting(0, 64, WITHIN, None, None, 1 if previously_serialized else 2)
    target = LatencyTarget.of_slo(110, 20, 64, 2)
    setting = next_setting(target, engine, 200, 0, UNMEASURED, previous=previous)
    assert (setting.concurrent_batches == 1) is serialized


def test_one_slot_serializes_and_counts_once() -> None:
    # The same 200 rows/s on one slot: 4 rows now (one slot, busy at most half the time).
    setting = decide(110, 200, slots=1, engine=EngineProfile(alone=steady_profile()))
    assert (setting.parallel_slots, setting.concurrent_batches) == (1.0, 1)
    assert setting.predicted_p99_seconds == pytest.approx(0.020)


@pytest.mark.parametrize(
    ("slo_ms", "rate", "queued", "reason"),
    [(110, 500, 400, BEHIND), (20, 500, 0, UNREACHABLE), (110, 0, 0, WITHIN)],
)
def test_serialized_batches_run_one_at_a_time_whatever_the_reason(
    slo_ms: float, rate: float, queued: int, reason: SettingReason
) -> None:
    # Behind too: a full batch beside the running one would slow it (a delay alone could
    # not hold it back: a full batch starts at once on a free slot).
    engine = EngineProfile(alone=steady_profile(), beside=steady_profile(slower=2.0))
    setting = decide(slo_ms, rate, queued, engine=engine)
    assert setting.reason is reason
    assert setting.concurrent_batches == 1


def test_the_times_that_apply_are_those_of_how_batches_run() -> None:
    # Overlapping: the times beside another batch; a GPU 25 % slower there gets a smaller
    # batch for the same SLO than its times alone would give.
    # (At 1500 rows/s and a 92 ms SLO, 32 rows take 2 * 24 ms alone and fill in 21 ms
    # within the 73.6 ms target; at 30 ms each beside another they do not fit.)
    engine = EngineProfile(alone=steady_profile(), beside=steady_profile(slower=1.25))
    assert decide(92, 1500, engine=engine).preferred_batch_size == 16
    assert decide(92, 1500, engine=side_by_side(steady_profile())).preferred_batch_size == 32


# --- applying a setting ------------------------------------------------------------------


def test_a_setting_replaces_the_delay_and_preferred_sizes_only() -> None:
    policy = BatchingPolicy(max_batch_size=64, preferred_batch_sizes=[8, 16], execution_slots=2)
    applied = BatchSetting(1234, 32, WITHIN).applied_to(policy)
    assert applied.max_queue_delay_microseconds == 1234
    assert applied.preferred_batch_sizes == [32]
    untouched = {"max_queue_delay_microseconds", "preferred_batch_sizes"}
    assert applied.model_dump(exclude=untouched) == policy.model_dump(exclude=untouched)


def test_the_unmeasured_setting_leaves_the_configured_policy_as_it_is() -> None:
    policy = BatchingPolicy(max_batch_size=64, preferred_batch_sizes=[8, 16])
    assert BatchSetting.of_policy(policy) == BatchSetting(2000, 16, SettingReason.UNMEASURED)
    assert BatchSetting.of_policy(policy).applied_to(policy) is policy
    assert BatchSetting.of_policy(BatchingPolicy(max_batch_size=12)).preferred_batch_size == 12


# --- a property over random states -------------------------------------------------------

estimates = st.lists(
    st.tuples(
        st.integers(1, 128),
        st.floats(1e-5, 0.5),
        st.floats(0, 0.1),
    ),
    min_size=1,
    max_size=8,
)


@given(
    measured=estimates,
    slo_ms=st.floats(0.1, 5000),
    margin=st.integers(0, 90),
    rate=st.floats(0, 1e6),
    queued=st.integers(0, 10_000),
    slots=st.integers(1, 16),
    max_batch=st.integers(1, 128),
)
def test_every_setting_can_run_and_a_within_slo_one_is_predicted_within_it(
    measured: list[tuple[int, float, float]],
    slo_ms: float,
    margin: int,
    rate: float,
    queued: int,
    slots: int,
    max_batch: int,
) -> None:
    engine = EngineProfile()
    for rows, seconds, jitter in measured:
        engine = engine.measured(rows, seconds, beside=False)
        engine = engine.measured(rows, seconds + jitter, beside=jitter > 0.05)
    target = LatencyTarget.of_slo(slo_ms, margin, max_batch, slots)
    setting = next_setting(target, engine, rate, queued, UNMEASURED)
    assert 1 <= setting.preferred_batch_size <= max_batch
    assert 0 <= setting.queue_delay_microseconds <= MAX_QUEUE_DELAY_MICROSECONDS
    assert setting.predicted_p99_seconds is not None
    assert setting.parallel_slots is not None and 1 <= setting.parallel_slots <= slots
    # The setting in force (UNMEASURED) overlaps: it goes on doing so down to the lower
    # edge of the hysteresis band.
    overlap = setting.parallel_slots >= OVERLAP_WORTH - OVERLAP_HYSTERESIS
    assert setting.concurrent_batches == (slots if overlap else 1)
    if setting.reason is WITHIN:
        assert setting.predicted_p99_seconds <= target.seconds + 1e-6
    if setting.reason is UNREACHABLE:
        assert setting.queue_delay_microseconds == 0


def test_without_a_queue_nothing_is_behind_even_when_no_size_fills_in_time() -> None:
    # A slow first batch of one row (30 ms) and fast batches of 8 (10 ms): at 10 rows/s
    # only 8 rows would fit a 40 ms SLO, and they take 0.7 s to come.
    profile = ComputeProfile(
        (ComputeEstimate(1.0, 30 * MS, 0.0), ComputeEstimate(8.0, 10 * MS, 0.0)), (0, 3)
    )
    target = LatencyTarget.of_slo(40, 0, 8, 2)
    setting = next_setting(target, side_by_side(profile), 10, 0, UNMEASURED)
    assert (setting.reason, setting.preferred_batch_size) == (UNREACHABLE, 8)
    assert setting.queue_delay_microseconds == 0
