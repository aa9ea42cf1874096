//! The system shared-memory extension over real HTTP on 127.0.0.1: regions of real
//! `/dev/shm` objects registered, used by a Rust engine's requests, listed and
//! unregistered.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

use dataplane_core::batching::BatchShape;
use dataplane_core::error::ApiError;
use dataplane_core::tensor::{DataType, Tensor, TensorData, TensorSpec};

use crate::engine::{Engine, InputBuffer, RunError, Slot};
use crate::shm::tests::ShmObject;
use crate::{Server, ServerOptions};

/// Adds one to `x` (FP32, [-1, 4]) into `y`, taking `delay` a batch.
struct AddOne {
    specs: [Vec<TensorSpec>; 2],
    delay: Duration,
}

struct AddOneSlot {
    delay: Duration,
}

fn spec(name: &str) -> Vec<TensorSpec> {
    vec![TensorSpec {
        name: name.into(),
        datatype: DataType::F32,
        shape: vec![-1, 4],
        axis_names: vec![],
        min_item_shape: None,
        max_item_shape: None,
    }]
}

impl Engine for AddOne {
    fn name(&self) -> &str {
        "add"
    }
    fn version(&self) -> &str {
        "1"
    }
    fn inputs(&self) -> &[TensorSpec] {
        &self.specs[0]
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.specs[1]
    }
    fn max_batch_size(&self) -> usize {
        8
    }
    fn create_slot(&self) -> Result<Box<dyn Slot>, String> {
        Ok(Box::new(AddOneSlot { delay: self.delay }))
    }
}

impl Slot for AddOneSlot {
    fn run(
        &mut self,
        rows: usize,
        _shape: Option<&BatchShape>,
        fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
    ) -> Result<Vec<Tensor>, RunError> {
        let mut buffer = vec![0u8; rows * 16];
        fill(&mut [InputBuffer::Fixed(&mut buffer)]).map_err(RunError::Fill)?;
        std::thread::sleep(self.delay);
        Ok(vec![Tensor {
            name: "y".into(),
            datatype: DataType::F32,
            shape: vec![rows, 4],
            data: TensorData::Raw(Bytes::from(floats(&read_floats(&buffer), 1.0))),
        }])
    }
}

fn floats(values: &[f32], plus: f32) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| (v + plus).to_le_bytes())
        .collect()
}

