//! The runtime's series as `kubeinfer/contract/metric_series.py` names them, read from
//! `contract.tsv` (generated from the Python contract by `contract_tsv.py`, beside it), so
//! the Rust server exports the very names, types, labels, help and buckets the operator's
//! autoscaler, quality watch, dashboards and alerts read.

/// The generated listing: name, kind, labels, buckets, help; one series a line.
const CONTRACT_TSV: &str = include_str!("contract.tsv");

/// A family's type, as Prometheus names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Exported with `_total`.
    Counter,
    /// A value set (or moved up and down).
    Gauge,
    /// Exported as `_bucket`, `_sum` and `_count`.
    Histogram,
}

/// One metric family of the contract (Python's `contract.metric_series.Series`).
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesSpec {
    /// The family's name (a counter's samples add `_total`).
    pub name: &'static str,
    pub kind: Kind,
    /// The label names, in the contract's order.
    pub labels: Vec<&'static str>,
    /// A histogram's upper bounds (+Inf added on export); empty for the others.
    pub buckets: Vec<f64>,
    pub help: &'static str,
}

/// Every series of the contract, in its order. Panics on a malformed listing: it is
/// compiled in, and a test reads it.
pub fn series() -> Vec<SeriesSpec> {
    series_of(CONTRACT_TSV)
}

/// The series of a listing written by `contract_tsv.py` (this one's, or the activator's:
/// `activator.tsv`), in its order; panics on a malformed one, as [`series`].
pub fn series_of(listing: &'static str) -> Vec<SeriesSpec> {
    listing
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| parse_line(line).unwrap_or_else(|e| panic!("contract.tsv: {e}: {line}")))
        .collect()
}

fn parse_line(line: &'static str) -> Result<SeriesSpec, String> {
    let fields: Vec<&'static str> = line.split('\t').collect();
    let [name, kind, labels, buckets, help] = fields[..] else {
        return Err(format!("{} fields, not 5", fields.len()));
    };
    let kind = match kind {
        "counter" => Kind::Counter,
        "gauge" => Kind::Gauge,
        "histogram" => Kind::Histogram,
        other => return Err(format!("unknown kind {other}")),
    };
    let buckets = split_list(buckets)
        .map(|b| b.parse::<f64>().map_err(|e| format!("bucket {b}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SeriesSpec {
        name,
        kind,
        labels: split_list(labels).collect(),
        buckets,
        help,
    })
}

fn split_list(list: &'static str) -> impl Iterator<Item = &'static str> {
    list.split(',').filter(|item| !item.is_empty())
}

/// The names the server's own hooks use (each is checked against the listing by a test).
pub mod names {
    pub const QUEUE_DEPTH: &str = "kubeinfer_queue_depth";
    pub const INFLIGHT_BATCHES: &str = "kubeinfer_inflight_batches";
    pub const INFLIGHT_REQUESTS: &str = "kubeinfer_inflight_requests";
    pub const REQUESTS_IN_PROGRESS: &str = "kubeinfer_requests_in_progress";
    pub const REQUEST_DURATION: &str = "kubeinfer_request_duration_seconds";
    pub const QUEUE_DURATION: &str = "kubeinfer_queue_duration_seconds";
    pub const COMPUTE_DURATION: &str = "kubeinfer_compute_duration_seconds";
    pub const BATCH_SIZE: &str = "kubeinfer_batch_size";
    pub const REQUESTS: &str = "kubeinfer_requests";
    pub const REQUESTS_CANCELLED: &str = "kubeinfer_requests_cancelled";
    pub const ENGINE_STUCK_BATCHES: &str = "kubeinfer_engine_stuck_batches";
    pub const BATCH_OUTPUT_ROW_MISMATCHES: &str = "kubeinfer_batch_output_row_mismatches";
    pub const SLO_P99_LATENCY: &str = "kubeinfer_slo_p99_latency_seconds";
    pub const BATCHING_QUEUE_DELAY: &str = "kubeinfer_batching_queue_delay_seconds";
    pub const BATCHING_PREFERRED_BATCH_SIZE: &str = "kubeinfer_batching_preferred_batch_size";
    pub const BATCHING_CONCURRENT_BATCHES: &str = "kubeinfer_batching_concurrent_batches";
    pub const ENGINE_BUFFER_BYTES: &str = "kubeinfer_engine_buffer_bytes";
}
