//! The queue and the slots: events in (a request queued, a batch finished, time passed),
//! commands out (run these requests as one batch on that slot; answer those; wake me at).
//!
//! The server holds one `Scheduler` behind a lock and calls [`Scheduler::step`] after every
//! event and when the time it named comes; `step` takes the queue as it stands (requests
//! whose caller went away taken out first, to be counted as cancelled), answers those whose
//! deadline passed (never run), and starts batches on free slots as the policy says
//! ([`super::policy`], with the setting [`super::adaptive`] chose under Adaptive), each slot
//! running one batch at a time. A running batch is bounded by the latest deadline of its
//! requests: past it, `step` reports it stuck (its requests are answered EngineTimeout by
//! the driver) and the engine counts as stuck until it returns; readiness is off while a
//! batch is stuck, and liveness once one has been stuck for the liveness bound.

use std::collections::BTreeMap;
use std::time::Duration;

use super::adaptive::{
    BatchSetting, DECISION_INTERVAL, LatencyTarget, MeasuredLoad, next_setting, status_of,
};
use super::config::{BatchingConfig, PolicyKind};
use super::policy::{Action, Pending, Rules, next_decision};
use super::{BatchShape, Time};

/// An execution slot, numbered from 0 to `executionSlots - 1`.
pub type SlotId = usize;
/// A started batch, numbered from 0 in the order started.
pub type BatchId = u64;

/// What the scheduler asks of a queued request's payload.
pub trait Waiter {
    /// Its caller has gone (an HTTP client that disconnected, a cancelled gRPC call).
    fn gone(&self) -> bool;
}

/// A request in the queue: what the decisions read, and the payload the driver carries.
#[derive(Debug)]
pub struct Queued<P> {
    /// Its rows along the batch axis.
    pub rows: usize,
    /// When it was admitted: its deadline and the expired message count from here.
    pub arrived_at: Time,
    /// Set by `push`.
    pub queued_at: Time,
    /// Past it, a queued request is expired (never run), and a running batch is bounded
    /// by the latest of its requests'.
    pub deadline: Time,
    /// Its priority level: 1 is the most urgent.
    pub level: u32,
    /// The batch shape it joins; None for a model without variable axes.
    pub shape: Option<BatchShape>,
    /// What the driver answers it with.
    pub payload: P,
}

/// Run `members` as one batch of `rows` rows (at `shape`) on `slot`, now.
#[derive(Debug)]
pub struct RunBatch<P> {
    /// What `finished` is told when it returns.
    pub id: BatchId,
    /// The slot it runs on (free until `finished`).
    pub slot: SlotId,
    /// Rows of all its members.
    pub rows: usize,
    /// The members' batch shape (they share it); None without variable axes.
    pub shape: Option<BatchShape>,
    /// In queue order, which is the order of their rows in the batch.
    pub members: Vec<Queued<P>>,
}

/// What one step decided.
#[derive(Debug)]
pub struct Step<P> {
    /// Batches to start now.
    pub run: Vec<RunBatch<P>>,
    /// Requests whose deadline passed in the queue: never run; answer each with
    /// `admission`'s expired message.
    pub expired: Vec<Queued<P>>,
    /// Requests whose caller went away: dropped before they ran, counted as cancelled.
    pub gone: Vec<Queued<P>>,
    /// Running batches that passed their bound at this step: their requests get
    /// EngineTimeout now; the batch stays running until `finished`.
    pub stuck: Vec<BatchId>,
    /// Step again by then at the latest (None: at the next event).
    pub wake_at: Option<Time>,
}

/// A batch on a slot, until `finished`.
#[derive(Clone, Debug)]
struct Running {
    slot: SlotId,
    rows: usize,
    requests: usize,
    /// The watchdog's bound: the latest deadline of its requests (`watchdog.batch_bound`).
    bound: Time,
    stuck: bool,
    /// Another batch ran on another slot at some time while it ran (Adaptive measures
    /// such batches apart).
    beside: bool,
}

/// What Adaptive keeps besides the setting.
#[derive(Debug)]
struct Adaptive {
    load: MeasuredLoad,
    slo_p99_latency_milliseconds: f64,
    decide_at: Time,
}

/// The queue, the slots and the watchdog's state of one model (see the module).
pub struct Scheduler<P> {
    config: BatchingConfig,
    /// What `policy::next_decision` reads: the configured rules, with the adaptive
    /// setting's delay and preferred size under Adaptive.
    rules: Rules,
    setting: BatchSetting,
    adaptive: Option<Adaptive>,
    /// By level (1 first), then in the order queued.
    queue: Vec<Queued<P>>,
    running: BTreeMap<BatchId, Running>,
    next_batch: BatchId,
    draining: bool,
    stuck_since: Option<Time>,
}