fn read_floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn options() -> ServerOptions {
    serde_json::from_value(json!({
        "host": "127.0.0.1",
        "httpPort": 0,
        "grpcPort": null,
        "batching": {
            "policy": "Static",
            "maxBatchSize": 8,
            "maxQueueDelayMicroseconds": 1000,
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

fn serve(delay: Duration) -> Server {
    let engine = AddOne {
        specs: [spec("x"), spec("y")],
        delay,
    };
    Server::start(options(), Arc::new(engine)).expect("the server starts")
}

fn client() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// One request over a fresh connection: status and body.
async fn call(port: u16, method: &str, path: &str, body: Vec<u8>) -> (StatusCode, Bytes) {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

async fn call_json(port: u16, method: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let body = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(&body).unwrap()
    };
    let (status, bytes) = call(port, method, path, body).await;
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("a JSON body")
    };
    (status, value)
}

async fn register(
    port: u16,
    name: &str,
    key: &str,
    offset: usize,
    byte_size: usize,
) -> (StatusCode, Value) {
    let path = format!("/v2/systemsharedmemory/region/{name}/register");
    let body = json!({"key": key, "offset": offset, "byte_size": byte_size});
    call_json(port, "POST", &path, body).await
}

/// An infer request of one row of `x` at `input` and `y` asked for at `output` (region,
/// offset, byte size).
fn shm_infer(input: (&str, usize, usize), output: (&str, usize, usize)) -> Value {
    json!({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {
            "shared_memory_region": input.0,
            "shared_memory_offset": input.1,
            "shared_memory_byte_size": input.2}}],
        "outputs": [{"name": "y", "parameters": {
            "shared_memory_region": output.0,
            "shared_memory_offset": output.1,
            "shared_memory_byte_size": output.2}}]
    })
}

const INFER: &str = "/v2/models/add/infer";

#[test]
fn an_input_read_from_a_region_answers_into_another_without_data() {
    let input = ShmObject::with(&[vec![0u8; 8], floats(&[1.0, 2.0, 3.0, 4.0], 0.0)].concat());
    let output = ShmObject::with(&[0u8; 32]);
    let server = serve(Duration::ZERO);
    let port = server.http_port();
    client().block_on(async {
        assert_eq!(
            register(port, "in", &input.key, 0, 24).await.0,
            StatusCode::OK
        );
        assert_eq!(
            register(port, "out", &output.key, 8, 24).await.0,
            StatusCode::OK
        );
        let (status, body) = call_json(
            port,
            "POST",
            INFER,
            shm_infer(("in", 8, 16), ("out", 4, 20)),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body["outputs"],
            json!([{"name": "y", "datatype": "FP32", "shape": [1, 4], "parameters": {
                "shared_memory_region": "out",
                "shared_memory_byte_size": 16,
                "shared_memory_offset": 4,
                "binary_data_size": 0}}])
        );
    });
    // The region starts 8 bytes into its object, the output 4 bytes into the region.
    assert_eq!(
        read_floats(&output.contents()[12..28]),
        [2.0, 3.0, 4.0, 5.0]
    );
    assert_eq!(&output.contents()[..12], &[0u8; 12]);
}

#[test]
fn regions_are_listed_registered_once_and_unregistered_one_or_all() {
    let object = ShmObject::with(&[0u8; 64]);
    let server = serve(Duration::ZERO);
    let port = server.http_port();
    client().block_on(async {
        let status_all = "/v2/systemsharedmemory/status";
        assert_eq!(
            call_json(port, "GET", status_all, Value::Null).await,
            (StatusCode::OK, json!([]))
        );
        let (status, body) = register(port, "a", &object.key, 16, 32).await;
        assert_eq!((status, body), (StatusCode::OK, Value::Null));
        let (status, body) = register(port, "a", &object.key, 0, 8).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            body,
            json!({"error": "shared memory region 'a' already in manager"})
        );
        assert_eq!(
            register(port, "b", &object.key, 0, 64).await.0,
            StatusCode::OK
        );
        let a = json!({"name": "a", "key": object.key, "offset": 16, "byte_size": 32});
        let b = json!({"name": "b", "key": object.key, "offset": 0, "byte_size": 64});
        assert_eq!(
            call_json(port, "GET", status_all, Value::Null).await.1,
            json!([a, b])
        );
        let status_a = "/v2/systemsharedmemory/region/a/status";
        assert_eq!(
            call_json(port, "GET", status_a, Value::Null).await.1,
            json!([a])
        );
        let unregister_a = "/v2/systemsharedmemory/region/a/unregister";
        assert_eq!(
            call_json(port, "POST", unregister_a, Value::Null).await.0,
            StatusCode::OK
        );
        let (status, body) = call_json(port, "GET", status_a, Value::Null).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            body,
            json!({"error": "Unable to find system shared memory region: 'a'"})
        );
        let unregister_all = "/v2/systemsharedmemory/unregister";
        assert_eq!(
            call_json(port, "POST", unregister_all, Value::Null).await.0,
            StatusCode::OK
        );
        assert_eq!(
            call_json(port, "GET", status_all, Value::Null).await.1,
            json!([])
        );
        let (_, metadata) = call_json(port, "GET", "/v2", Value::Null).await;
        assert_eq!(
            metadata["extensions"],
            json!(["binary_tensor_data", "system_shared_memory"])
        );
    });
}

