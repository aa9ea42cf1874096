//! SLO-driven adaptive batching: the queue delay, preferred batch size and batches at once
//! to run with next, from what the scheduler measured (a port of
//! `runtime/batching/adaptive.py`; its module docstring states the model in full).
//!
//! The scheduler keeps a [`MeasuredLoad`]: the compute time per power-of-two batch-size
//! bucket ([`ComputeProfile`], a smoothed mean and mean deviation, as TCP estimates its
//! round-trip time, RFC 6298), kept apart for batches that ran alone and batches that ran
//! beside another ([`EngineProfile`]), and the arrival rate of rows ([`ArrivalRate`]).
//! [`next_setting`] turns that, the rows queued and the [`LatencyTarget`] into a
//! [`BatchSetting`], whose delay and preferred size the Static flush rules then read.
//!
//! Per candidate size `b` (powers of two below maxBatchSize, and maxBatchSize):
//! `predicted p99 = delay + compute(b) + compute_p99(b) + backlog(b)`. A size is feasible
//! when the budget left for waiting is not negative and its missing rows are expected
//! within it; of those the smallest that serves the load with room to spare, else the most
//! efficient. No size feasible: Behind (a backlog: the most efficient size) or
//! SloUnreachable (the lowest latency, no delay). Below OVERLAP_WORTH slots' worth of
//! measured throughput, batches are serialized (one at a time). Times are seconds (f64),
//! as in the Python, so the arithmetic and the reported values agree with it.

use super::config::BatchingConfig;
use super::policy::Rules;
use std::time::Duration;

/// Weight of a new batch's compute time in its bucket's mean (RFC 6298's alpha).
pub const MEAN_GAIN: f64 = 1.0 / 8.0;
/// Weight of a new batch's distance from the mean in the bucket's deviation (beta).
pub const DEVIATION_GAIN: f64 = 1.0 / 4.0;
/// Compute time's tail estimate: the mean plus this many mean deviations (RFC 6298's K).
pub const TAIL_DEVIATIONS: f64 = 4.0;
/// Time constant of the arrival rate: a change of rate shows within about this long.
pub const ARRIVAL_WINDOW_SECONDS: f64 = 0.5;
/// The delay allows this many times the expected fill time, so that a batch under an
/// irregular arrival process still usually fills.
pub const FILL_SLACK: f64 = 2.0;
/// A size serves the arrival rate when its slots would be busy at most this share of the
/// time: beyond it queues build in bursts, which the model no longer covers.
pub const UTILISATION_LIMIT: f64 = 0.5;
/// How often the scheduler asks for a new setting (at a step).
pub const DECISION_INTERVAL: Duration = Duration::from_millis(20);
/// Batches overlap only where that gives at least this many slots' worth of throughput.
pub const OVERLAP_WORTH: f64 = 1.25;
/// Hysteresis around OVERLAP_WORTH, so that a wavering measurement does not switch the
/// scheduler between overlapping and serialized batches back and forth.
pub const OVERLAP_HYSTERESIS: f64 = 0.1;
/// The largest delay chosen (maxQueueDelayMicroseconds' own bound).
pub const MAX_QUEUE_DELAY_MICROSECONDS: u64 = 1_000_000;

/// The power-of-two bucket of a batch: 1 -> 0, 2 -> 1, 3..4 -> 2, 5..8 -> 3, ...
pub fn bucket_of(rows: usize) -> u32 {
    usize::BITS - (rows.saturating_sub(1)).leading_zeros()
}

/// What the batches of one bucket took: smoothed rows, compute seconds and deviation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ComputeEstimate {
    /// Smoothed rows of its batches.
    pub rows: f64,
    /// Smoothed compute seconds.
    pub seconds: f64,
    /// Smoothed mean deviation of the compute seconds.
    pub deviation_seconds: f64,
}

impl ComputeEstimate {
    /// The tail (p99) estimate: the mean plus TAIL_DEVIATIONS deviations.
    pub fn tail_seconds(&self) -> f64 {
        self.seconds + TAIL_DEVIATIONS * self.deviation_seconds
    }

    /// With one more batch of `rows` that took `seconds` counted.
    pub fn measured(&self, rows: usize, seconds: f64) -> ComputeEstimate {
        let deviation = (seconds - self.seconds).abs();
        ComputeEstimate {
            rows: self.rows + MEAN_GAIN * (rows as f64 - self.rows),
            seconds: self.seconds + MEAN_GAIN * (seconds - self.seconds),
            deviation_seconds: self.deviation_seconds
                + DEVIATION_GAIN * (deviation - self.deviation_seconds),
        }
    }
}

