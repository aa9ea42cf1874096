//! Replays events on a fake clock (plain durations, never sleeping): what each step runs
//! on which slot, reports (expired, gone, stuck) and when it asks to be woken. The SLO
//! property over generated arrival sequences is in `replay`.

use std::cell::Cell;
use std::rc::Rc;

use super::*;
use crate::batching::adaptive::SettingReason;
use crate::batching::config::ShapeBatching;

const FAR: Time = Duration::from_secs(1_000);

fn ms(millis: u64) -> Time {
    Duration::from_millis(millis)
}

/// A request's payload: its number, and whether its caller went away.
#[derive(Debug, Clone)]
struct Caller {
    id: u32,
    gone: Rc<Cell<bool>>,
}

impl Waiter for Caller {
    fn gone(&self) -> bool {
        self.gone.get()
    }
}

fn config(slots: usize, delay_ms: u64, preferred: &[usize]) -> BatchingConfig {
    BatchingConfig {
        policy: PolicyKind::Static,
        max_batch_size: 8,
        max_queue_delay_microseconds: delay_ms * 1000,
        preferred_batch_sizes: preferred.to_vec(),
        execution_slots: slots,
        max_queue_size: 100,
        default_timeout_milliseconds: 1000,
        shape_batching: ShapeBatching::EqualShapes,
        shape_buckets: vec![],
        slo_margin_percent: 20,
        slo_p99_latency_milliseconds: None,
        priority_levels: 3,
        default_priority_level: 2,
    }
}

fn scheduler(slots: usize, delay_ms: u64, preferred: &[usize]) -> Scheduler<Caller> {
    Scheduler::new(config(slots, delay_ms, preferred)).unwrap()
}

fn request(id: u32, rows: usize, level: u32, deadline: Time) -> Queued<Caller> {
    Queued {
        rows,
        arrived_at: Time::ZERO,
        queued_at: Time::ZERO,
        deadline,
        level,
        shape: None,
        payload: Caller {
            id,
            gone: Rc::new(Cell::new(false)),
        },
    }
}

fn ids(members: &[Queued<Caller>]) -> Vec<u32> {
    members.iter().map(|q| q.payload.id).collect()
}

fn batches(step: &Step<Caller>) -> Vec<Vec<u32>> {
    step.run.iter().map(|b| ids(&b.members)).collect()
}

#[test]
fn a_lone_request_runs_at_once_on_an_idle_server() {
    let mut s = scheduler(2, 5, &[]);
    s.push(request(1, 1, 2, FAR), ms(0));
    let step = s.step(ms(0));
    assert_eq!(batches(&step), vec![vec![1]]);
    assert_eq!(step.run[0].slot, 0);
    assert_eq!(step.run[0].rows, 1);
    assert_eq!(s.running(), (1, 1));
    assert_eq!(s.queued(), 0);
}

#[test]
fn requests_wait_at_most_the_queue_delay_for_a_preferred_size_while_a_batch_runs() {
    let mut s = scheduler(2, 5, &[4]);
    s.push(request(1, 1, 2, FAR), ms(0));
    let first = s.step(ms(0));
    assert_eq!(batches(&first), vec![vec![1]]);
    s.push(request(2, 1, 2, FAR), ms(1));
    let waiting = s.step(ms(1));
    assert!(waiting.run.is_empty(), "another batch runs and 4 is ahead");
    assert_eq!(
        waiting.wake_at,
        Some(ms(6)),
        "the delay counts from queueing"
    );
    s.push(request(3, 1, 2, FAR), ms(2));
    assert!(s.step(ms(2)).run.is_empty());
    let flushed = s.step(ms(6));
    assert_eq!(batches(&flushed), vec![vec![2, 3]]);
    assert_eq!(flushed.run[0].slot, 1);
}

#[test]
fn reaching_the_preferred_size_flushes_before_the_delay() {
    let mut s = scheduler(2, 50, &[2]);
    s.push(request(1, 1, 2, FAR), ms(0));
    s.step(ms(0));
    s.push(request(2, 1, 2, FAR), ms(1));
    assert!(s.step(ms(1)).run.is_empty());
    s.push(request(3, 1, 2, FAR), ms(2));
    assert_eq!(batches(&s.step(ms(2))), vec![vec![2, 3]]);
}

#[test]
fn more_urgent_levels_go_first_and_arrival_orders_a_level() {
    let mut s = scheduler(1, 0, &[]);
    s.push(request(9, 8, 2, FAR), ms(0));
    s.step(ms(0)); // the one slot is busy now
    s.push(request(1, 4, 3, FAR), ms(1));
    s.push(request(2, 4, 2, FAR), ms(2));
    s.push(request(3, 4, 1, FAR), ms(3));
    s.push(request(4, 4, 2, FAR), ms(4));
    assert!(s.step(ms(4)).run.is_empty(), "no free slot");
    s.finished(0, Some(ms(1)), ms(5));
    assert_eq!(batches(&s.step(ms(5))), vec![vec![3, 2]]);
    s.finished(1, Some(ms(1)), ms(6));
    assert_eq!(batches(&s.step(ms(6))), vec![vec![4, 1]]);
}

