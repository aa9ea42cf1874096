//! The server over real HTTP on 127.0.0.1: a Rust engine that doubles an FP32 input (and
//! one whose output misses the batch's rows, issue 40), talked to with hyper's client.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use dataplane_core::batching::BatchShape;
use dataplane_core::error::ApiError;
use dataplane_core::tensor::{DataType, Tensor, TensorData, TensorSpec};

use crate::engine::{Engine, InputBuffer, RunError, Slot};
use crate::{Server, ServerOptions};

/// Doubles `x` (FP32, [-1, 2]) into `y`; `short_rows` makes its output that many rows
/// short of the batch; counts its runs.
struct Doubler {
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    runs: Arc<AtomicUsize>,
    short_rows: usize,
    delay: Duration,
}

struct DoublerSlot {
    runs: Arc<AtomicUsize>,
    short_rows: usize,
    delay: Duration,
}

fn spec(name: &str) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        datatype: DataType::F32,
        shape: vec![-1, 2],
        axis_names: vec![],
        min_item_shape: None,
        max_item_shape: None,
    }
}

impl Engine for Doubler {
    fn name(&self) -> &str {
        "double"
    }
    fn version(&self) -> &str {
        "1"
    }
    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }
    fn max_batch_size(&self) -> usize {
        8
    }
    fn create_slot(&self) -> Result<Box<dyn Slot>, String> {
        Ok(Box::new(DoublerSlot {
            runs: self.runs.clone(),
            short_rows: self.short_rows,
            delay: self.delay,
        }))
    }
}

impl Slot for DoublerSlot {
    fn run(
        &mut self,
        rows: usize,
        _shape: Option<&BatchShape>,
        fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
    ) -> Result<Vec<Tensor>, RunError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let mut buffer = vec![0u8; rows * 2 * 4];
        fill(&mut [InputBuffer::Fixed(&mut buffer)]).map_err(RunError::Fill)?;
        std::thread::sleep(self.delay);
        let out_rows = rows - self.short_rows;
        let doubled: Vec<u8> = buffer[..out_rows * 8]
            .chunks_exact(4)
            .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * 2.0).to_le_bytes())
            .collect();
        Ok(vec![Tensor {
            name: "y".into(),
            datatype: DataType::F32,
            shape: vec![out_rows, 2],
            data: TensorData::Raw(Bytes::from(doubled)),
        }])
    }
}

pub(crate) fn options() -> ServerOptions {
    serde_json::from_value(json!({
        "host": "127.0.0.1",
        "httpPort": 0,
        "grpcPort": null,
        "batching": {
            "policy": "Static",
            "maxBatchSize": 8,
            "maxQueueDelayMicroseconds": 20000,
            "preferredBatchSizes": [],
            "executionSlots": 1,
            "maxQueueSize": 64,
            "defaultTimeoutMilliseconds": 5000,
            "shapeBatching": "EqualShapes",
            "shapeBuckets": [],
            "sloMarginPercent": 10,
            "sloP99LatencyMilliseconds": null,
            "priorityLevels": 1,
            "defaultPriorityLevel": 1
        },
        "maxRequestBytes": 4096,
        "headerReadTimeoutSeconds": 5.0,
        "bodyReadTimeoutSeconds": 1.0,
        "engineStuckLivenessSeconds": 30.0,
        "drainGracePeriodSeconds": 2.0
    }))
    .expect("the options parse")
}

/// A started server and the count of its engine's runs.
pub(crate) fn serve(short_rows: usize, delay: Duration) -> (Server, Arc<AtomicUsize>) {
    serve_with(short_rows, delay, options())
}

pub(crate) fn serve_with(
    short_rows: usize,
    delay: Duration,
    options: ServerOptions,
) -> (Server, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = Doubler {
        inputs: vec![spec("x")],
        outputs: vec![spec("y")],
        runs: runs.clone(),
        short_rows,
        delay,
    };
    let server = Server::start(options, Arc::new(engine)).expect("the server starts");
    (server, runs)
}