/// The predicted compute time of one batch size: its mean and its tail (p99).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ComputePrediction {
    /// The mean.
    pub seconds: f64,
    /// The tail (p99).
    pub tail_seconds: f64,
}

/// The compute time per batch-size bucket, as measured by the scheduler's own batches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ComputeProfile {
    /// (bucket, estimate), those measured, sorted by bucket (hence by rows).
    pub buckets: Vec<(u32, ComputeEstimate)>,
}

impl ComputeProfile {
    /// Counts one more batch (a failed batch, with no time, is not counted).
    pub fn measure(&mut self, rows: usize, seconds: f64) {
        if rows < 1 || seconds <= 0.0 {
            return;
        }
        let bucket = bucket_of(rows);
        match self.buckets.binary_search_by_key(&bucket, |&(b, _)| b) {
            Ok(at) => self.buckets[at].1 = self.buckets[at].1.measured(rows, seconds),
            // The first batch of a bucket: the deviation starts at half the time (RFC
            // 6298), so one lucky batch does not make a size look dependable.
            Err(at) => self.buckets.insert(
                at,
                (
                    bucket,
                    ComputeEstimate {
                        rows: rows as f64,
                        seconds,
                        deviation_seconds: seconds / 2.0,
                    },
                ),
            ),
        }
    }

    /// The compute time of a batch of `rows`; None before any batch was measured. Between
    /// measured buckets, linear; below the smallest, its time; above the largest,
    /// proportional to rows (no gain from batching that was not measured).
    pub fn predict(&self, rows: usize) -> Option<ComputePrediction> {
        let (first, last) = (self.buckets.first()?.1, self.buckets.last()?.1);
        let rows = rows as f64;
        if rows <= first.rows {
            return Some(prediction(first.seconds, first.tail_seconds()));
        }
        if rows >= last.rows {
            let scale = rows / last.rows;
            return Some(prediction(
                last.seconds * scale,
                last.tail_seconds() * scale,
            ));
        }
        self.buckets.windows(2).find_map(|pair| {
            let (low, high) = (pair[0].1, pair[1].1);
            (rows <= high.rows).then(|| {
                let share = (rows - low.rows) / (high.rows - low.rows);
                prediction(
                    low.seconds + share * (high.seconds - low.seconds),
                    low.tail_seconds() + share * (high.tail_seconds() - low.tail_seconds()),
                )
            })
        })
    }
}

fn prediction(seconds: f64, tail_seconds: f64) -> ComputePrediction {
    ComputePrediction {
        seconds,
        tail_seconds,
    }
}

/// Rows arriving per second: an exponentially decayed count of the rows queued, with time
/// constant ARRIVAL_WINDOW_SECONDS.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ArrivalRate {
    decayed_rows: f64,
    /// Seconds on the scheduler's clock of the last arrival.
    at: Option<f64>,
}

impl ArrivalRate {
    /// Counts `rows` arriving at `now` (seconds).
    pub fn arrived(&mut self, rows: usize, now: f64) {
        self.decayed_rows = self.decayed(now) + rows as f64;
        self.at = Some(now);
    }

    /// The rows per second arriving, decayed to `now` (seconds).
    pub fn rows_per_second(&self, now: f64) -> f64 {
        self.decayed(now) / ARRIVAL_WINDOW_SECONDS
    }

    fn decayed(&self, now: f64) -> f64 {
        match self.at {
            None => 0.0,
            Some(at) => self.decayed_rows * (-(now - at).max(0.0) / ARRIVAL_WINDOW_SECONDS).exp(),
        }
    }
}

/// The compute times of batches that ran alone on the engine, and of batches that ran
/// beside another (on another slot) for some of their time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineProfile {
    /// Batches that ran with no other on the engine.
    pub alone: ComputeProfile,
    /// Batches that ran beside another for some of their time.
    pub beside: ComputeProfile,
}

impl EngineProfile {
    /// Counts one batch that ran (`beside`: another batch ran on another slot at some time).
    pub fn measure(&mut self, rows: usize, seconds: f64, beside: bool) {
        if beside {
            self.beside.measure(rows, seconds);
        } else {
            self.alone.measure(rows, seconds);
        }
    }

