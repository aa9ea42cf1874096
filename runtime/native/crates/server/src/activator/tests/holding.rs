//! Requests through the activator over HTTP/1: held until a backend started late is
//! ready, then all forwarded as they came; past the route's bound refused at once, before
//! their body; refused when their hold time passes; a client that leaves while held
//! counted and given back its place; a forward that cannot connect held again, one the
//! backend fails answered 502; the drain's 503s and forwards; requests for no route (a
//! model two namespaces serve among them), and the activator's own routes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Backend, Scratch, activator, call, client_runtime, free_port, held, metric, until};
use crate::Activator;

/// The route's requests that ended as `outcome`, as the activator's /metrics counts them.
async fn counted(port: u16, outcome: &str) -> Option<f64> {
    let labels = format!(r#"{{namespace="ns",service="svc",outcome="{outcome}"}}"#);
    metric(port, "kubeinfer_activator_requests_total", &labels).await
}

/// The route's sample `name` in the activator's /metrics.
async fn of_route(port: u16, name: &str) -> Option<f64> {
    metric(port, name, r#"{namespace="ns",service="svc"}"#).await
}

/// An infer request for the route's model, sent to its Service's name.
async fn infer(port: u16, i: usize) -> (hyper::StatusCode, hyper::HeaderMap, bytes::Bytes) {
    let body = format!("{{\"i\":{i}}}");
    let path = format!("/v2/models/m/infer?i={i}");
    call(
        port,
        "POST",
        &path,
        "svc.ns.svc.cluster.local:8000",
        body.as_bytes(),
    )
    .await
}

/// A response read from a raw socket: its status line and headers (lower-cased), and its
/// body (by Content-Length).
async fn read_response(stream: &mut TcpStream) -> (u16, Vec<(String, String)>, Value) {
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        let read = stream.read(&mut chunk).await.unwrap();
        assert!(read > 0, "closed before an answer");
        data.extend_from_slice(&chunk[..read]);
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
    };
    let head = String::from_utf8(data[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| l.split_once(':').unwrap())
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .unwrap()
        .1
        .parse()
        .unwrap();
    let mut body = data[end + 4..].to_vec();
    while body.len() < length {
        let read = stream.read(&mut chunk).await.unwrap();
        body.extend_from_slice(&chunk[..read]);
    }
    (status, headers, serde_json::from_slice(&body).unwrap())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn requests_held_until_a_backend_started_late_is_ready_are_all_forwarded_as_they_came() {
    let scratch = Scratch::new("late");
    let backend_port = free_port();
    let activator = activator(&scratch, backend_port, None, json!({}));
    let port = activator.http_port();
    client_runtime().block_on(async {
        let calls: Vec<_> = (0..20).map(|i| tokio::spawn(infer(port, i))).collect();
        until("20 requests held", || held(&activator) == 20).await;
        let route = &activator.status()["routes"][0];
        assert_eq!(route["backendReady"], false);
        assert!(route["oldestHeldSeconds"].as_f64().unwrap() > 0.0);
        assert_eq!(
            of_route(port, "kubeinfer_activator_held_requests").await,
            Some(20.0)
        );
        let backend = Backend::start(backend_port).await;
        for (i, call) in calls.into_iter().enumerate() {
            let (status, _, body) = call.await.unwrap();
            assert_eq!(status, 200, "{body:?}");
            let echoed: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(echoed["method"], "POST");
            assert_eq!(echoed["path"], format!("/v2/models/m/infer?i={i}"));
            assert_eq!(echoed["body"], format!("{{\"i\":{i}}}"));
            assert_eq!(echoed["host"], format!("127.0.0.1:{backend_port}"));
            assert_eq!(echoed["forwardedFor"], "127.0.0.1");
        }
        assert_eq!(backend.answered.load(Ordering::SeqCst), 20);
        let route = &activator.status()["routes"][0];
        assert_eq!(
            (route["held"].as_u64(), &route["backendReady"]),
            (Some(0), &json!(true))
        );
        assert_eq!(route["oldestHeldSeconds"], Value::Null);
        // Known ready: the next one is forwarded at once, never held.
        assert_eq!(infer(port, 20).await.0, 200);
        assert_eq!(counted(port, "forwarded").await, Some(21.0));
        let observed = of_route(port, "kubeinfer_activator_hold_seconds_count").await;
        assert_eq!(observed, Some(21.0));
        assert_eq!(
            of_route(port, "kubeinfer_activator_held_requests").await,
            Some(0.0)
        );
    });
    activator.stop();
    assert_eq!(
        Arc::strong_count(&activator.context),
        1,
        "its state let go once stopped"
    );
}

#[test]
fn past_the_bound_a_request_is_refused_at_once_before_its_body_and_the_held_go_on() {
    let scratch = Scratch::new("bound");
    let backend_port = free_port();
    // A body read timeout past the answer's bound: a refusal that waited for the body
    // would not come in time.
    let changes = json!({"maxHeldRequestsPerRoute": 2, "retryAfterSeconds": 3,
                         "bodyReadTimeoutSeconds": 60});
    let activator = activator(&scratch, backend_port, None, changes);
    let port = activator.http_port();
    client_runtime().block_on(async {
        let calls: Vec<_> = (0..2).map(|i| tokio::spawn(infer(port, i))).collect();
        until("2 requests held", || held(&activator) == 2).await;
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let head =
            "POST /v2/models/m/infer HTTP/1.1\r\nHost: svc.ns\r\nContent-Length: 100000\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        // Not a byte of the body sent: the answer does not wait for it.
        let answered = tokio::time::timeout(Duration::from_secs(30), read_response(&mut stream));
        let (status, headers, body) = answered.await.expect("refused before its body");
        assert_eq!(status, 503);
        assert_eq!(header(&headers, "retry-after"), Some("3"));
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
        assert_eq!(
            header(&headers, "connection"),
            None,
            "kept: its body is read and dropped after"
        );
        let error = body["error"].as_str().unwrap();
        assert!(
            error.contains("holds 2 requests for ns/svc already"),
            "{error}"
        );
        assert_eq!(held(&activator), 2);
        assert_eq!(counted(port, "refused_full").await, Some(1.0));
        let _backend = Backend::start(backend_port).await;
        for call in calls {
            assert_eq!(call.await.unwrap().0, 200);
        }
    });
}

#[test]
fn a_request_held_past_its_hold_timeout_is_refused_with_retry_after() {
    let scratch = Scratch::new("timeout");
    let changes = json!({"holdTimeoutSeconds": 0.3});
    let activator = activator(&scratch, free_port(), None, changes);
    let port = activator.http_port();
    client_runtime().block_on(async {
        let started = Instant::now();
        let (status, headers, body) = infer(port, 0).await;
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(status, 503);
        assert_eq!(headers["retry-after"], "1");
        let error: Value = serde_json::from_slice(&body).unwrap();
        let error = error["error"].as_str().unwrap();
        assert!(
            error
                .contains("no pod of ns/svc was ready within the activator's hold timeout (0.3 s)"),
            "{error}"
        );
        assert_eq!(counted(port, "refused_hold_timeout").await, Some(1.0));
        assert_eq!(held(&activator), 0);
    });
}

#[test]
fn a_client_that_leaves_while_held_is_counted_and_gives_its_place_back() {
    let scratch = Scratch::new("leaves");
    let activator = activator(&scratch, free_port(), None, json!({}));
    let port = activator.http_port();
    client_runtime().block_on(async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let request =
            "POST /v2/models/m/infer HTTP/1.1\r\nHost: svc\r\nContent-Length: 2\r\n\r\n{}";
        stream.write_all(request.as_bytes()).await.unwrap();
        until("the request held", || held(&activator) == 1).await;
        drop(stream);
        until("its place given back", || held(&activator) == 0).await;
        assert_eq!(counted(port, "cancelled").await, Some(1.0));
    });
}

#[test]
fn a_forward_that_cannot_connect_is_held_again_until_the_backend_is_back() {
    let scratch = Scratch::new("gone");
    let backend_port = free_port();
    let activator = activator(&scratch, backend_port, None, json!({}));
    let port = activator.http_port();
    client_runtime().block_on(async {
        let backend = Backend::start(backend_port).await;
        assert_eq!(infer(port, 0).await.0, 200);
        assert_eq!(activator.status()["routes"][0]["backendReady"], true);
        backend.stop().await; // the pod gone, the route still known ready
        let call = tokio::spawn(infer(port, 1));
        until("the request held again", || held(&activator) == 1).await;
        assert_eq!(activator.status()["routes"][0]["backendReady"], false);
        let backend = Backend::start(backend_port).await;
        let (status, _, body) = call.await.unwrap();
        assert_eq!(status, 200);
        let echoed: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(echoed["body"], "{\"i\":1}", "the body sent again whole");
        assert_eq!(backend.answered.load(Ordering::SeqCst), 1);
    });
}

type Call = tokio::task::JoinHandle<(hyper::StatusCode, hyper::HeaderMap, bytes::Bytes)>;

/// `count` requests sent on `runtime`, once the activator holds them all.
fn held_calls(runtime: &tokio::runtime::Runtime, activator: &Activator, count: usize) -> Vec<Call> {
    let port = activator.http_port();
    runtime.block_on(async {
        let calls: Vec<_> = (0..count).map(|i| tokio::spawn(infer(port, i))).collect();
        until("the requests held", || held(activator) == count as u64).await;
        calls
    })
}

/// The activator shut down with `grace` on a thread of its own (its shutdown blocks).
fn drain(activator: &Arc<Activator>, grace: Duration) -> std::thread::JoinHandle<()> {
    let draining = activator.clone();
    std::thread::spawn(move || draining.shutdown(grace))
}

async fn listener_closed(port: u16) {
    until("the listener closed", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
    })
    .await;
}

#[test]
fn a_drain_refuses_what_it_still_holds_once_its_grace_passed() {
    let scratch = Scratch::new("drain");
    let activator = Arc::new(activator(&scratch, free_port(), None, json!({})));
    let runtime = client_runtime();
    let calls = held_calls(&runtime, &activator, 2);
    let started = Instant::now();
    let drained = drain(&activator, Duration::from_millis(400));
    runtime.block_on(async {
        listener_closed(activator.http_port()).await;
        for call in calls {
            let (status, headers, body) = call.await.unwrap();
            assert!(
                started.elapsed() >= Duration::from_millis(400),
                "held for the grace"
            );
            assert_eq!(status, 503);
            assert_eq!(headers["retry-after"], "1");
            assert_eq!(headers["connection"], "close");
            let error: Value = serde_json::from_slice(&body).unwrap();
            let error = error["error"].as_str().unwrap();
            assert!(
                error.contains("stopped before a pod of ns/svc was ready"),
                "{error}"
            );
        }
    });
    drained.join().unwrap();
}

#[test]
fn a_drain_forwards_what_it_holds_when_the_backend_is_ready_within_its_grace() {
    let scratch = Scratch::new("drain-ready");
    let backend_port = free_port();
    let activator = Arc::new(activator(&scratch, backend_port, None, json!({})));
    let runtime = client_runtime();
    let calls = held_calls(&runtime, &activator, 2);
    let started = Instant::now();
    let drained = drain(&activator, Duration::from_secs(20));
    runtime.block_on(async {
        listener_closed(activator.http_port()).await;
        let _backend = Backend::start(backend_port).await;
        for call in calls {
            assert_eq!(call.await.unwrap().0, 200);
        }
    });
    drained.join().unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the drain ended with nothing left: {took:?}"
    );
}