#[test]
fn an_expired_request_is_reported_and_never_run() {
    let mut s = scheduler(1, 0, &[]);
    s.push(request(9, 1, 2, FAR), ms(0));
    s.step(ms(0));
    s.push(request(1, 1, 2, ms(10)), ms(1));
    s.push(request(2, 1, 2, FAR), ms(1));
    let busy = s.step(ms(1));
    assert_eq!(busy.wake_at, Some(ms(10)), "woken for the deadline");
    s.finished(0, Some(ms(1)), ms(10));
    let step = s.step(ms(10));
    assert_eq!(ids(&step.expired), vec![1]);
    assert_eq!(batches(&step), vec![vec![2]]);
    assert_eq!(s.queued(), 0);
}

#[test]
fn an_expired_request_is_reported_while_every_slot_is_busy() {
    let mut s = scheduler(1, 0, &[]);
    s.push(request(9, 1, 2, FAR), ms(0));
    s.step(ms(0));
    s.push(request(1, 1, 2, ms(10)), ms(1));
    let step = s.step(ms(10));
    assert_eq!(ids(&step.expired), vec![1]);
    assert!(step.run.is_empty());
}

#[test]
fn a_gone_request_is_dropped_before_running() {
    let mut s = scheduler(1, 0, &[]);
    let gone = request(1, 1, 2, FAR);
    gone.payload.gone.set(true);
    s.push(gone, ms(0));
    s.push(request(2, 1, 2, FAR), ms(0));
    let step = s.step(ms(0));
    assert_eq!(ids(&step.gone), vec![1]);
    assert_eq!(batches(&step), vec![vec![2]]);
}

#[test]
fn a_batch_past_its_bound_is_reported_stuck_once_until_it_returns() {
    let mut s = scheduler(1, 0, &[]);
    s.push(request(1, 1, 2, ms(100)), ms(0));
    s.push(request(2, 1, 2, ms(200)), ms(0));
    let started = s.step(ms(0));
    let id = started.run[0].id;
    assert_eq!(
        started.wake_at,
        Some(ms(200)),
        "the latest deadline bounds it"
    );
    assert!(s.step(ms(150)).stuck.is_empty());
    assert_eq!(s.step(ms(200)).stuck, vec![id]);
    let again = s.step(ms(300));
    assert!(again.stuck.is_empty(), "reported once");
    assert_eq!(again.wake_at, None);
    assert_eq!(s.stuck_batches(), 1);
    assert_eq!(s.stuck_for(ms(1200)), Some(ms(1000)));
    assert!(s.idle(), "a stuck batch's requests are answered");
    s.push(request(3, 1, 2, FAR), ms(300));
    assert!(
        s.step(ms(300)).run.is_empty(),
        "the stuck batch holds its slot"
    );
    s.finished(id, None, ms(400));
    assert_eq!(s.stuck_for(ms(400)), None);
    assert_eq!(batches(&s.step(ms(400))), vec![vec![3]]);
}

#[test]
fn drain_flushes_everything_without_waiting() {
    let mut s = scheduler(2, 50, &[8]);
    s.push(request(1, 1, 2, FAR), ms(0));
    s.step(ms(0));
    s.push(request(2, 1, 2, FAR), ms(1));
    assert!(s.step(ms(1)).run.is_empty());
    s.drain();
    assert_eq!(batches(&s.step(ms(1))), vec![vec![2]]);
}