    /// What `slots` slots running at once are worth, in slots of a batch alone: `slots`
    /// times the median, over the buckets measured both ways, of a batch's time alone over
    /// its time beside another (between 1 and `slots`; `slots` until measured).
    pub fn parallel_slots(&self, slots: usize) -> f64 {
        if slots <= 1 {
            return 1.0;
        }
        let mut ratios: Vec<f64> = self
            .alone
            .buckets
            .iter()
            .filter_map(|(bucket, alone)| {
                let beside = self.beside.buckets.iter().find(|(b, _)| b == bucket)?;
                Some(alone.seconds / beside.1.seconds)
            })
            .collect();
        if ratios.is_empty() {
            return slots as f64;
        }
        ratios.sort_by(f64::total_cmp);
        let middle = ratios.len() / 2;
        let median = if ratios.len() % 2 == 1 {
            ratios[middle]
        } else {
            (ratios[middle - 1] + ratios[middle]) / 2.0
        };
        (slots as f64 * median).max(1.0).min(slots as f64)
    }
}

/// Everything the scheduler measures for the adaptive policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MeasuredLoad {
    /// Compute times.
    pub engine: EngineProfile,
    /// Rows arriving.
    pub arrivals: ArrivalRate,
}

/// Why the adaptive policy chose its setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingReason {
    /// No batch measured yet: the configured static values apply.
    Unmeasured,
    /// A size whose predicted p99 is within the target.
    WithinSlo,
    /// The queue holds more than any size clears within the target: the most efficient.
    Behind,
    /// Even the fastest batch is predicted over the target: the lowest latency there is.
    SloUnreachable,
}

impl SettingReason {
    /// The name `/v2/batching` reports.
    pub fn name(self) -> &'static str {
        match self {
            SettingReason::Unmeasured => "Unmeasured",
            SettingReason::WithinSlo => "WithinSlo",
            SettingReason::Behind => "Behind",
            SettingReason::SloUnreachable => "SloUnreachable",
        }
    }
}

/// The values the adaptive policy sets, and what it predicted for them.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchSetting {
    /// How long a request may wait for the preferred size.
    pub queue_delay_microseconds: u64,
    /// The size that flushes at once.
    pub preferred_batch_size: usize,
    /// Why this setting.
    pub reason: SettingReason,
    /// Its predicted p99, the delay included (None: unmeasured).
    pub predicted_p99_seconds: Option<f64>,
    /// What the slots running at once were measured to be worth.
    pub parallel_slots: Option<f64>,
    /// Most batches at once: None for every slot.
    pub concurrent_batches: Option<usize>,
}

impl BatchSetting {
    /// The static policy's own values: its delay, and the size it waits for (its largest
    /// preferred size, or maxBatchSize).
    pub fn of_config(config: &BatchingConfig) -> BatchSetting {
        BatchSetting {
            queue_delay_microseconds: config.max_queue_delay_microseconds,
            preferred_batch_size: config
                .preferred_batch_sizes
                .last()
                .copied()
                .unwrap_or(config.max_batch_size),
            reason: SettingReason::Unmeasured,
            predicted_p99_seconds: None,
            parallel_slots: None,
            concurrent_batches: None,
        }
    }

    /// The flush rules with this delay and preferred size; the configured ones while
    /// unmeasured.
    pub fn rules(&self, config: &BatchingConfig) -> Rules {
        let measured = self.reason != SettingReason::Unmeasured;
        Rules {
            max_batch_size: config.max_batch_size,
            max_queue_delay: Duration::from_micros(if measured {
                self.queue_delay_microseconds
            } else {
                config.max_queue_delay_microseconds
            }),
            preferred_batch_sizes: if measured {
                vec![self.preferred_batch_size]
            } else {
                config.preferred_batch_sizes.clone()
            },
        }
    }
}

/// What the adaptive policy holds: the p99 under `seconds` (the SLO less its margin), with
/// batches of at most `max_batch_size` rows on `execution_slots` slots.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyTarget {
    /// Seconds: the SLO less its margin.
    pub seconds: f64,
    /// Rows a batch holds at most.
    pub max_batch_size: usize,
    /// Slots batches run on.
    pub execution_slots: usize,
}

impl LatencyTarget {
    /// The target of an SLO in milliseconds less `margin_percent`.
    pub fn of_slo(
        slo_p99_latency_milliseconds: f64,
        margin_percent: f64,
        max_batch_size: usize,
        execution_slots: usize,
    ) -> LatencyTarget {
        LatencyTarget {
            seconds: slo_p99_latency_milliseconds / 1000.0 * (1.0 - margin_percent / 100.0),
            max_batch_size,
            execution_slots,
        }
    }
}