#[test]
fn a_request_for_no_route_is_404_and_the_activator_answers_its_own_routes() {
    let scratch = Scratch::new("own");
    let backend_port = free_port();
    let activator = activator(&scratch, backend_port, None, json!({"maxRequestBytes": 16}));
    let port = activator.http_port();
    client_runtime().block_on(async {
        let (status, headers, body) =
            call(port, "POST", "/v2/models/x/infer", "other.ns", b"{}").await;
        assert_eq!(
            (status.as_u16(), &headers["content-type"]),
            (404, &"application/json".parse().unwrap())
        );
        let error: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            error,
            json!({"error": "the activator has no route for host \"other.ns\" or model \"x\""})
        );
        assert_eq!(
            metric(port, "kubeinfer_activator_unrouted_requests_total", "").await,
            Some(1.0)
        );
        // By its model alone (an address, not a name).
        let by_model = call(port, "POST", "/v2/models/m/infer", "10.1.2.3", &[b'x'; 17]).await;
        assert_eq!(
            by_model.0, 413,
            "routed by its model, then over maxRequestBytes"
        );
        assert_eq!(counted(port, "refused_body").await, Some(1.0));
        let (status, _, body) = call(port, "GET", "/v2/health/ready", "127.0.0.1", b"").await;
        assert_eq!(
            (
                status.as_u16(),
                serde_json::from_slice::<Value>(&body).unwrap()
            ),
            (200, json!({"ready": true}))
        );
        let (status, _, body) = call(port, "GET", "/v2/activator", "127.0.0.1", b"").await;
        assert_eq!(status, 200);
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({"routes": [{
                "namespace": "ns", "service": "svc", "models": ["m"], "held": 0,
                "backendReady": false, "oldestHeldSeconds": null,
            }]})
        );
        // The route's own name: its health is the backend's, forwarded.
        let _backend = Backend::start(backend_port).await;
        let (status, _, body) = call(port, "GET", "/v2/health/ready", "svc.ns", b"").await;
        assert_eq!(
            (status.as_u16(), body.as_ref()),
            (200, b"{\"ready\":true}".as_ref())
        );
    });
}

