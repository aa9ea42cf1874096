//! The SLO property over generated measured states (seeded, so a failure replays): every
//! setting is one the scheduler can run, a setting said to be within the SLO is predicted
//! within the target with its delay counted, and where the SLO is out of reach nothing
//! waits (waiting could only add to a latency already over the target).

use super::*;
use crate::batching::seeded::Seeded;

/// An engine measured by 1 to 8 batches (1 to 128 rows, 10 µs to 0.5 s each), each also
/// measured again with up to 0.1 s of jitter: beside another batch where the jitter is
/// large, alone otherwise.
fn measured_engine(random: &mut Seeded) -> EngineProfile {
    let mut engine = EngineProfile::default();
    for _ in 0..random.between(1, 8) {
        let rows = random.between(1, 128) as usize;
        let seconds = random.log_between(1e-5, 0.5);
        let jitter = 0.1 * random.unit();
        engine.measure(rows, seconds, false);
        engine.measure(rows, seconds + jitter, jitter > 0.05);
    }
    engine
}

#[test]
fn every_setting_can_run_and_a_within_slo_one_is_predicted_within_it() {
    let mut random = Seeded::new(0x51_0B0B);
    // What the generated states reached: each reason, overlapping and serialized batches,
    // a delay, so that a generator gone narrow fails rather than passes on nothing.
    let mut reached = std::collections::BTreeSet::new();
    for case in 0..5000 {
        let engine = measured_engine(&mut random);
        let slots = random.between(1, 16) as usize;
        let max_batch = random.between(1, 128) as usize;
        let slo_ms = random.log_between(0.1, 5000.0);
        let margin = random.between(0, 90) as f64;
        let rate = if random.below(4) == 0 {
            0.0
        } else {
            random.log_between(0.1, 1e6)
        };
        let queued = if random.below(3) == 0 {
            0
        } else {
            random.between(1, 10_000) as usize
        };
        let target = LatencyTarget::of_slo(slo_ms, margin, max_batch, slots);
        let setting = next_setting(&target, &engine, rate, queued, &unmeasured(), None);
        let state = format!("case {case}: {target:?} {rate} {queued}: {setting:?}");
        assert!(
            (1..=max_batch).contains(&setting.preferred_batch_size),
            "{state}"
        );
        assert!(
            setting.queue_delay_microseconds <= MAX_QUEUE_DELAY_MICROSECONDS,
            "{state}"
        );
        let parallel = setting.parallel_slots.expect("measured");
        assert!((1.0..=slots as f64).contains(&parallel), "{state}");
        // With no setting in force before, batches overlap down to the band's lower edge.
        let overlap = parallel >= OVERLAP_WORTH - OVERLAP_HYSTERESIS;
        let at_once = if overlap { slots } else { 1 };
        assert_eq!(setting.concurrent_batches, Some(at_once), "{state}");
        reached.insert(setting.reason.name());
        reached.insert(if overlap { "overlapping" } else { "serialized" });
        if setting.queue_delay_microseconds > 0 {
            reached.insert("waiting");
        }
        let predicted = setting.predicted_p99_seconds.expect("measured");
        match setting.reason {
            SettingReason::WithinSlo => assert!(predicted <= target.seconds + 1e-6, "{state}"),
            SettingReason::SloUnreachable => {
                assert_eq!(setting.queue_delay_microseconds, 0, "{state}")
            }
            SettingReason::Behind => {}
            SettingReason::Unmeasured => panic!("a measured engine: {state}"),
        }
    }
    let all = [
        "Behind",
        "SloUnreachable",
        "WithinSlo",
        "overlapping",
        "serialized",
        "waiting",
    ];
    assert_eq!(reached, all.into_iter().collect());
}
