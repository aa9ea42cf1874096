use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use super::{Admin, AdminAnswer};
use crate::server::tests::{call, client, get_json, infer_body, serve};

/// Answers every admin route with its method and path, and records the calls.
#[derive(Default)]
struct Echo {
    calls: Mutex<Vec<(String, String)>>,
}

impl Admin for Echo {
    fn answer(&self, method: &str, path: &str) -> AdminAnswer {
        self.calls
            .lock()
            .unwrap()
            .push((method.to_string(), path.to_string()));
        AdminAnswer {
            status: 202,
            headers: vec![("X-Route".into(), path.into())],
            body: serde_json::to_vec(&json!({"method": method, "path": path})).unwrap(),
        }
    }
}

#[test]
fn the_admin_routes_are_answered_by_the_admin_with_its_status_headers_and_body() {
    let (server, _) = serve(0, Duration::ZERO);
    let echo = Arc::new(Echo::default());
    server.set_admin(echo.clone()).unwrap();
    let port = server.http_port();
    let runtime = client();
    let (status, headers, body) = runtime.block_on(call(port, "POST", "/v2/known-answers", b""));
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(headers["x-route"], "/v2/known-answers");
    assert_eq!(headers["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body, json!({"method": "POST", "path": "/v2/known-answers"}));
    for path in ["/v2/shadow", "/v2/quality", "/v2/quality/exemplars"] {
        let (status, _) = runtime.block_on(get_json(port, path));
        assert_eq!(status, StatusCode::ACCEPTED, "{path}");
    }
    assert_eq!(echo.calls.lock().unwrap().len(), 4);
    server.shutdown();
}

#[test]
fn a_method_an_admin_route_does_not_take_is_405_and_never_reaches_the_admin() {
    let (server, _) = serve(0, Duration::ZERO);
    let echo = Arc::new(Echo::default());
    server.set_admin(echo.clone()).unwrap();
    let (status, _, body) = client().block_on(call(server.http_port(), "POST", "/v2/shadow", b""));
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(&body[..], br#"{"error":"Method Not Allowed"}"#);
    assert!(echo.calls.lock().unwrap().is_empty());
    server.shutdown();
}

#[test]
fn without_an_admin_its_routes_are_404_as_routes_the_server_does_not_have() {
    let (server, _) = serve(0, Duration::ZERO);
    let (status, body) = client().block_on(get_json(server.http_port(), "/v2/known-answers"));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "no route GET /v2/known-answers");
    server.shutdown();
}

#[test]
fn a_model_held_not_ready_refuses_infer_with_503_saying_why() {
    let (server, runs) = serve(0, Duration::ZERO);
    let reason = "the engine failed its known-answer check: probe 3 of output 'y' is off";
    server.hold(false, Some(reason.into()));
    let body = infer_body(&[[1.0, 2.0]]);
    let (status, headers, answer) = client().block_on(call(
        server.http_port(),
        "POST",
        "/v2/models/double/infer",
        &body,
    ));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key("retry-after"));
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["error"], reason);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);
    server.shutdown();
}

#[test]
fn the_server_is_idle_only_while_nothing_is_queued_or_running() {
    let (server, _) = serve(0, Duration::from_millis(300));
    assert!(server.idle());
    let port = server.http_port();
    let runtime = client();
    let running = runtime.spawn(async move {
        call(
            port,
            "POST",
            "/v2/models/double/infer",
            &infer_body(&[[1.0, 2.0]]),
        )
        .await
    });
    let busy_seen = runtime.block_on(async {
        for _ in 0..100 {
            if !server.idle() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    });
    assert!(
        busy_seen,
        "the server never said it was busy while a batch ran"
    );
    let (status, _, _) = runtime.block_on(running).unwrap();
    assert_eq!(status, StatusCode::OK);
    // The answer goes out before the slot's thread reports the batch done to the driver:
    // idle again soon after, not necessarily as the answer arrives.
    let idle_again = runtime.block_on(async {
        for _ in 0..500 {
            if server.idle() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    });
    assert!(
        idle_again,
        "the server stayed busy after its batch was answered"
    );
    server.shutdown();
}