impl<P: Waiter> Scheduler<P> {
    /// A scheduler with nothing queued or running. Changed from the first contract (which
    /// returned `Self`): an Adaptive policy without an SLO is refused as the Python
    /// scheduler refuses it, with its message, rather than a panic in the server.
    pub fn new(config: BatchingConfig) -> Result<Self, String> {
        let adaptive = match (config.policy, config.slo_p99_latency_milliseconds) {
            (PolicyKind::Static, _) => None,
            (PolicyKind::Adaptive, Some(slo)) => Some(Adaptive {
                load: MeasuredLoad::default(),
                slo_p99_latency_milliseconds: slo,
                decide_at: Time::ZERO,
            }),
            (PolicyKind::Adaptive, None) => {
                return Err(
                    "batching policy Adaptive needs an SLO (sloP99LatencyMilliseconds)".into(),
                );
            }
        };
        let setting = BatchSetting::of_config(&config);
        Ok(Scheduler {
            rules: setting.rules(&config),
            setting,
            adaptive,
            config,
            queue: Vec::new(),
            running: BTreeMap::new(),
            next_batch: 0,
            draining: false,
            stuck_since: None,
        })
    }

    /// Queues one request at `now` (admitted earlier: its level and deadline are set),
    /// behind every queued request of its level or a more urgent one.
    pub fn push(&mut self, mut item: Queued<P>, now: Time) {
        item.queued_at = now;
        if let Some(adaptive) = &mut self.adaptive {
            adaptive.load.arrivals.arrived(item.rows, now.as_secs_f64());
        }
        let at = self.queue.partition_point(|q| q.level <= item.level);
        self.queue.insert(at, item);
    }

    /// A batch `start`ed earlier returned (its slot is free again): `compute` is how long
    /// the engine took, None when it failed (not measured). An unknown batch is ignored.
    pub fn finished(&mut self, batch: BatchId, compute: Option<Duration>, now: Time) {
        let _ = now;
        let Some(done) = self.running.remove(&batch) else {
            return;
        };
        if done.stuck && self.stuck_batches() == 0 {
            self.stuck_since = None;
        }
        if let (Some(adaptive), Some(compute)) = (&mut self.adaptive, compute) {
            let seconds = compute.as_secs_f64();
            adaptive
                .load
                .engine
                .measure(done.rows, seconds, done.beside);
        }
    }

    /// From now on nothing waits for a better batch size: everything queued runs as slots
    /// free up.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    /// Decides at `now`: drops the gone, reports the batches past their bound as stuck,
    /// adapts the setting (Adaptive, at most every DECISION_INTERVAL), then answers the
    /// expired and starts batches on free slots until the policy says wait.
    pub fn step(&mut self, now: Time) -> Step<P> {
        let mut step = Step {
            run: Vec::new(),
            expired: Vec::new(),
            gone: self.take_where(|q| q.payload.gone()),
            stuck: self.mark_stuck(now),
            wake_at: None,
        };
        self.adapt(now);
        let wait = loop {
            let (free, busy) = self.free_and_busy();
            let decision = {
                let pending: Vec<Pending<'_>> = self.queue.iter().map(pending_of).collect();
                next_decision(&self.rules, &pending, free, busy, now, self.draining)
            };
            let expired = take_positions(&mut self.queue, &decision.expired);
            step.expired.extend(expired);
            match decision.action {
                Action::WaitUntil(at) => break at,
                Action::Flush(flush) => {
                    // Positions were read before the expired were taken out.
                    let members = shifted(&flush.members, &decision.expired);
                    let members = take_positions(&mut self.queue, &members);
                    step.run.push(self.start(members, flush.rows));
                }
            }
        };
        let bound = self.running.values().filter(|r| !r.stuck).map(|r| r.bound);
        step.wake_at = wait.into_iter().chain(bound).min();
        step
    }

    /// Takes out the newest queued request of the least urgent level less urgent than
    /// `level`, for a more urgent one to take its place; None when there is none.
    pub fn shed_for(&mut self, level: u32) -> Option<Queued<P>> {
        // The queue ends with the least urgent level's newest request.
        match self.queue.last() {
            Some(last) if last.level > level => self.queue.pop(),
            _ => None,
        }
    }

    /// Everything queued, taken out (the server is stopping: each gets an error).
    pub fn take_queued(&mut self) -> Vec<Queued<P>> {
        std::mem::take(&mut self.queue)
    }

    /// Requests queued.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Queued requests at a level above 1 (a more urgent one could shed them).
    pub fn sheddable(&self) -> usize {
        self.queue.iter().filter(|q| q.level > 1).count()
    }

    /// Batches running on slots, and the requests in them (stuck ones included: they
    /// hold their slots until they return).
    pub fn running(&self) -> (usize, usize) {
        let requests = self.running.values().map(|r| r.requests).sum();
        (self.running.len(), requests)
    }

    /// Running batches past their bound, not returned.
    pub fn stuck_batches(&self) -> usize {
        self.running.values().filter(|r| r.stuck).count()
    }

    /// How long the engine has been stuck (a batch past its bound, not returned).
    pub fn stuck_for(&self, now: Time) -> Option<Duration> {
        self.stuck_since.map(|since| now.saturating_sub(since))
    }

    /// Nothing queued or running (a stuck batch aside: its requests are answered).
    pub fn idle(&self) -> bool {
        self.queue.is_empty() && self.running.len() <= self.stuck_batches()
    }