#[test]
fn a_bad_registration_is_a_400_naming_what_is_wrong() {
    let object = ShmObject::with(&[0u8; 16]);
    let server = serve(Duration::ZERO);
    let port = server.http_port();
    client().block_on(async {
        let path = "/v2/systemsharedmemory/region/r/register";
        for body in [
            json!({"offset": 0, "byte_size": 8}),
            json!({"key": object.key, "offset": -1, "byte_size": 8}),
            json!([1]),
        ] {
            let (status, answer) = call_json(port, "POST", path, body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert!(
                answer["error"]
                    .as_str()
                    .unwrap()
                    .starts_with("a register request is a JSON object"),
                "{answer}"
            );
        }
        let (status, answer) = call(port, "POST", path, b"{not json".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer:?}");
        let (status, answer) = register(port, "r", &object.key, 8, 16).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            answer["error"].as_str().unwrap().contains("invalid args"),
            "{answer}"
        );
        let (status, answer) = register(port, "r", "/kubeinfer-test-missing", 0, 8).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .starts_with("Unable to open shared memory region: '/kubeinfer-test-missing'"),
            "{answer}"
        );
        let (status, _) = call_json(port, "GET", path, Value::Null).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let (status, _) =
            call_json(port, "POST", "/v2/systemsharedmemory/register", Value::Null).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            call_json(port, "GET", "/v2/systemsharedmemory/status", Value::Null)
                .await
                .1,
            json!([])
        );
    });
}

#[test]
fn a_place_outside_its_region_or_of_another_size_is_a_400_and_writes_nothing() {
    let object = ShmObject::with(&[0u8; 32]);
    let server = serve(Duration::ZERO);
    let port = server.http_port();
    client().block_on(async {
        assert_eq!(register(port, "r", &object.key, 0, 32).await.0, StatusCode::OK);
        let cases = [
            (shm_infer(("r", 24, 16), ("r", 0, 16)), "Invalid offset + byte size for shared memory region: 'r' (offset 24 + byte size 16 is past its 32 bytes)"),
            (shm_infer(("r", 0, 16), ("r", 20, 16)), "Invalid offset + byte size for shared memory region: 'r' (offset 20 + byte size 16 is past its 32 bytes)"),
            (shm_infer(("none", 0, 16), ("r", 0, 16)), "Unable to find shared memory region: 'none'"),
            (shm_infer(("r", 0, 16), ("none", 0, 16)), "Unable to find shared memory region: 'none'"),
            (shm_infer(("r", 0, 12), ("r", 16, 16)), "input 'x': shared_memory_byte_size 12 does not match shape [1, 4] of FP32 (16 bytes)"),
            (shm_infer(("r", 0, 16), ("r", 16, 8)), "shared memory size specified with the request for output 'y' (8 bytes) should be at least 16 bytes to hold the results"),
        ];
        for (request, expected) in cases {
            let (status, body) = call_json(port, "POST", INFER, request).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(body, json!({"error": expected}));
        }
    });
    assert_eq!(
        &object.contents()[16..],
        &[0u8; 16],
        "no output written by a refused request"
    );
}

#[test]
fn unregistering_a_region_in_use_lets_its_requests_finish() {
    let input = ShmObject::with(&floats(&[1.0, 2.0, 3.0, 4.0], 0.0));
    let output = ShmObject::with(&[0u8; 16]);
    let server = serve(Duration::from_millis(300));
    let port = server.http_port();
    client().block_on(async {
        assert_eq!(
            register(port, "in", &input.key, 0, 16).await.0,
            StatusCode::OK
        );
        assert_eq!(
            register(port, "out", &output.key, 0, 16).await.0,
            StatusCode::OK
        );
        let request = shm_infer(("in", 0, 16), ("out", 0, 16));
        let infer = tokio::spawn(async move { call_json(port, "POST", INFER, request).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let unregister_all = "/v2/systemsharedmemory/unregister";
        assert_eq!(
            call_json(port, "POST", unregister_all, Value::Null).await.0,
            StatusCode::OK
        );
        assert_eq!(
            call_json(port, "GET", "/v2/systemsharedmemory/status", Value::Null)
                .await
                .1,
            json!([])
        );
        let (status, body) = infer.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, _) = call_json(
            port,
            "POST",
            INFER,
            shm_infer(("in", 0, 16), ("out", 0, 16)),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    });
    assert_eq!(read_floats(&output.contents()), [2.0, 3.0, 4.0, 5.0]);
}
