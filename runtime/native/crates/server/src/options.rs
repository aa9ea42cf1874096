//! The runtime's options as the Python side renders them.

use std::collections::BTreeMap;

use dataplane_core::batching::config::BatchingConfig;

/// The runtime's options as the Python side renders them (camelCase JSON).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerOptions {
    /// The address to listen on (`0.0.0.0`, `127.0.0.1`).
    pub host: String,
    /// The HTTP port; 0 picks a free one ([`crate::Server::http_port`] tells which).
    pub http_port: u16,
    /// The gRPC port (None: no gRPC).
    pub grpc_port: Option<u16>,
    /// The batching policy, execution slots resolved.
    pub batching: BatchingConfig,
    /// The largest request body taken (`maxRequestBytes`, resolved by the Python side).
    pub max_request_bytes: usize,
    /// Longest the request line and headers may take to arrive: past it hyper closes the
    /// connection without an answer.
    pub header_read_timeout_seconds: f64,
    /// Longest between two parts of a body (408 past it).
    pub body_read_timeout_seconds: f64,
    /// Liveness turns false once a batch has been stuck this long.
    pub engine_stuck_liveness_seconds: f64,
    /// How long a shutdown waits for the admitted requests to be answered.
    pub drain_grace_period_seconds: f64,
    /// The value each padded input's padded positions are filled with (PadToBuckets).
    #[serde(default)]
    pub pad_values: BTreeMap<String, f64>,
    /// Readiness as the server starts ([`crate::Server::set_ready`] changes it): false
    /// holds the model not ready until the Python side says (its known-answer check).
    #[serde(default = "yes")]
    pub start_ready: bool,
    /// The runtime's worker threads (the HTTP connections and the driver).
    #[serde(default = "two")]
    pub worker_threads: usize,
    /// The maxBatchSize the configuration asked for, when the one in effect was set aside
    /// for a model served one request per run (`/v2/batching`'s configuredMaxBatchSize).
    #[serde(default)]
    pub configured_max_batch_size: Option<usize>,
    /// What the load's batching probe found, when it ran (`/v2/batching`'s modelBatches).
    #[serde(default)]
    pub batching_probe: Option<BatchingProbe>,
}

/// What the load's probe found of whether the model batches (Python's `BatchingProbe`
/// on the wire): `batches` None when it could not tell, `reason` why or how.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct BatchingProbe {
    pub batches: Option<bool>,
    #[serde(default)]
    pub reason: String,
}

fn yes() -> bool {
    true
}

fn two() -> usize {
    2
}
