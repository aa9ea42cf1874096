//! One request through the activator: which route it is for, then, if that route's
//! backend is known ready, forwarded at once; else held: admitted against the route's
//! bound before its body is read (refused at once past it, the body left to
//! `settle_unread_body`), its body read, and forwarded once the backend is ready, or
//! refused when its hold time passes. A forward that cannot connect sends the request
//! back to waiting (its body is kept whole, so it can be sent again), and so does one a
//! pod refuses before running it (a 503 with Retry-After, or a trailers-only UNAVAILABLE with
//! retry-after: one draining as it leaves, which kube-proxy still sends to while no other
//! pod is ready, admitted nothing). A gRPC call sent to an address rather than a route's
//! name names its model only in its message: its body is read (bounded as any) to find its
//! route, before its admission.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::header::{CONNECTION, EXPECT, HOST, HeaderValue, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::{Request, Response, StatusCode};
use tokio::time::Instant;

use dataplane_core::error::ApiError;

use super::answers::{Transport, json, refusal};
use super::forward::{ForwardError, ProxyBody};
use super::hold::{HeldGuard, Hold, Waited};
use super::metrics::Outcome;
use super::routes::{Matched, match_route, model_of_grpc_message, model_of_path, routes_of_host};
use super::{Context, own_routes};
use crate::http::body::{Clock, Watched, check_declared_length, read_body};
use crate::http::{UnreadBounds, settle_unread_body};

/// Answers one request on `transport` from `client`; never fails (every error is an
/// answer).
pub async fn handle(
    context: Arc<Context>,
    request: Request<Incoming>,
    transport: Transport,
    client: Option<IpAddr>,
) -> Result<Response<ProxyBody>, Infallible> {
    let arrived = Instant::now();
    let (head, body) = request.into_parts();
    let mut body = Watched::new(body);
    let arrival = Arrival {
        head: &head,
        transport,
        client,
        arrived,
    };
    let mut response = answer(&context, arrival, &mut body).await;
    if transport == Transport::Http {
        if context.stage() != super::Stage::Serving {
            (response.headers_mut()).insert(CONNECTION, HeaderValue::from_static("close"));
        }
        let bounds = UnreadBounds {
            limit: context.options.max_request_bytes,
            idle: context.options.body_idle(),
        };
        let expects_continue = head.headers.contains_key(EXPECT);
        settle_unread_body(body, expects_continue, &mut response, bounds, context);
    }
    Ok(response)
}

/// What is known of a request as it arrives.
#[derive(Clone, Copy)]
struct Arrival<'a> {
    head: &'a Parts,
    transport: Transport,
    client: Option<IpAddr>,
    arrived: Instant,
}

impl Arrival<'_> {
    /// The name the request was sent to: HTTP/2's :authority, or the Host header.
    fn host(&self) -> Option<&str> {
        (self.head.uri.authority().map(|a| a.as_str()))
            .or_else(|| self.head.headers.get(HOST).and_then(|v| v.to_str().ok()))
    }
}

/// The answer of the route the request is for, or of the activator's own routes.
async fn answer(
    context: &Arc<Context>,
    arrival: Arrival<'_>,
    body: &mut Watched,
) -> Response<ProxyBody> {
    let table = context.tables.current();
    let host = arrival.host();
    let named = host.is_some_and(|h| !routes_of_host(&table.routes, h).is_empty());
    if !named && arrival.transport == Transport::Http {
        if let Some(response) = own_routes::answer(context, arrival.head) {
            return response;
        }
    }
    let path_model = match arrival.transport {
        Transport::Http => model_of_path(arrival.head.uri.path()),
        Transport::Grpc => None,
    };
    let mut model = path_model.map(str::to_string);
    let mut matched = match_route(&table.routes, host, model.as_deref());
    let mut read = None;
    if matched == Matched::Unrouted && arrival.transport == Transport::Grpc {
        // A gRPC call names its model in its message: read it to find its route.
        let bytes = match read_whole(context, body).await {
            Ok(bytes) => bytes,
            Err(error) => return refusal(&error, arrival.transport, context.retry_after()),
        };
        model = model_of_grpc_message(&bytes).map(str::to_string);
        matched = match_route(&table.routes, host, model.as_deref());
        read = Some(bytes);
    }
    let index = match matched {
        Matched::Route(index) => index,
        other => return unrouted(context, &other, host, model.as_deref(), arrival.transport),
    };
    let hold = table.holds[index].clone();
    drop(table);
    Proxied::new(context, &hold, arrival).run(body, read).await
}

