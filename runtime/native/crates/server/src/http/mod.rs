//! The HTTP transport (hyper, HTTP/1.1): the v2 routes, which only translate HTTP to the
//! shared state and back. Every error is `{"error": ...}` JSON with its status; 503s carry
//! Retry-After; a 408 closes its connection, and so does every answer once draining began.
//! A body a route left unread (a refusal before reading it) is read and discarded after
//! the answer is sent, or the answer says `Connection: close`: a refusal is not held
//! behind its body, and no keep-alive connection is closed without saying so. A connection closes by lingering (`crate::lingering`): what its
//! client still sends after the answer is read and dropped, so the answer is not reset.

pub(crate) mod body;
pub(crate) mod infer;
mod shm;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{CONNECTION, CONTENT_TYPE, EXPECT, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};

use dataplane_core::error::ApiError;

use body::{Clock, Watched, discard_body};

use crate::model::server_metadata;
use crate::state::Shared;

/// A response body of parts sent one after the other (an encoded answer's JSON and binary
/// tensors, never joined into one buffer).
pub struct Parts(VecDeque<Bytes>);

impl Parts {
    pub fn one(bytes: impl Into<Bytes>) -> Parts {
        Parts(VecDeque::from([bytes.into()]))
    }

    pub fn many(parts: Vec<Bytes>) -> Parts {
        Parts(parts.into_iter().filter(|p| !p.is_empty()).collect())
    }
}

impl Body for Parts {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|part| Ok(Frame::data(part))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().map(|p| p.len() as u64).sum())
    }
}

/// What a route names: the model (and version) of a `/v2/models/...` path, and the rest.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'a> {
    Live,
    Ready,
    Server,
    /// `GET /metrics`.
    Metrics,
    /// `GET /v2/batching`.
    Batching,
    /// A route the embedding side answers ([`crate::admin::ADMIN_ROUTES`]).
    Admin,
    Model {
        name: &'a str,
        version: Option<&'a str>,
        action: Action,
    },
    /// Triton's system shared-memory extension: a region's (or all regions') action.
    SystemSharedMemory {
        region: Option<&'a str>,
        action: shm::ShmAction,
    },
    Unknown,
}

/// What a model path asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Metadata,
    Ready,
    Config,
    Infer,
}

/// The route of a path (the method is checked by the handler).
pub fn route(path: &str) -> Route<'_> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["v2", "health", "live"] => Route::Live,
        ["v2", "health", "ready"] => Route::Ready,
        ["v2"] => Route::Server,
        ["metrics"] => Route::Metrics,
        ["v2", "batching"] => Route::Batching,
        _ if crate::admin::is_admin_route(path) => Route::Admin,
        ["v2", "models", name, rest @ ..] if !name.is_empty() => {
            let (version, rest) = match rest {
                ["versions", version, rest @ ..] if !version.is_empty() => (Some(*version), rest),
                _ => (None, rest),
            };
            let action = match rest {
                [] => Action::Metadata,
                ["ready"] => Action::Ready,
                ["config"] => Action::Config,
                ["infer"] => Action::Infer,
                _ => return Route::Unknown,
            };
            Route::Model {
                name,
                version,
                action,
            }
        }
        ["v2", "systemsharedmemory", rest @ ..] => match shm::shm_route(rest) {
            Some((region, action)) => Route::SystemSharedMemory { region, action },
            None => Route::Unknown,
        },
        _ => Route::Unknown,
    }
}

/// Answers one request; never fails (every error is an answer).
pub async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Parts>, Infallible> {
    let (parts, body) = request.into_parts();
    let expects_continue = parts.headers.contains_key(EXPECT);
    let mut body = Watched::new(body);
    let mut response = answer(&shared, Request::from_parts(parts, &mut body)).await;
    if shared.draining() {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    let bounds = UnreadBounds {
        limit: shared.options.max_request_bytes,
        idle: Duration::from_secs_f64(shared.options.body_read_timeout_seconds.max(0.001)),
    };
    settle_unread_body(body, expects_continue, &mut response, bounds, shared);
    Ok(response)
}

/// What an unread body may still take to be read and dropped: the request's bounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UnreadBounds {
    /// The largest body taken (`maxRequestBytes`).
    pub limit: usize,
    /// The longest between two parts of it (the body read timeout).
    pub idle: Duration,
}

