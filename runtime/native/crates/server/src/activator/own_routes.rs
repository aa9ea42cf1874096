//! The routes the activator answers itself, on requests no route's name is for: its
//! health (ready once a route table was read, until it stops), `GET /v2/activator` (each
//! route's held requests and its backend's readiness: what the operator reads to scale
//! from zero) and `GET /metrics`.
//!
//! `/v2/activator`'s body: `{"routes": [{"namespace", "service", "models", "held",
//! "backendReady", "oldestHeldSeconds"}]}`, in the table's order; `oldestHeldSeconds` is
//! how long the longest-held request has waited (null when none is held).

use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::answers::json;
use super::forward::{ProxyBody, own_body};
use super::{Context, Stage};

/// The answer of one of the activator's own routes (None: `head` names none of them).
pub fn answer(context: &Context, head: &Parts) -> Option<Response<ProxyBody>> {
    if head.method != Method::GET {
        return None;
    }
    Some(match head.uri.path() {
        "/v2/health/live" => json(&json!({"live": true}), StatusCode::OK),
        "/v2/health/ready" => {
            let ready = context.tables.read() && context.stage() == Stage::Serving;
            let status = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json(&json!({"ready": ready}), status)
        }
        "/v2/activator" => json(&status(context), StatusCode::OK),
        "/metrics" => exposition(context),
        _ => return None,
    })
}

/// `GET /v2/activator`'s body.
pub fn status(context: &Context) -> Value {
    let table = context.tables.current();
    let now = Instant::now();
    let routes: Vec<Value> = (table.routes.iter().zip(&table.holds))
        .map(|(route, hold)| {
            let (held, oldest) = hold.held(now);
            json!({
                "namespace": route.namespace,
                "service": route.service,
                "models": route.models,
                "held": held,
                "backendReady": hold.ready(),
                "oldestHeldSeconds": oldest.map(|d| d.as_secs_f64()),
            })
        })
        .collect();
    json!({"routes": routes})
}

fn exposition(context: &Context) -> Response<ProxyBody> {
    let mut response = Response::new(own_body(context.metrics.render()));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    response
}