/// The client's own runtime (the server has its own; shutdown blocks, so it runs outside).
pub(crate) fn client() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// One request over a fresh connection: status, headers, body.
pub(crate) async fn call(
    port: u16,
    method: &str,
    path: &str,
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
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::copy_from_slice(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, bytes)
}

/// An infer request of these rows, as a task may own it.
async fn infer_owned(port: u16, rows: Vec<[f32; 2]>) -> (StatusCode, hyper::HeaderMap, Bytes) {
    call(port, "POST", "/v2/models/double/infer", &infer_body(&rows)).await
}

pub(crate) async fn get_json(port: u16, path: &str) -> (StatusCode, Value) {
    let (status, _, body) = call(port, "GET", path, b"").await;
    (status, serde_json::from_slice(&body).expect("a JSON body"))
}

pub(crate) fn infer_body(rows: &[[f32; 2]]) -> Vec<u8> {
    let data: Vec<f32> = rows.iter().flatten().copied().collect();
    serde_json::to_vec(&json!({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [rows.len(), 2], "data": data}]
    }))
    .unwrap()
}

/// Writes a request head by hand (no body follows) and reads the answer's status line
/// and body: what a server answers before reading the body it was promised.
async fn head_only(port: u16, head: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            let n = stream.read(&mut buffer).await.unwrap();
            answer.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&answer).to_string();
            if n == 0 || text.contains("\r\n\r\n") && text.trim_end().ends_with('}') {
                return text;
            }
        }
    })
    .await
    .expect("answered without the body");
    let status = read[9..12].parse().unwrap();
    let body = read.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[test]
fn health_and_metadata_answer_as_the_python_runtime_does() {
    let (server, _) = serve(0, Duration::ZERO);
    let port = server.http_port();
    client().block_on(async {
        assert_eq!(
            get_json(port, "/v2/health/live").await,
            (StatusCode::OK, json!({"live": true}))
        );
        assert_eq!(
            get_json(port, "/v2/health/ready").await,
            (StatusCode::OK, json!({"ready": true}))
        );
        let (status, meta) = get_json(port, "/v2").await;
        assert_eq!(
            (status, meta["name"].clone()),
            (StatusCode::OK, json!("kubeinfer"))
        );
        let (status, model) = get_json(port, "/v2/models/double/versions/1").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(model["versions"], json!(["1"]));
        assert_eq!(
            model["inputs"],
            json!([{"name": "x", "datatype": "FP32", "shape": [-1, 2]}])
        );
        assert_eq!(model["parameters"], json!({"max_batch_size": 8}));
        let (_, config) = get_json(port, "/v2/models/double/config").await;
        assert_eq!(
            config["input"],
            json!([{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}])
        );
        assert_eq!(
            get_json(port, "/v2/models/double/ready").await,
            (StatusCode::OK, json!({"name": "double", "ready": true}))
        );
        assert_eq!(
            get_json(port, "/v2/models/other").await,
            (
                StatusCode::NOT_FOUND,
                json!({"error": "model 'other' is not served here"})
            )
        );
        assert_eq!(
            get_json(port, "/v2/models/double/versions/7").await,
            (
                StatusCode::NOT_FOUND,
                json!({"error": "model 'double' has no version '7' (served: '1')"})
            )
        );
        assert_eq!(
            get_json(port, "/nowhere").await,
            (
                StatusCode::NOT_FOUND,
                json!({"error": "no route GET /nowhere"})
            )
        );
    });
    server.set_ready(false);
    client().block_on(async {
        assert_eq!(
            get_json(port, "/v2/health/ready").await,
            (StatusCode::SERVICE_UNAVAILABLE, json!({"ready": false}))
        );
        let (status, headers, _) = call(
            port,
            "POST",
            "/v2/models/double/infer",
            &infer_body(&[[1.0, 2.0]]),
        )
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers["retry-after"], "1");
    });
    server.shutdown();
}

