//! Overlapping batches, or not: what the slots are worth together (the median over the
//! sizes measured both ways), and serialized batches: one slot, or slots measured not to
//! add up when they run together, run one batch at a time whatever the reason for the
//! setting, and the prediction counts each batch of the backlog in turn on that one slot.

use super::*;

#[test]
fn the_slots_worth_is_the_median_over_the_sizes_measured_both_ways() {
    let estimate = |rows, seconds| ComputeEstimate {
        rows,
        seconds,
        deviation_seconds: 0.0,
    };
    let alone = steady_profile(&[1, 8, 64, 128], 1.0);
    // Beside another: 1 row at 0.8 of its speed alone, 8 rows in a hiccup (far slower),
    // 64 rows at 0.91; 128 rows never ran beside another, so they do not count.
    let beside = ComputeProfile {
        buckets: vec![
            (0, estimate(1.0, 8.5 * MS * 1.25)),
            (3, estimate(8.0, 1.0)),
            (6, estimate(64.0, 40.0 * MS * 1.1)),
        ],
    };
    let engine = EngineProfile { alone, beside };
    assert!(
        close(engine.parallel_slots(2), 1.6),
        "{}",
        engine.parallel_slots(2)
    );
    assert!(
        close(engine.parallel_slots(4), 3.2),
        "{}",
        engine.parallel_slots(4)
    );
    // An even count of sizes: the mean of the middle two (0.8 and 0.91).
    let mut even = engine.clone();
    even.beside.buckets.remove(1);
    let worth = 2.0 * (0.8 + 1.0 / 1.1) / 2.0;
    assert!(
        close(even.parallel_slots(2), worth),
        "{}",
        even.parallel_slots(2)
    );
}

/// An engine whose batches take `slower` times as long beside another as alone.
fn slowed_beside(slower: f64) -> EngineProfile {
    EngineProfile {
        alone: steady(),
        beside: steady_profile(&[1, 2, 4, 8, 16, 32, 64], slower),
    }
}

#[test]
fn one_slot_serializes_and_counts_once() {
    // 200 rows/s on one slot, busy at most half the time: 4 rows (400 rows/s), predicted
    // at 10 ms ahead and 10 ms its own.
    let engine = EngineProfile {
        alone: steady(),
        beside: ComputeProfile::default(),
    };
    let setting = decide_on_slots(1, 110.0, 200.0, 0, &engine);
    assert_eq!(setting.parallel_slots, Some(1.0));
    assert_eq!(setting.concurrent_batches, Some(1));
    assert_eq!(setting.reason, SettingReason::WithinSlo);
    assert!(
        close(setting.predicted_p99_seconds.unwrap(), 0.020),
        "{setting:?}"
    );
}

#[test]
fn serialized_batches_run_one_at_a_time_whatever_the_reason() {
    // Behind too: a full batch beside the running one would slow it (a delay alone could
    // not hold it back: a full batch starts at once on a free slot).
    use SettingReason::{Behind, SloUnreachable, WithinSlo};
    let engine = slowed_beside(2.0);
    for (slo, rate, queued, reason) in [
        (110.0, 500.0, 400, Behind),
        (20.0, 500.0, 0, SloUnreachable),
        (110.0, 0.0, 0, WithinSlo),
    ] {
        let setting = decide(slo, rate, queued, 20.0, &engine);
        assert_eq!(setting.reason, reason, "{setting:?}");
        assert_eq!(setting.concurrent_batches, Some(1), "{setting:?}");
        // A batch starts only on an idle engine: no delay, whatever is queued goes.
        assert_eq!(setting.queue_delay_microseconds, 0);
        assert_eq!(setting.preferred_batch_size, 64);
    }
}

#[test]
fn serialized_batches_count_the_backlog_one_batch_after_another() {
    // Two slots worth 1.12 together (below 1.25 - 0.1): serialized. 40 rows queued, none
    // arriving, within 88 ms: 16 rows a batch is the smallest that clears them with room
    // (1000 rows/s on one slot, busy half the time); the three batches of the backlog run
    // in turn (3 * 16 ms), then a request's own batch behind the one ahead (16 + 16 ms).
    let setting = decide(110.0, 0.0, 40, 20.0, &slowed_beside(1.0 / 0.56));
    assert_eq!(setting.concurrent_batches, Some(1), "{setting:?}");
    let predicted = setting.predicted_p99_seconds.unwrap();
    assert!(
        close(predicted, (3.0 * 16.0 + 16.0 + 16.0) * MS),
        "{predicted}"
    );
}