#[test]
fn a_model_two_namespaces_serve_sent_to_an_address_is_404_naming_both() {
    let scratch = Scratch::new("ambiguous");
    let routes = scratch.path("routes.json");
    let mut other = super::route(free_port(), None);
    other["namespace"] = json!("other");
    super::write_routes(&routes, &[super::route(free_port(), None), other]);
    let changes = json!({"holdTimeoutSeconds": 0.2});
    let activator = Activator::start(super::options(&routes, changes)).unwrap();
    let port = activator.http_port();
    client_runtime().block_on(async {
        let (status, _, body) = call(port, "POST", "/v2/models/m/infer", "10.0.0.1", b"{}").await;
        assert_eq!(status, 404);
        let error: Value = serde_json::from_slice(&body).unwrap();
        let error = error["error"].as_str().unwrap();
        assert!(
            error.contains("more than one namespace (ns, other)"),
            "{error}"
        );
        // Its Service's name says which.
        let by_name = call(port, "GET", "/v2/models/m", "svc.other", b"").await;
        assert_eq!(
            by_name.0, 503,
            "held for other/svc, whose backend never starts"
        );
    });
}

/// A backend that answers its readiness and drops every other request unanswered.
async fn dropping_backend(port: u16) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = vec![0u8; 4096];
            let read = stream.read(&mut head).await.unwrap_or(0);
            if head[..read].starts_with(b"GET /v2/health/ready ") {
                let ready = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                let _ = stream.write_all(ready.as_bytes()).await;
            }
        }
    });
}