    /// The queue delay and preferred batch size in force (Static: the configured ones).
    pub fn setting(&self) -> &BatchSetting {
        &self.setting
    }

    /// The `GET /v2/batching` body: the policy, the setting in force and, under Adaptive,
    /// what was measured (`adaptive.status_of`'s fields, camelCase). The Python route adds
    /// `modelBatches`, `modelBatchesReason`, `configuredMaxBatchSize` and
    /// `outputRowMismatches`, which the server knows and the scheduler does not.
    pub fn status(&self, now: Time) -> serde_json::Value {
        let load = self.adaptive.as_ref().map(|a| &a.load);
        status_of(&self.config, &self.setting, load, now.as_secs_f64())
    }

    /// The queued requests `gone` picks, taken out in order.
    fn take_where(&mut self, gone: impl Fn(&Queued<P>) -> bool) -> Vec<Queued<P>> {
        if !self.queue.iter().any(&gone) {
            return Vec::new();
        }
        let (out, kept) = std::mem::take(&mut self.queue).into_iter().partition(gone);
        self.queue = kept;
        out
    }

    /// Marks the running batches past their bound stuck (once each) and returns them.
    fn mark_stuck(&mut self, now: Time) -> Vec<BatchId> {
        let mut stuck = Vec::new();
        for (&id, batch) in self.running.iter_mut() {
            if !batch.stuck && batch.bound <= now {
                batch.stuck = true;
                stuck.push(id);
            }
        }
        if !stuck.is_empty() && self.stuck_since.is_none() {
            self.stuck_since = Some(now);
        }
        stuck
    }

    /// The slots the policy may fill and the slots busy. Under Adaptive's limit of batches
    /// at once, a stuck batch does not count against it (it holds its slot all the same).
    fn free_and_busy(&self) -> (usize, usize) {
        let busy = self.running.len();
        let mut free = self.config.execution_slots.saturating_sub(busy);
        if let Some(limit) = self.setting.concurrent_batches {
            let working = busy - self.stuck_batches();
            free = free.min(limit.saturating_sub(working));
        }
        (free, busy)
    }

    /// Asks the adaptive policy for the setting to run with, at most every
    /// DECISION_INTERVAL (Static: nothing to do).
    fn adapt(&mut self, now: Time) {
        let Some(adaptive) = &mut self.adaptive else {
            return;
        };
        if now < adaptive.decide_at {
            return;
        }
        let config = &self.config;
        let target = LatencyTarget::of_slo(
            adaptive.slo_p99_latency_milliseconds,
            f64::from(config.slo_margin_percent),
            config.max_batch_size,
            config.execution_slots,
        );
        let setting = next_setting(
            &target,
            &adaptive.load.engine,
            adaptive.load.arrivals.rows_per_second(now.as_secs_f64()),
            self.queue.iter().map(|q| q.rows).sum(),
            &BatchSetting::of_config(config),
            Some(&self.setting),
        );
        adaptive.decide_at = now + DECISION_INTERVAL;
        self.rules = setting.rules(config);
        self.setting = setting;
    }

    /// Starts `members` as one batch on the lowest free slot.
    fn start(&mut self, members: Vec<Queued<P>>, rows: usize) -> RunBatch<P> {
        let slot = (0..)
            .find(|s| !self.running.values().any(|r| r.slot == *s))
            .unwrap_or(0);
        let id = self.next_batch;
        self.next_batch += 1;
        let beside = !self.running.is_empty();
        for other in self.running.values_mut() {
            other.beside = true;
        }
        let bound = members.iter().map(|q| q.deadline).max().unwrap_or_default();
        self.running.insert(
            id,
            Running {
                slot,
                rows,
                requests: members.len(),
                bound,
                stuck: false,
                beside,
            },
        );
        RunBatch {
            id,
            slot,
            rows,
            shape: members.first().and_then(|q| q.shape.clone()),
            members,
        }
    }
}

fn pending_of<P>(queued: &Queued<P>) -> Pending<'_> {
    Pending {
        rows: queued.rows,
        queued_at: queued.queued_at,
        deadline: queued.deadline,
        shape: queued.shape.as_ref(),
    }
}

/// Takes the requests at `positions` (ascending) out of `queue`, in order.
fn take_positions<P>(queue: &mut Vec<Queued<P>>, positions: &[usize]) -> Vec<Queued<P>> {
    if positions.is_empty() {
        return Vec::new();
    }
    let mut taken = Vec::with_capacity(positions.len());
    let mut kept = Vec::with_capacity(queue.len() - positions.len());
    let mut next = positions.iter().peekable();
    for (index, item) in std::mem::take(queue).into_iter().enumerate() {
        if next.peek() == Some(&&index) {
            next.next();
            taken.push(item);
        } else {
            kept.push(item);
        }
    }
    *queue = kept;
    taken
}

/// `positions` in a queue from which those at `removed` (ascending, disjoint from them)
/// were taken out.
fn shifted(positions: &[usize], removed: &[usize]) -> Vec<usize> {
    positions
        .iter()
        .map(|&p| p - removed.partition_point(|&r| r < p))
        .collect()
}

#[cfg(test)]
mod tests;
