//! Sending to the backend pods: a held request forwarded as it came (HTTP/1 to the pods'
//! HTTP port; a call of the gRPC listener over HTTP/2 with prior knowledge to their gRPC
//! port), its answer streamed back as it comes (status, headers, body, trailers: gRPC's
//! status is in its trailers); readiness probes and wake-ups, through the same HTTP/1
//! client. hyper-util's client, with no idle connection kept: the backend is a Service's
//! cluster IP, whose kube-proxy picks a pod per connection, so a kept connection would
//! stay with the pod it first reached: a probe's answered by a pod leaving (draining, its
//! readiness 503) would carry the held requests to it once another pod is ready. A
//! connection per request, only while an object wakes, is the price.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{
    CONNECTION, CONTENT_TYPE, EXPECT, HOST, HeaderMap, HeaderName, HeaderValue, TE,
};
use hyper::http::request::Parts;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// What the activator answers with: a backend's streamed body, or its own.
pub type ProxyBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// A body the activator wrote itself.
pub fn own_body(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Longest a connection to a backend may take: a pod that is gone may leave its address
/// unanswered rather than refused, and the request must go back to waiting.
const CONNECT_WITHIN: Duration = Duration::from_secs(2);

/// Longest a readiness probe may take (then it counts as not ready).
const PROBE_WITHIN: Duration = Duration::from_secs(1);

/// Longest a wake-up POST may take (it is logged as failed past it).
const WAKE_WITHIN: Duration = Duration::from_secs(5);

/// A forward that failed.
#[derive(Debug)]
pub enum ForwardError {
    /// No connection to the backend (refused, unresolved, not answered within
    /// [`CONNECT_WITHIN`]): the request was not sent, and may be sent again.
    Connect(String),
    /// Sent, and the backend failed it: answered 502.
    Backend(String),
}

/// The clients to the backends.
pub struct Upstream {
    http1: Client<HttpConnector, Full<Bytes>>,
    h2c: Client<HttpConnector, Full<Bytes>>,
}

impl Upstream {
    pub fn new() -> Upstream {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_WITHIN));
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_timer(TokioTimer::new());
        builder.pool_max_idle_per_host(0);
        let http1 = builder.build(connector.clone());
        let h2c = builder.http2_only(true).build(connector);
        Upstream { http1, h2c }
    }

    /// Sends `head` and `body` to `host:port` (over HTTP/2 when `grpc`) and returns its
    /// answer as it starts, its body still coming.
    pub async fn forward(
        &self,
        host: &str,
        port: u16,
        head: &Parts,
        body: Bytes,
        grpc: bool,
        client: Option<IpAddr>,
    ) -> Result<Response<ProxyBody>, ForwardError> {
        let request = upstream_request(head, body, &authority(host, port), client)
            .map_err(ForwardError::Backend)?;
        let client = if grpc { &self.h2c } else { &self.http1 };
        match client.request(request).await {
            Ok(response) => Ok(downstream_response(response)),
            Err(error) if error.is_connect() => Err(ForwardError::Connect(describe(&error))),
            Err(error) => Err(ForwardError::Backend(describe(&error))),
        }
    }

    /// Whether the pods behind `host:port` are ready: their `/v2/health/ready` answers
    /// 200 (within [`PROBE_WITHIN`]).
    pub async fn ready(&self, host: &str, port: u16) -> bool {
        let uri = format!("http://{}/v2/health/ready", authority(host, port));
        let Ok(request) = Request::get(uri).body(Full::new(Bytes::new())) else {
            return false;
        };
        let asked = tokio::time::timeout(PROBE_WITHIN, async {
            let response = self.http1.request(request).await.ok()?;
            let status = response.status();
            // Read to its end, so the connection ends cleanly.
            response.into_body().collect().await.ok()?;
            Some(status)
        });
        matches!(asked.await, Ok(Some(StatusCode::OK)))
    }

    /// POSTs `body` (JSON) to `url`; never fails the caller: what went wrong is logged.
    pub async fn wake(&self, url: &Uri, body: Vec<u8>) {
        let request = Request::post(url.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)));
        let Ok(request) = request else {
            return;
        };
        let sent = tokio::time::timeout(WAKE_WITHIN, async {
            let response = self
                .http1
                .request(request)
                .await
                .map_err(|e| describe(&e))?;
            let status = response.status();
            let _ = response.into_body().collect().await;
            Ok::<_, String>(status)
        });
        match sent.await {
            Ok(Ok(status)) if status.is_success() => log::debug!("Woke url={url}"),
            Ok(Ok(status)) => log::warn!("Wake-up refused url={url} status={status}"),
            Ok(Err(error)) => log::warn!("Wake-up failed url={url} error={error}"),
            Err(_) => log::warn!("Wake-up timed out url={url}"),
        }
    }
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream::new()
    }
}

/// `host:port`, an IPv6 address in brackets.
fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The request to send: the client's method, path, query and headers (less the
/// hop-by-hop ones, its Host, the backend's being set from the URI, and its Expect),
/// `X-Forwarded-For` with the client's address added.
fn upstream_request(
    head: &Parts,
    body: Bytes,
    authority: &str,
    client: Option<IpAddr>,
) -> Result<Request<Full<Bytes>>, String> {
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = format!("http://{authority}{path}")
        .parse()
        .map_err(|e| format!("cannot forward to {authority}{path}: {e}"))?;
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = head.method.clone();
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    *headers = end_to_end(&head.headers);
    headers.remove(HOST);
    // The body was read whole already: the backend is not to be asked to invite it.
    headers.remove(EXPECT);
    if let Some(address) = client {
        let forwarded = match head.headers.get(X_FORWARDED_FOR).map(HeaderValue::to_str) {
            Some(Ok(earlier)) => format!("{earlier}, {address}"),
            _ => address.to_string(),
        };
        if let Ok(value) = HeaderValue::from_str(&forwarded) {
            headers.insert(X_FORWARDED_FOR, value);
        }
    }
    Ok(request)
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The backend's answer for the client: its status and end-to-end headers, its body (and
/// trailers) streamed.
fn downstream_response(response: Response<Incoming>) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    parts.headers = end_to_end(&parts.headers);
    Response::from_parts(parts, body.boxed_unsync())
}

/// The headers that belong to the request or answer itself, not to the connection it
/// came on (RFC 9110 section 7.6.1): those `Connection` names, and the hop-by-hop ones, are
/// left out; `TE: trailers` is kept (gRPC's servers may ask for it).
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = (headers.get_all(CONNECTION).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let hop = HOP_BY_HOP.contains(&name.as_str()) || named.iter().any(|n| n == name.as_str());
        let trailers = name == TE && value.as_bytes().eq_ignore_ascii_case(b"trailers");
        if !hop || trailers {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// A client error with its causes (hyper-util's own says only its kind).
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
