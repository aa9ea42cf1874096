//! The batching policy as the runtime's configuration states it (`BatchingPolicy` in
//! `kubeinfer.contract.runtime_config`, rendered by the Python side as camelCase JSON, with
//! the execution slots resolved and the SLO beside it).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyKind {
    Static,
    Adaptive,
}

/// How requests of different shapes share batches (models with variable axes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShapeBatching {
    /// Requests of exactly the same shape batch together; nothing is padded.
    EqualShapes,
    /// Padded axes are rounded up to the next bucket, so nearby lengths share a batch.
    PadToBuckets,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchingConfig {
    pub policy: PolicyKind,
    /// Largest batch, in rows (the model's own bound when it cannot batch: 1).
    pub max_batch_size: usize,
    /// Longest a request waits for a larger batch, and only when that can help.
    pub max_queue_delay_microseconds: u64,
    /// Sorted and unique.
    pub preferred_batch_sizes: Vec<usize>,
    /// Batches run at once (the engine's default applied).
    pub execution_slots: usize,
    /// Requests admitted and not yet running before a 503.
    pub max_queue_size: usize,
    /// The deadline of a request without a `timeout` parameter, from its arrival.
    pub default_timeout_milliseconds: u64,
    pub shape_batching: ShapeBatching,
    /// Extents a padded axis is rounded up to (empty: powers of two).
    pub shape_buckets: Vec<usize>,
    pub slo_margin_percent: u32,
    /// The p99 objective (Adaptive needs one; Static reports it).
    pub slo_p99_latency_milliseconds: Option<f64>,
    /// Priority levels 1 (most urgent) to this; a request's priority 0 is the default level.
    pub priority_levels: u32,
    pub default_priority_level: u32,
}