#[test]
fn a_backend_that_fails_a_forwarded_request_is_answered_502() {
    let scratch = Scratch::new("502");
    let backend_port = free_port();
    let activator = activator(&scratch, backend_port, None, json!({}));
    let port = activator.http_port();
    client_runtime().block_on(async {
        dropping_backend(backend_port).await;
        let (status, headers, body) = infer(port, 0).await;
        assert_eq!(status, 502);
        assert_eq!(headers["content-type"], "application/json");
        let error: Value = serde_json::from_slice(&body).unwrap();
        let error = error["error"].as_str().unwrap();
        assert!(
            error.starts_with("the backend failed the request: "),
            "{error}"
        );
        assert_eq!(counted(port, "backend_error").await, Some(1.0));
    });
}

/// A backend ready to its readiness probe that refuses with 503 and Retry-After (a pod
/// draining as it leaves, still sent to) while `refusing` is above 0, counting it down;
/// with a bare 503 (no Retry-After: its own failure) while `failing` is; and answers 200
/// otherwise.
async fn refusing_backend(port: u16, refusing: Arc<AtomicUsize>, failing: Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = vec![0u8; 4096];
            let read = stream.read(&mut head).await.unwrap_or(0);
            let probe = head[..read].starts_with(b"GET /v2/health/ready ");
            let taken = |count: &AtomicUsize| {
                (count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)))
                    .is_ok()
            };
            let answer = if probe {
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            } else if taken(&refusing) {
                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 2\r\n\
                 Connection: close\r\n\r\n{}"
            } else if taken(&failing) {
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
            } else {
                "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{\"ok\":true}"
            };
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
}

#[test]
fn a_request_a_leaving_pod_refuses_waits_for_one_that_admits_it_held_or_not() {
    let scratch = Scratch::new("leaving");
    let backend_port = free_port();
    let activator = activator(&scratch, backend_port, None, json!({}));
    let port = activator.http_port();
    client_runtime().block_on(async {
        let refusing = Arc::new(AtomicUsize::new(0));
        let failing = Arc::new(AtomicUsize::new(0));
        refusing_backend(backend_port, refusing.clone(), failing.clone()).await;
        // Held (no backend known ready yet): refused twice, then answered.
        refusing.store(2, Ordering::SeqCst);
        let (status, _, body) = infer(port, 0).await;
        assert_eq!(status, 200, "{body:?}");
        assert_eq!(&body[..], b"{\"ok\":true}");
        assert_eq!(refusing.load(Ordering::SeqCst), 0, "both refusals were met");
        // Sent straight (the backend known ready), refused at admission: held, sent again.
        refusing.store(1, Ordering::SeqCst);
        let (status, _, body) = infer(port, 1).await;
        assert_eq!(status, 200, "{body:?}");
        assert_eq!(refusing.load(Ordering::SeqCst), 0);
        // A 503 that does not say to retry is the backend's answer: never sent twice.
        failing.store(1, Ordering::SeqCst);
        let (status, headers, _) = infer(port, 2).await;
        assert_eq!(status, 503);
        assert!(
            !headers.contains_key("retry-after"),
            "the backend's own answer"
        );
        assert_eq!(counted(port, "forwarded").await, Some(3.0));
    });
}
