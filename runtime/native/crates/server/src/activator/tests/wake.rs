//! Wake-ups: a route with no ready backend that holds requests POSTs its namespace and
//! service to the wake URL, at most once a second while it holds them, and none once its
//! backend is ready; a wake URL nobody answers changes nothing of what is held.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Response;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::{Backend, Scratch, activator, call, client_runtime, free_port, held, until};

/// What a wake receiver was sent: each POST's arrival and JSON body.
type Wakes = Arc<Mutex<Vec<(Instant, Value)>>>;

/// A wake receiver on a loopback port: its URL and what it was sent.
async fn wake_receiver() -> (String, Wakes) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/wake", listener.local_addr().unwrap());
    let wakes: Wakes = Arc::default();
    let kept = wakes.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let kept = kept.clone();
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        let woken = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        kept.lock().unwrap().push((Instant::now(), woken));
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::new())))
                    }
                },
            );
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::spawn(connection);
        }
    });
    (url, wakes)
}

fn count(wakes: &Wakes) -> usize {
    wakes.lock().unwrap().len()
}

#[test]
fn a_route_holding_requests_wakes_at_most_once_a_second_until_its_backend_is_ready() {
    let runtime = client_runtime();
    let (url, wakes) = runtime.block_on(wake_receiver());
    let scratch = Scratch::new("wake");
    let backend_port = free_port();
    let activator = activator(&scratch, backend_port, None, json!({"wakeUrl": url}));
    let port = activator.http_port();
    runtime.block_on(async {
        let body = b"{}";
        let calls: Vec<_> = (0..3)
            .map(|_| tokio::spawn(async move { call(port, "POST", "/", "svc.ns", body).await }))
            .collect();
        until("3 requests held", || held(&activator) == 3).await;
        until("3 wake-ups", || count(&wakes) == 3).await;
        let _backend = Backend::start(backend_port).await;
        for call in calls {
            assert_eq!(call.await.unwrap().0, 200);
        }
        let sent = wakes.lock().unwrap().clone();
        for (_, woken) in &sent {
            assert_eq!(woken, &json!({"namespace": "ns", "service": "svc"}));
        }
        for pair in sent.windows(2) {
            let gap = pair[1].0 - pair[0].0;
            assert!(
                gap > Duration::from_millis(900),
                "two wake-ups {gap:?} apart"
            );
        }
        // Ready: a request goes straight through, and nobody is woken.
        let before = count(&wakes);
        assert_eq!(call(port, "POST", "/", "svc.ns", body).await.0, 200);
        assert_eq!(count(&wakes), before);
    });
}

#[test]
fn a_wake_url_nobody_answers_changes_nothing_of_what_is_held() {
    let scratch = Scratch::new("wake-nobody");
    let backend_port = free_port();
    let nobody = format!("http://127.0.0.1:{}/wake", free_port());
    let activator = activator(&scratch, backend_port, None, json!({"wakeUrl": nobody}));
    let port = activator.http_port();
    client_runtime().block_on(async {
        let held_call = tokio::spawn(call(port, "POST", "/", "svc.ns", b"{}"));
        until("the request held", || held(&activator) == 1).await;
        let _backend = Backend::start(backend_port).await;
        assert_eq!(held_call.await.unwrap().0, 200);
    });
}

#[test]
fn a_wake_url_that_is_not_http_is_refused_at_start() {
    let scratch = Scratch::new("wake-https");
    let routes = scratch.path("routes.json");
    for url in ["https://operator/wake", "operator:80/wake", "not a url"] {
        let options = super::options(&routes, json!({"wakeUrl": url}));
        let refused = crate::Activator::start(options).err().expect(url);
        assert!(refused.contains("wakeUrl"), "{url}: {refused}");
    }
}

#[test]
fn a_backend_known_ready_long_ago_is_asked_again_and_woken_before_a_request_goes() {
    let runtime = client_runtime();
    let (url, wakes) = runtime.block_on(wake_receiver());
    let scratch = Scratch::new("wake-stale");
    let backend_port = free_port();
    let changes = json!({"wakeUrl": url, "knownReadyMilliseconds": 300});
    let activator = activator(&scratch, backend_port, None, changes);
    let port = activator.http_port();
    runtime.block_on(async {
        let _backend = Backend::start(backend_port).await;
        // Not known ready: held, woken once, forwarded once the prober finds it ready.
        assert_eq!(call(port, "POST", "/", "svc.ns", b"{}").await.0, 200);
        until("the first wake-up", || count(&wakes) == 1).await;
        // Answered just now: sent straight, nobody woken.
        assert_eq!(call(port, "POST", "/", "svc.ns", b"{}").await.0, 200);
        // Past knownReadyMilliseconds since its last answer: held and woken again (at
        // zero a forward would wait for its connect timeout before being held).
        tokio::time::sleep(Duration::from_millis(1100)).await; // past the wake rate too
        assert_eq!(count(&wakes), 1, "a request sent straight wakes nobody");
        assert_eq!(call(port, "POST", "/", "svc.ns", b"{}").await.0, 200);
        until("a second wake-up", || count(&wakes) == 2).await;
    });
}