/// Powers of two below maxBatchSize, and maxBatchSize.
pub fn candidate_sizes(max_batch_size: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = (0..usize::BITS)
        .map(|k| 1usize << k)
        .take_while(|&size| size < max_batch_size)
        .collect();
    sizes.push(max_batch_size);
    sizes
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    size: usize,
    rows_per_second: f64,
    /// The batch ahead at its mean, then its own at its tail.
    compute_seconds: f64,
    backlog_seconds: f64,
    fill_seconds: f64,
}

impl Candidate {
    /// What the target leaves for waiting (negative: over it already).
    fn budget_seconds(&self, target: &LatencyTarget, backlog: bool) -> f64 {
        let backlog = if backlog { self.backlog_seconds } else { 0.0 };
        target.seconds - self.compute_seconds - backlog
    }

    fn predicted_seconds(&self) -> f64 {
        self.compute_seconds + self.backlog_seconds
    }
}

fn microseconds(seconds: f64) -> u64 {
    // As Python's int(): truncated, then clamped.
    ((seconds * 1e6).trunc().max(0.0) as u64).min(MAX_QUEUE_DELAY_MICROSECONDS)
}

fn candidates(
    target: &LatencyTarget,
    compute: &ComputeProfile,
    slots: f64,
    rate: f64,
    queued_rows: usize,
) -> Option<Vec<Candidate>> {
    let mut found = Vec::new();
    for size in candidate_sizes(target.max_batch_size) {
        let prediction = compute.predict(size)?;
        let to_come = size.saturating_sub(queued_rows.max(1)) as f64;
        let fill_seconds = if rate > 0.0 {
            to_come / rate
        } else if to_come > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        found.push(Candidate {
            size,
            rows_per_second: size as f64 / prediction.seconds,
            compute_seconds: prediction.seconds + prediction.tail_seconds,
            backlog_seconds: queued_rows.div_ceil(size) as f64 * prediction.seconds / slots,
            fill_seconds,
        });
    }
    Some(found)
}

/// The most efficient: the highest throughput; between equals, the smaller size (the
/// options come by size, and only a strictly higher throughput replaces the first).
fn most_efficient(options: &[Candidate]) -> Candidate {
    let mut best = options[0];
    for option in &options[1..] {
        if option.rows_per_second > best.rows_per_second {
            best = *option;
        }
    }
    best
}

/// The setting to run with next (see the module's model). `previous` (the setting in
/// force) decides whether batches overlap while the slots' measured worth is within
/// OVERLAP_HYSTERESIS of OVERLAP_WORTH; `unmeasured` is returned before any batch ran.
pub fn next_setting(
    target: &LatencyTarget,
    engine: &EngineProfile,
    arrival_rows_per_second: f64,
    queued_rows: usize,
    unmeasured: &BatchSetting,
    previous: Option<&BatchSetting>,
) -> BatchSetting {
    let parallel = engine.parallel_slots(target.execution_slots);
    let serialized = previous.is_some_and(|p| p.concurrent_batches == Some(1));
    let bound = OVERLAP_WORTH
        + if serialized {
            OVERLAP_HYSTERESIS
        } else {
            -OVERLAP_HYSTERESIS
        };
    let overlap = parallel >= bound;
    // The times that apply: beside another batch where batches overlap, alone where they
    // are serialized; the other kind until the one that applies is measured.
    let (first, other) = if overlap {
        (&engine.beside, &engine.alone)
    } else {
        (&engine.alone, &engine.beside)
    };
    let profile = if first.buckets.is_empty() {
        other
    } else {
        first
    };
    let slots = if overlap { parallel } else { 1.0 };
    let rate = arrival_rows_per_second;
    let Some(options) = candidates(target, profile, slots, rate, queued_rows) else {
        return unmeasured.clone();
    };
    let chosen = choose(target, &options, slots, rate, queued_rows);
    let (delay, best, reason) = chosen;
    if overlap {
        BatchSetting {
            queue_delay_microseconds: delay,
            preferred_batch_size: best.size,
            reason,
            predicted_p99_seconds: Some(best.predicted_seconds() + delay as f64 / 1e6),
            parallel_slots: Some(parallel),
            concurrent_batches: Some(target.execution_slots),
        }
    } else {
        // Serialized: one batch at a time, formed while the one before it runs (delay and
        // preferred size play no part then: a batch starts only on an idle engine).
        BatchSetting {
            queue_delay_microseconds: 0,
            preferred_batch_size: target.max_batch_size,
            reason,
            predicted_p99_seconds: Some(best.predicted_seconds()),
            parallel_slots: Some(parallel),
            concurrent_batches: Some(1),
        }
    }
}