/// What the route leaves of a request's body (a refusal sent before it: unknown model,
/// a full queue) is read and discarded after the answer is sent, on a task of its own and
/// bounded as a body is (`maxRequestBytes`, the body read timeout), so that the refusal
/// reaches its client at once and the connection takes the next request in step rather
/// than be closed under a keep-alive client. Where it cannot be (declared too large, or a
/// client waiting for `100 Continue` before it sends it), the answer says
/// `Connection: close`. A body that breaks its bounds later (one without a length that
/// goes on past the limit, one sent too slowly) is dropped, and hyper closes the
/// connection after the answer already sent. The activator's refusals settle theirs here
/// too (`crate::activator`).
pub(crate) fn settle_unread_body<B>(
    mut body: Watched,
    expects_continue: bool,
    response: &mut Response<B>,
    bounds: UnreadBounds,
    clock: Arc<dyn Clock + Send + Sync>,
) {
    let closes = response
        .headers()
        .get(CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    if closes || body.ended() {
        return;
    }
    let UnreadBounds { limit, idle } = bounds;
    let fits = body.size_hint().exact().is_none_or(|n| n <= limit as u64);
    if !fits || (expects_continue && body.untouched()) {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return;
    }
    tokio::spawn(async move {
        let deadline = clock.now() + idle;
        if let Err(failure) = discard_body(&mut body, limit, deadline, idle, &*clock).await {
            log::debug!("An unread body was dropped: {}", failure.message());
        }
    });
}

/// The answer of the route a request names.
async fn answer(shared: &Arc<Shared>, request: Request<&mut Watched>) -> Response<Parts> {
    let path = request.uri().path().to_string();
    let method = request.method().clone();
    match (route(&path), &method) {
        (
            Route::Model {
                name,
                version,
                action: Action::Infer,
            },
            &Method::POST,
        ) => {
            let (name, version) = (name.to_string(), version.map(str::to_string));
            infer::infer(shared, request, &name, version.as_deref()).await
        }
        (Route::SystemSharedMemory { region, action }, _) => {
            let region = region.map(str::to_string);
            shm::handle(shared, request, region.as_deref(), action).await
        }
        (Route::Admin, _) => crate::admin::answer(shared, &method, &path).await,
        (Route::Unknown, _) => error(&ApiError::NotFound(format!("no route {method} {path}"))),
        (route, &Method::GET) => get(shared, route),
        _ => method_not_allowed(),
    }
}

fn get(shared: &Shared, route: Route<'_>) -> Response<Parts> {
    let answer = match route {
        Route::Live => {
            let live = shared.live();
            return json(serde_json::json!({"live": live}), ok_or_503(live));
        }
        Route::Ready => {
            let ready = shared.ready();
            return json(serde_json::json!({"ready": ready}), ok_or_503(ready));
        }
        Route::Server => Ok(server_metadata()),
        Route::Metrics => return crate::metrics::exposition(shared),
        Route::Batching => Ok(crate::metrics::batching_status(shared)),
        Route::Model {
            name,
            version,
            action,
        } => shared.model.check(name, version).map(|()| match action {
            Action::Ready => serde_json::json!({"name": name, "ready": shared.ready()}),
            Action::Config => shared.model.config(),
            _ => shared.model.metadata(),
        }),
        Route::Unknown | Route::Admin | Route::SystemSharedMemory { .. } => {
            unreachable!("answered by handle")
        }
    };
    match answer {
        Ok(body) => {
            let status = match (&route, body.get("ready")) {
                (
                    Route::Model {
                        action: Action::Ready,
                        ..
                    },
                    Some(serde_json::Value::Bool(false)),
                ) => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::OK,
            };
            json(body, status)
        }
        Err(failure) => error(&failure),
    }
}

fn ok_or_503(yes: bool) -> StatusCode {
    if yes {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// A JSON answer.
pub fn json(body: serde_json::Value, status: StatusCode) -> Response<Parts> {
    let bytes = serde_json::to_vec(&body).expect("a JSON value serializes");
    let mut response = Response::new(Parts::one(bytes));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The answer of an error: `{"error": ...}`, its status, Retry-After for a 503, and
/// `Connection: close` where the rest of the request cannot be read.
pub fn error(failure: &ApiError) -> Response<Parts> {
    let mut response = Response::new(Parts::one(failure.json_body()));
    *response.status_mut() =
        StatusCode::from_u16(failure.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(seconds) = failure.retry_after_seconds() {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    if failure.closes_connection() {
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

pub fn method_not_allowed() -> Response<Parts> {
    json(
        serde_json::json!({"error": "Method Not Allowed"}),
        StatusCode::METHOD_NOT_ALLOWED,
    )
}

#[cfg(test)]
mod tests;