#[test]
fn an_infer_request_round_trips_through_the_engine() {
    let (server, runs) = serve(0, Duration::ZERO);
    let port = server.http_port();
    let (status, headers, body) = client().block_on(call(
        port,
        "POST",
        "/v2/models/double/infer",
        &infer_body(&[[1.0, 2.0], [3.0, 4.5]]),
    ));
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(
        headers["server-timing"]
            .to_str()
            .unwrap()
            .starts_with("infer;dur=")
    );
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["model_name"], "double");
    assert_eq!(answer["outputs"][0]["name"], "y");
    assert_eq!(answer["outputs"][0]["shape"], json!([2, 2]));
    assert_eq!(answer["outputs"][0]["data"], json!([2.0, 4.0, 6.0, 9.0]));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    server.shutdown();
}

#[test]
fn concurrent_requests_are_batched_together() {
    let (server, runs) = serve(0, Duration::from_millis(5));
    let port = server.http_port();
    let answers = client().block_on(async {
        let calls = (0..8).map(|i| {
            let body = infer_body(&[[i as f32, 1.0]]);
            tokio::spawn(async move { call(port, "POST", "/v2/models/double/infer", &body).await })
        });
        let mut answers = Vec::new();
        for call in calls.collect::<Vec<_>>() {
            answers.push(call.await.unwrap());
        }
        answers
    });
    for (i, (status, _, body)) in answers.iter().enumerate() {
        assert_eq!(*status, StatusCode::OK);
        let answer: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(
            answer["outputs"][0]["data"],
            json!([2.0 * i as f64, 2.0]),
            "request {i}"
        );
    }
    let runs = runs.load(Ordering::SeqCst);
    assert!(runs < 8, "8 requests took {runs} engine runs");
    server.shutdown();
}