/// The 404 of a request no route is for (`matched` says why), counted.
fn unrouted(
    context: &Context,
    matched: &Matched,
    host: Option<&str>,
    model: Option<&str>,
    transport: Transport,
) -> Response<ProxyBody> {
    context.metrics.unrouted();
    let (host, model) = (host.unwrap_or(""), model.unwrap_or(""));
    let message = match matched {
        Matched::Ambiguous(namespaces) => format!(
            "model {model:?} is served in more than one namespace ({}): send the request to \
             its Service's name (service.namespace)",
            namespaces.join(", ")
        ),
        _ => format!("the activator has no route for host {host:?} or model {model:?}"),
    };
    refusal(
        &ApiError::NotFound(message),
        transport,
        context.retry_after(),
    )
}

/// A routed request on its way: it counts its outcome once, and as cancelled if its
/// handler is dropped first (its client left).
struct Proxied<'a> {
    context: &'a Context,
    hold: &'a Arc<Hold>,
    arrival: Arrival<'a>,
    ended: bool,
}

impl Drop for Proxied<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.hold.ended(Outcome::Cancelled);
        }
    }
}

impl<'a> Proxied<'a> {
    fn new(context: &'a Context, hold: &'a Arc<Hold>, arrival: Arrival<'a>) -> Proxied<'a> {
        Proxied {
            context,
            hold,
            arrival,
            ended: false,
        }
    }

    /// Counted as `outcome`, answered `error`.
    fn refuse(&mut self, outcome: Outcome, error: ApiError) -> Response<ProxyBody> {
        self.ended = true;
        self.hold.ended(outcome);
        refusal(&error, self.arrival.transport, self.context.retry_after())
    }

    /// Admitted, read, held until the backend is ready, forwarded; `read` is the body
    /// when it was read already (to find a gRPC call's model).
    async fn run(mut self, body: &mut Watched, read: Option<Bytes>) -> Response<ProxyBody> {
        if self.port().is_none() {
            let message = format!("route {} serves no gRPC", self.hold.route().key());
            return self.refuse(Outcome::BackendError, ApiError::NotFound(message));
        }
        if self.context.stage() != super::Stage::Serving {
            let error = ApiError::NotReady("the activator is stopping".into());
            return self.refuse(Outcome::RefusedDraining, error);
        }
        let mut held = None;
        if !self.hold.ready() {
            held = match self.hold.hold(self.arrival.arrived) {
                Some(guard) => Some(guard),
                None => return self.refuse(Outcome::RefusedFull, self.full()),
            };
        }
        let bytes = match read {
            Some(bytes) => bytes,
            None => match read_whole(self.context, body).await {
                Ok(bytes) => bytes,
                Err(error) => return self.refuse(Outcome::RefusedBody, error),
            },
        };
        self.forward_when_ready(held, bytes).await
    }

    /// The backend's port for this request's transport, as the table says now (None: a
    /// gRPC call to a route that serves none).
    fn port(&self) -> Option<u16> {
        let route = self.hold.route();
        match self.arrival.transport {
            Transport::Http => Some(route.http_port),
            Transport::Grpc => route.grpc_port,
        }
    }

    /// Waits (while `held`) for the backend, then forwards `bytes`; a forward that cannot
    /// connect waits again, within the hold time.
    async fn forward_when_ready(
        &mut self,
        mut held: Option<HeldGuard>,
        bytes: Bytes,
    ) -> Response<ProxyBody> {
        let arrival = self.arrival;
        let deadline = arrival.arrived + self.context.options.hold_timeout();
        loop {
            if held.is_some() {
                if let Some(refused) = self.wait(deadline).await {
                    return refused;
                }
            }
            match self.send(bytes.clone()).await {
                Ok(response) if not_admitted(&response, arrival.transport) => {
                    // A pod that no longer admits (one draining as it leaves) ran nothing:
                    // the request waits for a pod that does, within its hold time, whether
                    // it was held on arrival or sent straight to a backend known ready.
                    let route = self.hold.route().key();
                    log::debug!("Backend did not admit a request (retry later) route={route}");
                    self.hold.not_ready();
                    if held.is_none() {
                        held = match self.hold.hold(arrival.arrived) {
                            Some(guard) => Some(guard),
                            None => return self.refuse(Outcome::RefusedFull, self.full()),
                        };
                    }
                }
                Ok(response) => {
                    self.hold.answered();
                    let waited = arrival.arrived.elapsed().as_secs_f64();
                    self.hold.series.hold_duration.observe(waited);
                    self.ended = true;
                    self.hold.ended(Outcome::Forwarded);
                    return response;
                }
                Err(ForwardError::Connect(error)) => {
                    let route = self.hold.route().key();
                    log::debug!("Backend unreachable route={route} error={error}");
                    self.hold.not_ready();
                    if held.is_none() {
                        held = match self.hold.hold(arrival.arrived) {
                            Some(guard) => Some(guard),
                            None => return self.refuse(Outcome::RefusedFull, self.full()),
                        };
                    }
                }
                Err(ForwardError::Backend(error)) => {
                    let route = self.hold.route().key();
                    log::warn!("Forward failed route={route} error={error}");
                    self.ended = true;
                    self.hold.ended(Outcome::BackendError);
                    return bad_gateway(&error, arrival.transport);
                }
            }
        }
    }

    /// Waits for the backend until `deadline`: None once it is ready, else the refusal.
    async fn wait(&mut self, deadline: Instant) -> Option<Response<ProxyBody>> {
        match self.hold.wait_ready(deadline).await {
            Waited::Ready => None,
            Waited::TimedOut => Some(self.refuse(Outcome::RefusedHoldTimeout, self.timed_out())),
            Waited::Stopped => {
                let error = ApiError::NotReady(format!(
                    "the activator stopped before a pod of {} was ready",
                    self.hold.route().key()
                ));
                Some(self.refuse(Outcome::RefusedDraining, error))
            }
        }
    }

    /// Sends the request with `bytes` to the route's backend as the table says now.
    async fn send(&self, bytes: Bytes) -> Result<Response<ProxyBody>, ForwardError> {
        let Some(port) = self.port() else {
            let route = self.hold.route().key();
            return Err(ForwardError::Backend(format!(
                "route {route} serves no gRPC"
            )));
        };
        let host = self.hold.route().backend_host;
        let (head, client) = (self.arrival.head, self.arrival.client);
        let grpc = self.arrival.transport == Transport::Grpc;
        (self.context.upstream)
            .forward(&host, port, head, bytes, grpc, client)
            .await
    }

    fn full(&self) -> ApiError {
        let most = self.context.options.max_held_requests_per_route;
        ApiError::Overloaded(format!(
            "the activator holds {most} requests for {} already (maxHeldRequestsPerRoute) \
             until one of its pods is ready",
            self.hold.route().key()
        ))
    }

    fn timed_out(&self) -> ApiError {
        ApiError::NotReady(format!(
            "no pod of {} was ready within the activator's hold timeout ({} s)",
            self.hold.route().key(),
            self.context.options.hold_timeout_seconds
        ))
    }
}

/// The whole body, bounded by maxRequestBytes (413, before a byte is read for a declared
/// length past it) and the body read timeout (408).
async fn read_whole(context: &Context, body: &mut Watched) -> Result<Bytes, ApiError> {
    let limit = context.options.max_request_bytes;
    let too_large = |error: ApiError| match error {
        ApiError::TooLarge(_) => ApiError::TooLarge(format!(
            "the request body is over the activator's limit of {limit} bytes \
             (maxRequestBytes, kubeinfer activator --max-request-bytes)"
        )),
        other => other,
    };
    check_declared_length(body.size_hint().exact(), limit).map_err(too_large)?;
    let idle = context.options.body_idle();
    let deadline = context.now() + context.options.hold_timeout().max(idle);
    read_body(body, limit, deadline, idle, context, &|| {})
        .await
        .map_err(too_large)
}

/// The backend pod refused the request before running it, and says to retry (it is
/// draining, not started, or full): over HTTP a 503 with Retry-After, over gRPC a
/// trailers-only answer (its status in the headers, before any message) UNAVAILABLE or
/// RESOURCE_EXHAUSTED with retry-after, as the runtime refuses at admission. It may be sent
/// again. A 503 with no Retry-After, or a gRPC status in the trailers after a message, is
/// the client's answer.
fn not_admitted(response: &Response<ProxyBody>, transport: Transport) -> bool {
    let headers = response.headers();
    let says_retry = headers.contains_key(RETRY_AFTER);
    match transport {
        Transport::Http => says_retry && response.status() == StatusCode::SERVICE_UNAVAILABLE,
        Transport::Grpc => {
            let refused = (headers.get("grpc-status"))
                .is_some_and(|code| code == UNAVAILABLE || code == RESOURCE_EXHAUSTED);
            says_retry && refused
        }
    }
}

/// gRPC's status numbers of a refusal at admission.
const UNAVAILABLE: &str = "14";
const RESOURCE_EXHAUSTED: &str = "8";

/// A backend that failed a forwarded request: 502 over HTTP, UNAVAILABLE over gRPC.
fn bad_gateway(error: &str, transport: Transport) -> Response<ProxyBody> {
    let message = format!("the backend failed the request: {error}");
    match transport {
        Transport::Http => json(
            &serde_json::json!({"error": message}),
            StatusCode::BAD_GATEWAY,
        ),
        Transport::Grpc => {
            let unavailable = ApiError::NotReady(message);
            let mut response = refusal(&unavailable, transport, 0);
            response.headers_mut().remove("retry-after");
            response
        }
    }
}
