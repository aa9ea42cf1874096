//! The activator's tests: the route table and its matching, pure (`tests/routes.rs`); its
//! reloading (`tests/reload.rs`); and over real sockets on 127.0.0.1 against toy hyper
//! backends started by the test (`tests/holding.rs`: held then forwarded, the bound, the
//! hold timeout, clients that leave, the drain; `tests/grpc.rs`: gRPC through it, its
//! trailers passed on); its series against the contract's listing (`tests/series.rs`);
//! its wake-ups (`tests/wake.rs`). The activator runs on its own runtime (its start and shutdown
//! block), the clients and backends on the test's own, as the server's tests do; waits
//! are on conditions, polled.

mod grpc;
mod holding;
mod reload;
mod routes;
mod series;
mod wake;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

use super::{Activator, ActivatorOptions};

/// A folder of the test's own under the system's temporary one, removed when dropped.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new(name: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("activator-{name}-{}-{unique}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A route of namespace `ns`, service `svc` serving model `m` on these loopback ports.
pub(crate) fn route(http_port: u16, grpc_port: Option<u16>) -> Value {
    json!({"namespace": "ns", "service": "svc", "models": ["m"], "backendHost": "127.0.0.1",
           "httpPort": http_port, "grpcPort": grpc_port})
}

pub(crate) fn write_routes(path: &Path, routes: &[Value]) {
    std::fs::write(
        path,
        serde_json::to_vec(&json!({"routes": routes})).unwrap(),
    )
    .unwrap();
}

/// The options of an activator on loopback, `routes` its table's file, `changes` over
/// them (a short probe interval and routes poll, so the tests do not wait on them).
pub(crate) fn options(routes: &Path, changes: Value) -> ActivatorOptions {
    let mut options = json!({
        "host": "127.0.0.1", "httpPort": 0, "grpcPort": 0,
        "routesFile": routes, "probeIntervalMilliseconds": 10,
        "routesPollIntervalMilliseconds": 20, "drainGracePeriodSeconds": 5.0,
    });
    for (key, value) in changes.as_object().unwrap() {
        options[key] = value.clone();
    }
    serde_json::from_value(options).expect("the options parse")
}

/// An activator whose table routes `ns/svc` to the loopback `http_port` (and `grpc_port`).
pub(crate) fn activator(
    scratch: &Scratch,
    http_port: u16,
    grpc_port: Option<u16>,
    changes: Value,
) -> Activator {
    let routes = scratch.path("routes.json");
    write_routes(&routes, &[route(http_port, grpc_port)]);
    Activator::start(options(&routes, changes)).expect("the activator starts")
}

/// The test's own runtime, for its clients and backends (the activator has its own).
pub(crate) fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A loopback port nothing listens on now (bound and closed again): where a backend the
/// test starts later will listen.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `check` until it holds (at most 30 s: a bound for a broken test, not a wait).
pub(crate) async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many requests `activator` holds for `ns/svc`.
pub(crate) fn held(activator: &Activator) -> u64 {
    activator.status()["routes"][0]["held"].as_u64().unwrap()
}

/// One HTTP/1 request over a fresh connection: status, headers, body.
pub(crate) async fn call(
    port: u16,
    method: &str,
    path: &str,
    host: &str,
    body: &[u8],
) -> (StatusCode, hyper::HeaderMap, Bytes) {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", host)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::copy_from_slice(body)))
        .unwrap();
    let answered = async {
        let response = sender.send_request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        (
            parts.status,
            parts.headers,
            body.collect().await.unwrap().to_bytes(),
        )
    };
    // A bound for a broken test (one that would hang), not a wait.
    tokio::time::timeout(Duration::from_secs(30), answered)
        .await
        .expect("answered within 30 s")
}

/// The sample `name` at `labels` in a scrape of the activator's /metrics (None: absent).
pub(crate) async fn metric(port: u16, name: &str, labels: &str) -> Option<f64> {
    let (_, _, body) = call(port, "GET", "/metrics", "127.0.0.1", b"").await;
    let text = String::from_utf8(body.to_vec()).unwrap();
    let series = format!("{name}{labels} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map(|value| value.parse().unwrap())
}

/// A toy backend on `port`: ready (`/v2/health/ready` 200), and answering every other
/// request with JSON naming its method, path and body; it counts what it answered.
pub(crate) struct Backend {
    pub answered: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    pub(crate) async fn start(port: u16) -> Backend {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let answered = Arc::new(AtomicUsize::new(0));
        let counted = answered.clone();
        let task = tokio::spawn(async move {
            // Dropped with the task: stopping the backend closes its connections too.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let counted = counted.clone();
                let service =
                    hyper::service::service_fn(move |request| echo(request, counted.clone()));
                // One request a connection: the activator's pool keeps none, so a stopped
                // backend is one its next forward cannot connect to.
                let connection = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service);
                connections.spawn(connection);
            }
        });
        Backend { answered, task }
    }

    /// Stops listening and closes its connections: a pod gone.
    pub(crate) async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn echo(
    request: Request<Incoming>,
    answered: Arc<AtomicUsize>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    if parts.uri.path() == "/v2/health/ready" {
        return Ok(Response::new(Full::new(Bytes::from_static(
            b"{\"ready\":true}",
        ))));
    }
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    answered.fetch_add(1, Ordering::SeqCst);
    let echoed = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.to_string(),
        "body": String::from_utf8_lossy(&body),
        "host": parts.headers.get("host").and_then(|v| v.to_str().ok()),
        "forwardedFor": parts.headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()),
    });
    Ok(Response::new(Full::new(Bytes::from(echoed.to_string()))))
}
