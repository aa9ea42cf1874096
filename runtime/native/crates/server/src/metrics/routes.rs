//! `GET /metrics` and `GET /v2/batching`'s body, read from the shared state.

use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use serde_json::Value;

use super::Snapshot;
use crate::http::Parts;
use crate::state::Shared;

/// The exposition's content type: OpenMetrics text, which Prometheus asks for and
/// `prometheus_client`'s parsers read.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /metrics`: the scheduler's state read under the lock, rendered after it.
pub fn exposition(shared: &Shared) -> Response<Parts> {
    let snapshot = {
        let core = shared.core();
        let (running_batches, running_requests) = core.scheduler.running();
        Snapshot {
            queued: core.scheduler.queued(),
            running_batches,
            running_requests,
            stuck_batches: core.scheduler.stuck_batches(),
            setting: Some(core.scheduler.setting().clone()),
        }
    };
    let mut response = Response::new(Parts::one(shared.metrics.render(&snapshot)));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE),
    );
    response
}

/// `GET /v2/batching`: the scheduler's status with what the Python route adds:
/// `modelBatches` and `modelBatchesReason` (what the load's probe found, when it ran),
/// `configuredMaxBatchSize` (what the configuration asked for) and `outputRowMismatches`.
pub fn batching_status(shared: &Shared) -> Value {
    let mut status = shared.core().scheduler.status(shared.now());
    let options = &shared.options;
    if let Value::Object(fields) = &mut status {
        if let Some(probe) = &options.batching_probe {
            fields.insert("modelBatches".into(), probe.batches.into());
            fields.insert("modelBatchesReason".into(), probe.reason.clone().into());
        }
        let configured = options
            .configured_max_batch_size
            .unwrap_or(options.batching.max_batch_size);
        fields.insert("configuredMaxBatchSize".into(), configured.into());
        fields.insert(
            "outputRowMismatches".into(),
            shared.metrics.output_row_mismatches().into(),
        );
    }
    status
}