/// The delay (microseconds), the size and the reason, among measured candidates.
fn choose(
    target: &LatencyTarget,
    options: &[Candidate],
    slots: f64,
    rate: f64,
    queued_rows: usize,
) -> (u64, Candidate, SettingReason) {
    let feasible: Vec<Candidate> = options
        .iter()
        .copied()
        .filter(|o| 0.0 <= o.fill_seconds && o.fill_seconds <= o.budget_seconds(target, true))
        .collect();
    if !feasible.is_empty() {
        // Throughput is the arrival rate once a size serves it with room to spare: of
        // those, the smallest (the lowest latency); with none, the most efficient.
        let needed = rate + queued_rows as f64 / target.seconds;
        let enough = feasible
            .iter()
            .filter(|o| o.rows_per_second * slots * UTILISATION_LIMIT >= needed)
            .min_by_key(|o| o.size);
        let best = enough.copied().unwrap_or_else(|| most_efficient(&feasible));
        let delay = best
            .budget_seconds(target, true)
            .min(FILL_SLACK * best.fill_seconds);
        return (microseconds(delay), best, SettingReason::WithinSlo);
    }
    if queued_rows > 0
        && options
            .iter()
            .any(|o| o.budget_seconds(target, false) >= 0.0)
    {
        // Some size would hold the target, but not with this queue ahead of it: the most
        // efficient size, waited for while its rows come, up to the target.
        let best = most_efficient(options);
        let delay = target.seconds.min(FILL_SLACK * best.fill_seconds);
        return (microseconds(delay), best, SettingReason::Behind);
    }
    // The lowest predicted latency; between equals, the smaller size (the first).
    let mut best = options[0];
    for option in &options[1..] {
        if option.predicted_seconds() < best.predicted_seconds() {
            best = *option;
        }
    }
    (0, best, SettingReason::SloUnreachable)
}

/// The batching policy and the setting in force as JSON (the runtime's GET /v2/batching;
/// camelCase, units in the names, as `adaptive.status_of`); `load` is None under Static.
/// `now` is seconds on the scheduler's clock.
pub fn status_of(
    config: &BatchingConfig,
    setting: &BatchSetting,
    load: Option<&MeasuredLoad>,
    now: f64,
) -> serde_json::Value {
    use serde_json::json;
    let slo = config.slo_p99_latency_milliseconds;
    let policy = match config.policy {
        super::config::PolicyKind::Static => "Static",
        super::config::PolicyKind::Adaptive => "Adaptive",
    };
    let mut status = json!({
        "policy": policy,
        "sloP99LatencyMilliseconds": slo,
        "maxBatchSize": config.max_batch_size,
        "queueDelayMicroseconds": setting.queue_delay_microseconds,
        "preferredBatchSize": setting.preferred_batch_size,
    });
    let (Some(load), Some(slo)) = (load, slo) else {
        return status;
    };
    let by_size = |profile: &ComputeProfile| -> serde_json::Value {
        profile
            .buckets
            .iter()
            .map(|(_, e)| {
                json!({
                    "rows": e.rows,
                    "meanMilliseconds": e.seconds * 1000.0,
                    "tailMilliseconds": e.tail_seconds() * 1000.0,
                })
            })
            .collect()
    };
    let margin = f64::from(config.slo_margin_percent);
    let measured = json!({
        "sloMarginPercent": config.slo_margin_percent,
        "targetP99Milliseconds": slo * (1.0 - margin / 100.0),
        "reason": setting.reason.name(),
        "predictedP99Milliseconds": setting.predicted_p99_seconds.map(|s| s * 1000.0),
        "parallelSlots": setting.parallel_slots,
        "concurrentBatches": setting.concurrent_batches,
        "arrivalRowsPerSecond": load.arrivals.rows_per_second(now),
        "computeAlone": by_size(&load.engine.alone),
        "computeBesideAnother": by_size(&load.engine.beside),
    });
    if let (Some(status), serde_json::Value::Object(measured)) = (status.as_object_mut(), measured)
    {
        status.extend(measured);
    }
    status
}

#[cfg(test)]
mod tests;
