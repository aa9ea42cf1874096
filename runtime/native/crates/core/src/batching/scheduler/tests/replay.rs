//! The SLO property on the scheduler, over generated arrival sequences replayed on a fake
//! clock (seeded, so a failure replays): waiting for a better batch size may delay a
//! request, never cost it its deadline. A request the scheduler held back while a slot was
//! free for it is never left to expire in the queue; a request expires there only behind
//! busy slots, where no wait of the policy's is to blame.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::batching::seeded::Seeded;

fn us(micros: u64) -> Time {
    Duration::from_micros(micros)
}

/// 1 to 3 slots, up to 8 rows a batch, a queue delay of 1 to 10 ms and up to two preferred
/// sizes; Static, or Adaptive against an SLO of 5 to 100 ms.
fn generated_config(random: &mut Seeded) -> BatchingConfig {
    let mut preferred: Vec<usize> = (0..random.below(3))
        .map(|_| random.between(2, 8) as usize)
        .collect();
    preferred.sort_unstable();
    preferred.dedup();
    let adaptive = random.below(2) == 0;
    BatchingConfig {
        policy: if adaptive {
            PolicyKind::Adaptive
        } else {
            PolicyKind::Static
        },
        slo_p99_latency_milliseconds: adaptive.then(|| random.between(5, 100) as f64),
        max_queue_delay_microseconds: random.between(1_000, 10_000),
        preferred_batch_sizes: preferred,
        execution_slots: random.between(1, 3) as usize,
        ..config(1, 0, &[])
    }
}

/// 80 requests of 1 to 4 rows at levels 1 to 3, 0 to 3 ms apart, each with 1 to 30 ms to
/// its deadline (some shorter than the queue delay), in the order they arrive.
fn generated_arrivals(random: &mut Seeded) -> Vec<Queued<Caller>> {
    let mut at = 0;
    (0..80)
        .map(|id| {
            at += random.below(3_000);
            let rows = random.between(1, 4) as usize;
            let level = random.between(1, 3) as u32;
            let deadline = us(at + random.between(1_000, 30_000));
            Queued {
                arrived_at: us(at),
                ..request(id, rows, level, deadline)
            }
        })
        .collect()
}

/// What the replays saw, so that a generator gone narrow fails instead of passing on
/// nothing: steps that held requests back with a slot free, such requests that ran
/// later, and requests that expired (behind busy slots).
#[derive(Default)]
struct Seen {
    held_back: usize,
    ran_after_waiting: usize,
    expired: usize,
}

/// Replays `arrivals` on an engine whose batch of `rows` takes `compute(rows)`, stepping
/// at every arrival, every batch's end and every time a step asked to be woken.
fn replay(
    config: BatchingConfig,
    arrivals: Vec<Queued<Caller>>,
    compute: impl Fn(usize) -> Duration,
    seen: &mut Seen,
) {
    let slots = config.execution_slots;
    let mut s = Scheduler::new(config).unwrap();
    let mut arrivals = arrivals.into_iter().peekable();
    let mut ends: BTreeMap<BatchId, (Time, Duration)> = BTreeMap::new();
    let mut held_back = BTreeSet::new();
    let mut now = Time::ZERO;
    loop {
        while let Some(request) = arrivals.next_if(|q| q.arrived_at <= now) {
            s.push(request, now);
        }
        finish_ended(&mut s, &mut ends, now);
        let step = s.step(now);
        for request in &step.expired {
            let id = request.payload.id;
            assert!(
                !held_back.contains(&id),
                "request {id} expired at {now:?}, held back while a slot was free for it"
            );
        }
        seen.expired += step.expired.len();
        for batch in &step.run {
            let waited = batch
                .members
                .iter()
                .filter(|m| held_back.contains(&m.payload.id));
            seen.ran_after_waiting += waited.count();
            let took = compute(batch.rows);
            ends.insert(batch.id, (now + took, took));
        }
        assert!(s.running().0 <= slots, "more batches than slots at {now:?}");
        held_back = match s.free_and_busy().0 {
            0 => BTreeSet::new(),
            _ => s.queue.iter().map(|q| q.payload.id).collect(),
        };
        seen.held_back += usize::from(!held_back.is_empty());
        let next_arrival = arrivals.peek().map(|q| q.arrived_at);
        let next_end = ends.values().map(|(end, _)| *end).min();
        let Some(next) = [next_arrival, next_end, step.wake_at]
            .into_iter()
            .flatten()
            .min()
        else {
            return;
        };
        assert!(next > now, "asked to be woken at {next:?}, at {now:?}");
        now = next;
    }
}

/// Tells the scheduler of the batches that ended by `now` (each with its compute time).
fn finish_ended(
    s: &mut Scheduler<Caller>,
    ends: &mut BTreeMap<BatchId, (Time, Duration)>,
    now: Time,
) {
    let ended: Vec<BatchId> = ends
        .iter()
        .filter(|(_, (end, _))| *end <= now)
        .map(|(&id, _)| id)
        .collect();
    for id in ended {
        let (_, took) = ends.remove(&id).expect("listed just now");
        s.finished(id, Some(took), now);
    }
}

#[test]
fn a_request_held_back_with_a_slot_free_is_never_left_to_expire() {
    let mut random = Seeded::new(0xDEAD_11E5);
    let mut seen = Seen::default();
    for _ in 0..300 {
        let config = generated_config(&mut random);
        let arrivals = generated_arrivals(&mut random);
        let (base, per_row) = (random.between(1_000, 4_000), random.between(100, 500));
        let compute = move |rows: usize| us(base + per_row * rows as u64);
        replay(config, arrivals, compute, &mut seen);
    }
    assert!(seen.held_back > 0 && seen.ran_after_waiting > 0 && seen.expired > 0);
}