#[test]
fn an_unknown_model_is_refused_before_its_body_is_read() {
    let (server, runs) = serve(0, Duration::ZERO);
    let head = "POST /v2/models/other/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
    let (status, body) = client().block_on(head_only(server.http_port(), head));
    assert_eq!(status, 404);
    assert_eq!(body, r#"{"error":"model 'other' is not served here"}"#);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    server.shutdown();
}

#[test]
fn a_body_over_the_limit_is_refused_with_413() {
    let (server, _) = serve(0, Duration::ZERO);
    let port = server.http_port();
    let head = "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n";
    let (status, body) = client().block_on(head_only(port, head));
    assert_eq!(status, 413);
    assert!(
        body.contains(
            "the request body (5000 bytes) is over the limit of 4096 bytes (maxRequestBytes"
        ),
        "{body}"
    );
    // Chunked: refused as soon as the body passes the limit.
    let chunk = format!("1400\r\n{}\r\n", "x".repeat(0x1400));
    let head = format!(
        "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}"
    );
    let (status, body) = client().block_on(head_only(port, &head));
    assert_eq!(status, 413);
    assert!(
        body.contains("the request body is over the limit of 4096 bytes"),
        "{body}"
    );
    server.shutdown();
}

#[test]
fn malformed_json_is_a_400_with_a_json_message() {
    let (server, runs) = serve(0, Duration::ZERO);
    let (status, _, body) = client().block_on(call(
        server.http_port(),
        "POST",
        "/v2/models/double/infer",
        b"{\"inputs\": [",
    ));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let answer: Value = serde_json::from_slice(&body).expect("a JSON error");
    assert!(
        answer["error"].as_str().is_some_and(|m| !m.is_empty()),
        "{answer}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    server.shutdown();
}

#[test]
fn a_batch_whose_output_misses_rows_fails_every_request_with_500() {
    let (server, runs) = serve(1, Duration::ZERO);
    let (status, _, body) = client().block_on(call(
        server.http_port(),
        "POST",
        "/v2/models/double/infer",
        &infer_body(&[[1.0, 2.0], [3.0, 4.0]]),
    ));
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        answer["error"],
        "model 'double' gave output 'y' 1 rows for a batch of 2 rows: its outputs do not line up \
         with the requests' rows, so none is answered from them"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    server.shutdown();
}

#[test]
fn a_stalled_body_is_answered_408_and_its_connection_closed() {
    let (server, runs) = serve(0, Duration::ZERO);
    let head =
        "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"in";
    let started = std::time::Instant::now();
    let (status, body) = client().block_on(head_only(server.http_port(), head));
    assert_eq!(status, 408);
    assert!(
        body.contains("the request body stalled (4 bytes had come; a part must come within 1 s"),
        "{body}"
    );
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    server.shutdown();
}

#[test]
fn a_request_whose_client_left_while_queued_never_runs() {
    let (server, runs) = serve(0, Duration::from_millis(300));
    let port = server.http_port();
    client().block_on(async {
        let first = tokio::spawn(infer_owned(port, vec![[1.0, 1.0]]));
        tokio::time::sleep(Duration::from_millis(100)).await; // the first is on the slot
        let body = infer_body(&[[2.0, 2.0]]);
        let head = format!(
            "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&body).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await; // queued behind the first
        drop(stream);
        assert_eq!(first.await.unwrap().0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(400)).await;
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the abandoned request ran");
    server.shutdown();
}

#[test]
fn shutdown_answers_the_requests_it_accepted_then_refuses() {
    let (server, _) = serve(0, Duration::from_millis(200));
    let port = server.http_port();
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let in_flight = client.spawn(infer_owned(port, vec![[1.0, 1.0]]));
    std::thread::sleep(Duration::from_millis(50));
    server.shutdown();
    let (status, headers, _) = client.block_on(in_flight).unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["connection"], "close");
    let refused = client.block_on(TcpStream::connect(("127.0.0.1", port)));
    assert!(refused.is_err(), "still listening after shutdown");
}

#[test]
fn a_request_whose_timeout_passes_in_the_queue_is_answered_504_unrun() {
    let (server, runs) = serve(0, Duration::from_millis(300));
    let port = server.http_port();
    let (status, body) = client().block_on(async {
        let first = tokio::spawn(infer_owned(port, vec![[1.0, 1.0]]));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let body = serde_json::to_vec(&json!({
            "parameters": {"timeout": 50000},
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]
        }))
        .unwrap();
        let (status, _, answer) = call(port, "POST", "/v2/models/double/infer", &body).await;
        assert_eq!(first.await.unwrap().0, StatusCode::OK);
        (status, String::from_utf8_lossy(&answer).to_string())
    });
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert!(body.contains("the request's deadline passed"), "{body}");
    assert!(body.contains("it was not executed"), "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    server.shutdown();
}

#[test]
fn a_full_queue_refuses_with_503_and_retry_after() {
    let mut options = options();
    options.batching.max_queue_size = 1;
    options.batching.max_batch_size = 1;
    let (server, _) = serve_with(0, Duration::from_millis(300), options);
    let port = server.http_port();
    let (status, headers, body) = client().block_on(async {
        let first = tokio::spawn(infer_owned(port, vec![[1.0, 1.0]]));
        tokio::time::sleep(Duration::from_millis(50)).await; // running
        let second = tokio::spawn(infer_owned(port, vec![[1.0, 1.0]]));
        tokio::time::sleep(Duration::from_millis(50)).await; // queued: the queue is full
        let third = infer_owned(port, vec![[1.0, 1.0]]).await;
        assert_eq!(first.await.unwrap().0, StatusCode::OK);
        assert_eq!(second.await.unwrap().0, StatusCode::OK);
        third
    });
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(
        body,
        r#"{"error":"the queue is full (1 requests); retry later"}"#
    );
    server.shutdown();
}

#[test]
fn an_input_the_model_does_not_take_is_a_400_naming_it() {
    let (server, runs) = serve(0, Duration::ZERO);
    let body = serde_json::to_vec(&json!({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}]
    }))
    .unwrap();
    let (status, _, answer) = client().block_on(call(
        server.http_port(),
        "POST",
        "/v2/models/double/infer",
        &body,
    ));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert!(
        answer["error"].as_str().is_some_and(|m| m.contains("'x'")),
        "{answer}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    server.shutdown();
}