#[test]
fn free_slots_take_full_batches_and_the_remainder_at_once_without_a_delay() {
    let mut s = scheduler(2, 0, &[]);
    for id in 1..=10 {
        s.push(request(id, 1, 2, FAR), ms(0));
    }
    let step = s.step(ms(0));
    assert_eq!(batches(&step), vec![(1..=8).collect(), vec![9, 10]]);
    assert_eq!(
        step.run.iter().map(|b| b.slot).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(s.running(), (2, 10));
    s.finished(step.run[0].id, Some(ms(2)), ms(3));
    s.finished(step.run[1].id, Some(ms(2)), ms(3));
    assert!(s.idle());
}

#[test]
fn shed_for_takes_the_newest_of_the_least_urgent_level() {
    let mut s = scheduler(1, 0, &[]);
    s.push(request(1, 1, 3, FAR), ms(0));
    s.push(request(2, 1, 3, FAR), ms(1));
    s.push(request(3, 1, 2, FAR), ms(2));
    s.push(request(4, 1, 1, FAR), ms(3));
    assert_eq!(s.sheddable(), 3);
    assert_eq!(
        s.shed_for(3).map(|q| q.payload.id),
        None,
        "none less urgent than 3"
    );
    assert_eq!(s.shed_for(1).map(|q| q.payload.id), Some(2));
    assert_eq!(s.shed_for(1).map(|q| q.payload.id), Some(1));
    assert_eq!(s.shed_for(2).map(|q| q.payload.id), None);
    assert_eq!(s.shed_for(1).map(|q| q.payload.id), Some(3));
    assert_eq!(
        s.shed_for(1).map(|q| q.payload.id),
        None,
        "level 1 is never shed"
    );
    assert_eq!(ids(&s.take_queued()), vec![4]);
}

#[test]
fn requests_of_another_shape_never_share_a_batch() {
    let mut s = scheduler(2, 0, &[]);
    let shaped = |id, extent| Queued {
        shape: Some(vec![vec![extent]]),
        ..request(id, 1, 2, FAR)
    };
    s.push(shaped(1, 16), ms(0));
    s.push(shaped(2, 32), ms(0));
    s.push(shaped(3, 16), ms(0));
    let step = s.step(ms(0));
    assert_eq!(batches(&step), vec![vec![1, 3], vec![2]]);
    assert_eq!(step.run[0].shape, Some(vec![vec![16]]));
    assert_eq!(step.run[1].shape, Some(vec![vec![32]]));
}

fn adaptive_config(slo_ms: f64) -> BatchingConfig {
    BatchingConfig {
        policy: PolicyKind::Adaptive,
        slo_p99_latency_milliseconds: Some(slo_ms),
        max_batch_size: 16,
        ..config(1, 7, &[4])
    }
}

#[test]
fn adaptive_without_an_slo_is_refused() {
    let config = BatchingConfig {
        slo_p99_latency_milliseconds: None,
        ..adaptive_config(1.0)
    };
    let refused = Scheduler::<Caller>::new(config).err().unwrap();
    assert!(refused.contains("sloP99LatencyMilliseconds"), "{refused}");
}

#[test]
fn adaptive_keeps_the_configured_setting_until_a_batch_is_measured() {
    let mut s = Scheduler::new(adaptive_config(100.0)).unwrap();
    s.push(request(1, 1, 2, FAR), ms(0));
    s.step(ms(0));
    assert_eq!(s.setting().reason, SettingReason::Unmeasured);
    assert_eq!(s.setting().queue_delay_microseconds, 7000);
    assert_eq!(s.setting().preferred_batch_size, 4);
    let status = s.status(ms(0));
    assert_eq!(status["policy"], "Adaptive");
    assert_eq!(status["reason"], "Unmeasured");
    assert_eq!(status["computeAlone"], serde_json::json!([]));
}

#[test]
fn adaptive_moves_its_setting_with_the_measured_compute_times() {
    // A steady 1000 rows/s; batches cost 1 ms + 0.1 ms a row.
    let mut s = Scheduler::new(adaptive_config(100.0)).unwrap();
    let mut now = ms(0);
    for id in 0..200u32 {
        s.push(request(id, 1, 2, FAR), now);
        for batch in s.step(now).run {
            let compute = Duration::from_micros(1000 + 100 * batch.rows as u64);
            s.finished(batch.id, Some(compute), now);
        }
        now += ms(1);
    }
    let within = s.setting().clone();
    assert_eq!(within.reason, SettingReason::WithinSlo);
    assert!(within.predicted_p99_seconds.unwrap() <= 0.08);
    let status = s.status(now);
    assert_eq!(status["reason"], "WithinSlo");
    assert_eq!(status["targetP99Milliseconds"], 80.0);
    assert!(!status["computeAlone"].as_array().unwrap().is_empty());
    // The same engine turned slow: a batch now takes 200 ms, over any SLO of 100 ms.
    for id in 200..400u32 {
        s.push(request(id, 1, 2, FAR), now);
        for batch in s.step(now).run {
            let compute = Duration::from_millis(200 + batch.rows as u64);
            s.finished(batch.id, Some(compute), now);
        }
        now += ms(1);
    }
    let slow = s.setting();
    assert_eq!(slow.reason, SettingReason::SloUnreachable, "{slow:?}");
    assert_eq!(slow.queue_delay_microseconds, 0);
}

#[test]
fn static_status_reports_the_configured_values_only() {
    let s = scheduler(1, 5, &[2, 4]);
    let status = s.status(ms(0));
    assert_eq!(
        status,
        serde_json::json!({
            "policy": "Static",
            "sloP99LatencyMilliseconds": null,
            "maxBatchSize": 8,
            "queueDelayMicroseconds": 5000,
            "preferredBatchSize": 4,
        })
    );
}

#[test]
fn the_adaptive_setting_is_what_the_flush_rules_read() {
    // Configured: wait up to 7 ms for 4 rows. Measured: 1 ms a batch, a trickle of
    // requests: one row at a time serves it, with no delay, so a request beside a running
    // batch goes at once where the configured rules would have it wait.
    let mut s = Scheduler::new(BatchingConfig {
        execution_slots: 2,
        ..adaptive_config(100.0)
    })
    .unwrap();
    s.push(request(0, 1, 2, FAR), ms(0));
    let first = s.step(ms(0)).run.remove(0);
    s.finished(first.id, Some(ms(1)), ms(1));
    s.push(request(1, 1, 2, FAR), ms(30));
    assert_eq!(batches(&s.step(ms(30))), vec![vec![1]]);
    assert_eq!(s.setting().reason, SettingReason::WithinSlo);
    assert_eq!(s.setting().preferred_batch_size, 1);
    assert_eq!(s.setting().queue_delay_microseconds, 0);
    s.push(request(2, 1, 2, FAR), ms(31));
    assert_eq!(batches(&s.step(ms(31))), vec![vec![2]]);
}

#[test]
fn the_configured_rules_hold_until_adaptive_has_measured() {
    let mut s = Scheduler::new(BatchingConfig {
        execution_slots: 2,
        ..adaptive_config(100.0)
    })
    .unwrap();
    s.push(request(0, 1, 2, FAR), ms(0));
    s.step(ms(0));
    s.push(request(1, 1, 2, FAR), ms(30));
    let waiting = s.step(ms(30));
    assert!(
        waiting.run.is_empty(),
        "4 rows are preferred, for up to 7 ms"
    );
    assert_eq!(waiting.wake_at, Some(ms(37)));
}

#[test]
fn a_stuck_batch_does_not_count_against_adaptives_one_batch_at_a_time() {
    let mut s = Scheduler::new(BatchingConfig {
        execution_slots: 2,
        ..adaptive_config(100.0)
    })
    .unwrap();
    // One row takes 1 ms alone and 2 ms beside another: two slots are worth one.
    s.push(request(0, 1, 2, FAR), ms(0));
    let alone = s.step(ms(0)).run.remove(0);
    s.finished(alone.id, Some(ms(1)), ms(1));
    s.push(request(1, 1, 2, FAR), ms(1));
    let first = s.step(ms(1)).run.remove(0);
    s.push(request(2, 1, 2, FAR), ms(1));
    let beside = s.step(ms(8)).run.remove(0);
    s.finished(first.id, Some(ms(2)), ms(10));
    s.finished(beside.id, Some(ms(2)), ms(10));
    // The first of the two ran beside the second for part of its time: measured so.
    let status = s.status(ms(10));
    assert_eq!(status["computeAlone"][0]["meanMilliseconds"], 1.0);
    assert_eq!(status["computeBesideAnother"][0]["meanMilliseconds"], 2.0);
    s.push(request(3, 1, 2, ms(50)), ms(30));
    assert_eq!(batches(&s.step(ms(30))), vec![vec![3]]);
    assert_eq!(s.setting().concurrent_batches, Some(1), "{:?}", s.setting());
    s.push(request(4, 1, 2, FAR), ms(40));
    assert!(s.step(ms(40)).run.is_empty(), "one batch at a time");
    let stuck = s.step(ms(50));
    assert_eq!(stuck.stuck.len(), 1);
    assert_eq!(
        batches(&stuck),
        vec![vec![4]],
        "the stuck batch is not working"
    );
    assert_eq!(stuck.run[0].slot, 1);
}

#[test]
fn a_freed_slot_takes_the_queued_batch_before_the_finished_batchs_answers() {
    // The Python scheduler started what a freed slot could take before it answered the
    // batch that freed it: answering first would leave the engine idle while the answers
    // went out. Here `finished` frees the slot and the very next step, at the same instant
    // with no other event, starts the queued batch on it: nothing waits for the finished
    // batch's answers (the core never holds them; the driver sends them).
    let mut s = scheduler(1, 50, &[8]);
    s.push(request(1, 2, 2, FAR), ms(0));
    let first = s.step(ms(0)).run.remove(0);
    s.push(request(2, 1, 2, FAR), ms(1));
    s.push(request(3, 1, 2, FAR), ms(2));
    assert!(s.step(ms(2)).run.is_empty(), "the one slot is busy");
    s.finished(first.id, Some(ms(3)), ms(3));
    let next = s.step(ms(3));
    assert_eq!(batches(&next), vec![vec![2, 3]]);
    assert_eq!(next.run[0].slot, first.slot);
    assert_eq!(s.running(), (1, 2), "only the new batch holds a slot");
}

mod replay;
