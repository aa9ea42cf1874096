//! Triton's priority levels end to end over HTTP: a request's `priority` parameter picks
//! its level (1 the most urgent; 0, or one past the levels, the default level), and a full
//! queue sheds its least urgent request for a more urgent newcomer, never one as urgent.

use std::time::Duration;

use hyper::StatusCode;
use serde_json::{Value, json};

use super::tests::{call, client, options, serve_with};

fn body(priority: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "parameters": {"priority": priority},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]
    }))
    .unwrap()
}

#[test]
fn a_full_queue_sheds_its_least_urgent_request_for_a_more_urgent_one() {
    let mut options = options();
    options.batching.max_queue_size = 1;
    options.batching.max_batch_size = 1;
    options.batching.priority_levels = 3;
    options.batching.default_priority_level = 2;
    let (server, runs) = serve_with(0, Duration::from_millis(600), options);
    let port = server.http_port();
    let answers = client().block_on(async {
        let send = |priority: u64| {
            tokio::spawn(async move {
                let (status, _, body) =
                    call(port, "POST", "/v2/models/double/infer", &body(priority)).await;
                let error: Option<String> = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_string));
                (status, error)
            })
        };
        let step = || tokio::time::sleep(Duration::from_millis(100));
        let running = send(1);
        step().await; // on the slot
        let least = send(3); // queued: the queue is full
        step().await;
        let default = send(0); // the default level (2): sheds the level-3 one
        step().await;
        let urgent = send(1); // sheds the default-level one
        step().await;
        let as_urgent = send(1); // nothing less urgent is queued: refused
        let past_the_levels = send(7); // the default level: refused too
        let mut answers = Vec::new();
        for call in [running, least, default, urgent, as_urgent, past_the_levels] {
            answers.push(call.await.unwrap());
        }
        answers
    });
    let shed = Some("the request was shed for a more urgent one; retry later".to_string());
    let full = Some("the queue is full (1 requests); retry later".to_string());
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    assert_eq!(
        answers,
        vec![
            (StatusCode::OK, None),
            (unavailable, shed.clone()),
            (unavailable, shed),
            (StatusCode::OK, None),
            (unavailable, full.clone()),
            (unavailable, full),
        ]
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
    server.shutdown();
}
