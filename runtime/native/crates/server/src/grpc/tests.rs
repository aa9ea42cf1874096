//! The gRPC service over real HTTP/2 on 127.0.0.1, called with a tonic client generated
//! from the same proto (a Rust engine that doubles an FP32 input and tells each row the
//! batch's row count); and the committed generated module checked against the proto.

mod generated;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

use dataplane_core::batching::BatchShape;
use dataplane_core::error::ApiError;
use dataplane_core::tensor::{DataType, Tensor, TensorData, TensorSpec};

use super::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use super::inference::infer_parameter::ParameterChoice;
use super::inference::model_infer_request::InferInputTensor;
use super::inference::{
    InferParameter, InferTensorContents, ModelConfigRequest, ModelInferRequest, ModelInferResponse,
    ModelMetadataRequest, ModelReadyRequest, ServerLiveRequest, ServerMetadataRequest,
    ServerReadyRequest,
};
use crate::engine::{Engine, InputBuffer, RunError, Slot};
use crate::{Server, ServerOptions};

/// Doubles `x` (FP32, [-1, 2]) into `y`, and answers `rows` (INT32, [-1, 1]): each row the
/// row count of the batch it ran in. Counts its runs; each takes `delay`.
struct Doubler {
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    runs: Arc<AtomicUsize>,
    delay: Duration,
}

struct DoublerSlot {
    runs: Arc<AtomicUsize>,
    delay: Duration,
}

fn spec(name: &str, datatype: DataType, shape: Vec<i64>) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        datatype,
        shape,
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
    fn platform(&self) -> &str {
        "rust-test"
    }
    fn create_slot(&self) -> Result<Box<dyn Slot>, String> {
        Ok(Box::new(DoublerSlot {
            runs: self.runs.clone(),
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
        let doubled: Vec<u8> = buffer
            .chunks_exact(4)
            .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * 2.0).to_le_bytes())
            .collect();
        let batch_rows: Vec<u8> = (0..rows)
            .flat_map(|_| (rows as i32).to_le_bytes())
            .collect();
        Ok(vec![
            Tensor {
                name: "y".into(),
                datatype: DataType::F32,
                shape: vec![rows, 2],
                data: TensorData::Raw(Bytes::from(doubled)),
            },
            Tensor {
                name: "rows".into(),
                datatype: DataType::I32,
                shape: vec![rows, 1],
                data: TensorData::Raw(Bytes::from(batch_rows)),
            },
        ])
    }
}

fn options(max_queue_delay_microseconds: u64) -> ServerOptions {
    serde_json::from_value(json!({
        "host": "127.0.0.1",
        "httpPort": 0,
        "grpcPort": 0,
        "batching": {
            "policy": "Static",
            "maxBatchSize": 8,
            "maxQueueDelayMicroseconds": max_queue_delay_microseconds,
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

/// A started server (HTTP and gRPC) and the count of its engine's runs.
pub(super) fn serve(
    delay: Duration,
    max_queue_delay_microseconds: u64,
) -> (Server, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = Doubler {
        inputs: vec![spec("x", DataType::F32, vec![-1, 2])],
        outputs: vec![
            spec("y", DataType::F32, vec![-1, 2]),
            spec("rows", DataType::I32, vec![-1, 1]),
        ],
        runs: runs.clone(),
        delay,
    };
    let options = options(max_queue_delay_microseconds);
    let server = Server::start(options, Arc::new(engine)).expect("the server starts");
    (server, runs)
}

/// The client's own runtime (the server has its own; shutdown blocks, so it runs outside).
pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub(super) async fn connect(server: &Server) -> GrpcInferenceServiceClient<Channel> {
    let port = server.grpc_port().expect("a gRPC port");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .expect("the gRPC port answers");
    GrpcInferenceServiceClient::new(channel)
}

pub(super) fn floats(values: &[f32]) -> Bytes {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(super) fn read_floats(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A ModelInfer request of `rows` in raw contents.
fn raw_request(model: &str, rows: &[[f32; 2]]) -> ModelInferRequest {
    let values: Vec<f32> = rows.iter().flatten().copied().collect();
    ModelInferRequest {
        model_name: model.into(),
        id: "r1".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![rows.len() as i64, 2],
            ..InferInputTensor::default()
        }],
        raw_input_contents: vec![floats(&values)],
        ..ModelInferRequest::default()
    }
}

/// The output of this name's raw contents.
pub(super) fn raw_output<'a>(answer: &'a ModelInferResponse, name: &str) -> &'a [u8] {
    let index = answer.outputs.iter().position(|o| o.name == name).unwrap();
    &answer.raw_output_contents[index]
}

#[test]
fn health_and_metadata_answer_as_the_python_runtime_does() {
    let (server, _) = serve(Duration::ZERO, 1000);
    runtime().block_on(async {
        let mut client = connect(&server).await;
        assert!(
            client
                .server_live(ServerLiveRequest {})
                .await
                .unwrap()
                .into_inner()
                .live
        );
        assert!(
            client
                .server_ready(ServerReadyRequest {})
                .await
                .unwrap()
                .into_inner()
                .ready
        );
        let ready = ModelReadyRequest {
            name: "double".into(),
            version: String::new(),
        };
        assert!(client.model_ready(ready).await.unwrap().into_inner().ready);
        let metadata = client
            .server_metadata(ServerMetadataRequest {})
            .await
            .unwrap();
        let metadata = metadata.into_inner();
        assert_eq!(
            (metadata.name.as_str(), metadata.version.as_str()),
            ("kubeinfer", "0.1.0")
        );
        assert_eq!(
            metadata.extensions,
            crate::model::EXTENSIONS.map(String::from).to_vec()
        );
        let model = ModelMetadataRequest {
            name: "double".into(),
            version: "1".into(),
        };
        let model = client.model_metadata(model).await.unwrap().into_inner();
        assert_eq!(model.versions, vec!["1".to_string()]);
        assert_eq!(model.platform, "rust-test");
        assert_eq!(model.inputs[0].name, "x");
        assert_eq!(model.inputs[0].datatype, "FP32");
        assert_eq!(model.inputs[0].shape, vec![-1, 2]);
        assert_eq!(model.outputs[1].datatype, "INT32");
        let config = ModelConfigRequest {
            name: "double".into(),
            version: String::new(),
        };
        let config = client.model_config(config).await.unwrap().into_inner();
        let config = config.config.unwrap();
        assert_eq!(config.max_batch_size, 8);
        assert_eq!(
            config.input[0].dims,
            vec![2],
            "batched: the batch axis left out"
        );
        assert_eq!(config.input[0].data_type, 11, "TYPE_FP32");
        assert_eq!(config.output[1].data_type, 8, "TYPE_INT32");
    });
    server.shutdown();
}

#[test]
fn an_infer_request_round_trips_with_raw_contents() {
    let (server, _) = serve(Duration::ZERO, 1000);
    let answer = runtime().block_on(async {
        let mut client = connect(&server).await;
        let request = raw_request("double", &[[1.0, 2.5], [-3.0, 0.0]]);
        client.model_infer(request).await.unwrap().into_inner()
    });
    assert_eq!(
        (answer.model_name.as_str(), answer.id.as_str()),
        ("double", "r1")
    );
    assert_eq!(answer.outputs[0].name, "y");
    assert_eq!(answer.outputs[0].datatype, "FP32");
    assert_eq!(answer.outputs[0].shape, vec![2, 2]);
    assert!(
        answer.outputs[0].contents.is_none(),
        "raw by default, as Triton answers"
    );
    assert_eq!(
        read_floats(raw_output(&answer, "y")),
        vec![2.0, 5.0, -6.0, 0.0]
    );
    server.shutdown();
}

#[test]
fn a_gzip_compressed_call_is_taken() {
    let (server, _) = serve(Duration::ZERO, 1000);
    let answer = runtime().block_on(async {
        let client = connect(&server).await;
        let gzip = tonic::codec::CompressionEncoding::Gzip;
        let mut client = client.send_compressed(gzip);
        let request = raw_request("double", &[[1.0, 2.0]]);
        client.model_infer(request).await.unwrap().into_inner()
    });
    assert_eq!(read_floats(raw_output(&answer, "y")), vec![2.0, 4.0]);
    server.shutdown();
}

#[test]
fn typed_contents_are_answered_typed_when_asked() {
    let (server, _) = serve(Duration::ZERO, 1000);
    let answer = runtime().block_on(async {
        let mut client = connect(&server).await;
        let mut request = raw_request("double", &[[0.0, 0.0]]);
        request.raw_input_contents.clear();
        request.inputs[0].contents = Some(InferTensorContents {
            fp32_contents: vec![1.5, -4.0],
            ..InferTensorContents::default()
        });
        let typed = InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(false)),
        };
        request
            .parameters
            .insert("binary_data_output".into(), typed);
        client.model_infer(request).await.unwrap().into_inner()
    });
    assert!(answer.raw_output_contents.is_empty());
    let y = answer.outputs[0].contents.as_ref().unwrap();
    assert_eq!(y.fp32_contents, vec![3.0, -8.0]);
    let rows = answer.outputs[1].contents.as_ref().unwrap();
    assert_eq!(rows.int_contents, vec![1]);
    server.shutdown();
}

#[test]
fn an_unknown_model_is_not_found() {
    let (server, runs) = serve(Duration::ZERO, 1000);
    let refused = runtime().block_on(async {
        let mut client = connect(&server).await;
        client
            .model_infer(raw_request("other", &[[1.0, 1.0]]))
            .await
            .unwrap_err()
    });
    assert_eq!(refused.code(), Code::NotFound);
    assert_eq!(refused.message(), "model 'other' is not served here");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    server.shutdown();
}

#[test]
fn a_malformed_request_is_invalid_argument_with_its_message() {
    let (server, runs) = serve(Duration::ZERO, 1000);
    let (short, shaped) = runtime().block_on(async {
        let mut client = connect(&server).await;
        let mut short = raw_request("double", &[[1.0, 1.0]]);
        short.raw_input_contents[0] = floats(&[1.0]);
        let short = client.model_infer(short).await.unwrap_err();
        let mut shaped = raw_request("double", &[[1.0, 1.0]]);
        shaped.inputs[0].shape = vec![2, 1];
        let shaped = client.model_infer(shaped).await.unwrap_err();
        (short, shaped)
    });
    assert_eq!(short.code(), Code::InvalidArgument);
    assert_eq!(
        short.message(),
        "input 'x': raw_input_contents holds 4 bytes; shape [1, 2] of FP32 takes 8"
    );
    assert_eq!(shaped.code(), Code::InvalidArgument);
    assert_eq!(
        shaped.message(),
        "input 'x' has shape [2, 1], the model expects ['batch', 2]"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    server.shutdown();
}

#[test]
fn a_message_over_the_request_limit_is_resource_exhausted_naming_it() {
    let (server, _) = serve(Duration::ZERO, 1000);
    let refused = runtime().block_on(async {
        let mut client = connect(&server).await;
        // 600 rows of 8 bytes: over maxRequestBytes (4096), under twice it.
        let rows = vec![[1.0f32, 1.0]; 600];
        client
            .model_infer(raw_request("double", &rows))
            .await
            .unwrap_err()
    });
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused
            .message()
            .starts_with("the request message (4831 bytes) is over the limit of 4096 bytes"),
        "{}",
        refused.message()
    );
    server.shutdown();
}

#[test]
fn a_message_past_twice_the_limit_is_resource_exhausted_before_it_is_read() {
    let (server, _) = serve(Duration::ZERO, 1000);
    let refused = runtime().block_on(async {
        let mut client = connect(&server).await;
        let rows = vec![[1.0f32, 1.0]; 1100]; // 8800 bytes: past 2 × 4096
        client
            .model_infer(raw_request("double", &rows))
            .await
            .unwrap_err()
    });
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("the limit is: 8192 bytes"),
        "{refused:?}"
    );
    server.shutdown();
}

/// One HTTP infer request of `rows` over a fresh connection: its JSON answer.
async fn http_infer(port: u16, rows: &[[f32; 2]]) -> Value {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let data: Vec<f32> = rows.iter().flatten().copied().collect();
    let body = json!({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [rows.len(), 2], "data": data}]
    });
    let request = hyper::Request::post("/v2/models/double/infer")
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn an_http_and_a_grpc_request_share_a_batch() {
    // The first request holds the one slot; the HTTP and the gRPC request queue behind it
    // and are batched together when it frees.
    let (server, runs) = serve(Duration::from_millis(200), 1000);
    let http_port = server.http_port();
    let (http, grpc) = runtime().block_on(async {
        let mut first_client = connect(&server).await;
        let mut client = connect(&server).await;
        let first = tokio::spawn(async move {
            first_client
                .model_infer(raw_request("double", &[[0.0, 0.0]]))
                .await
        });
        tokio::time::sleep(Duration::from_millis(80)).await; // the first is on the slot
        let http = tokio::spawn(async move { http_infer(http_port, &[[1.0, 2.0]]).await });
        let grpc = client.model_infer(raw_request("double", &[[3.0, 4.0], [5.0, 6.0]]));
        let grpc = grpc.await.unwrap().into_inner();
        assert!(first.await.unwrap().is_ok());
        (http.await.unwrap(), grpc)
    });
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the first, then one batch of both"
    );
    assert_eq!(http["outputs"][0]["data"], json!([2.0, 4.0]));
    assert_eq!(
        http["outputs"][1]["data"],
        json!([3]),
        "HTTP's row ran in a batch of 3"
    );
    assert_eq!(
        read_floats(raw_output(&grpc, "y")),
        vec![6.0, 8.0, 10.0, 12.0]
    );
    let rows: Vec<i32> = raw_output(&grpc, "rows")
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(rows, vec![3, 3], "gRPC's rows ran in the same batch of 3");
    server.shutdown();
}

#[test]
fn a_call_cancelled_while_queued_never_runs() {
    let (server, runs) = serve(Duration::from_millis(300), 1000);
    runtime().block_on(async {
        let mut first_client = connect(&server).await;
        let mut second_client = connect(&server).await;
        let first = tokio::spawn(async move {
            first_client
                .model_infer(raw_request("double", &[[1.0, 1.0]]))
                .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await; // the first is on the slot
        let second = tokio::spawn(async move {
            second_client
                .model_infer(raw_request("double", &[[2.0, 2.0]]))
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await; // queued behind the first
        second.abort(); // the call is dropped: its stream reset
        assert!(first.await.unwrap().is_ok());
        tokio::time::sleep(Duration::from_millis(400)).await;
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the cancelled call ran");
    server.shutdown();
}

#[test]
fn a_call_whose_timeout_passes_in_the_queue_is_deadline_exceeded_unrun() {
    let (server, runs) = serve(Duration::from_millis(300), 1000);
    let refused = runtime().block_on(async {
        let mut first_client = connect(&server).await;
        let mut client = connect(&server).await;
        let first = tokio::spawn(async move {
            first_client
                .model_infer(raw_request("double", &[[1.0, 1.0]]))
                .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await; // the first is on the slot
        let mut request = raw_request("double", &[[2.0, 2.0]]);
        let timeout = InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(50_000)),
        };
        request.parameters.insert("timeout".into(), timeout);
        let refused = client.model_infer(request).await.unwrap_err();
        assert!(first.await.unwrap().is_ok());
        refused
    });
    assert_eq!(
        refused.code(),
        Code::DeadlineExceeded,
        "{}",
        refused.message()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the expired request ran");
    server.shutdown();
}

#[test]
fn the_clients_own_deadline_bounds_the_request() {
    let (server, runs) = serve(Duration::from_millis(300), 1000);
    let refused = runtime().block_on(async {
        let mut first_client = connect(&server).await;
        let mut client = connect(&server).await;
        let first = tokio::spawn(async move {
            first_client
                .model_infer(raw_request("double", &[[1.0, 1.0]]))
                .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await; // the first is on the slot
        let mut request = tonic::Request::new(raw_request("double", &[[2.0, 2.0]]));
        request.set_timeout(Duration::from_millis(50));
        let refused = client.model_infer(request).await.unwrap_err();
        assert!(first.await.unwrap().is_ok());
        tokio::time::sleep(Duration::from_millis(100)).await;
        refused
    });
    // tonic's channel enforces the deadline too: the server's DEADLINE_EXCEEDED or the
    // client's own cancel, whichever comes first (`bounded_timeout` is the server's
    // bound); the request must not run either way.
    let codes = [Code::DeadlineExceeded, Code::Cancelled];
    assert!(codes.contains(&refused.code()), "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the expired request ran");
    server.shutdown();
}

#[test]
fn a_model_held_not_ready_is_unavailable_with_retry_after() {
    let (server, runs) = serve(Duration::ZERO, 1000);
    server.set_ready(false);
    let (ready, refused) = runtime().block_on(async {
        let mut client = connect(&server).await;
        let ready = client.server_ready(ServerReadyRequest {}).await.unwrap();
        let refused = client
            .model_infer(raw_request("double", &[[1.0, 1.0]]))
            .await;
        (ready.into_inner().ready, refused.unwrap_err())
    });
    assert!(!ready);
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(
        refused.message(),
        "the runtime holds the model not ready (its known-answer check has not passed)"
    );
    let retry_after = refused
        .metadata()
        .get("retry-after")
        .map(|v| v.to_str().unwrap());
    assert_eq!(retry_after, Some("1"));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    server.shutdown();
}

#[test]
fn shutdown_answers_the_calls_it_accepted_then_stops_listening() {
    let (server, _) = serve(Duration::from_millis(200), 1000);
    let port = server.grpc_port().unwrap();
    let client = runtime();
    let mut grpc = client.block_on(connect(&server));
    let call =
        client.spawn(async move { grpc.model_infer(raw_request("double", &[[1.0, 1.0]])).await });
    std::thread::sleep(Duration::from_millis(50)); // on the slot
    server.shutdown();
    let answer = client
        .block_on(call)
        .unwrap()
        .expect("answered before stopping");
    assert_eq!(
        read_floats(raw_output(&answer.into_inner(), "y")),
        vec![2.0, 2.0]
    );
    let refused = std::net::TcpStream::connect(("127.0.0.1", port));
    assert!(refused.is_err(), "still listening after shutdown");
}

#[test]
fn the_clients_deadline_is_the_timeout_when_it_is_sooner() {
    use super::service::bounded_timeout;
    let ms = Duration::from_millis;
    assert_eq!(bounded_timeout(None, 5_000_000, Some(ms(50))), Some(50_000));
    assert_eq!(
        bounded_timeout(Some(20_000), 5_000_000, Some(ms(50))),
        Some(20_000)
    );
    assert_eq!(
        bounded_timeout(Some(0), 5_000_000, Some(ms(9000))),
        Some(5_000_000)
    );
    assert_eq!(bounded_timeout(Some(7), 5_000_000, None), Some(7));
    assert_eq!(
        bounded_timeout(None, 5_000_000, Some(Duration::ZERO)),
        Some(1)
    );
}

#[test]
fn grpc_timeout_headers_parse_as_grpc_defines_them() {
    use super::timeout::parse;
    assert_eq!(parse("50m"), Some(Duration::from_millis(50)));
    assert_eq!(parse("2S"), Some(Duration::from_secs(2)));
    assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
    assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
    assert_eq!(parse("123456789n"), None, "at most 8 digits");
    assert_eq!(parse("m"), None);
    assert_eq!(parse("5x"), None);
}

/// The exposition's line of `series` (the model's labels first), if any.
fn metric_line(server: &Server, series: &str) -> Option<String> {
    let text = server
        .metrics()
        .render(&crate::metrics::Snapshot::default());
    text.lines()
        .find(|line| line.starts_with(series))
        .map(str::to_string)
}

#[test]
fn grpc_calls_are_counted_by_their_http_status_and_a_cancelled_one_by_its_stage() {
    let (server, _) = serve(Duration::from_millis(300), 1000);
    runtime().block_on(async {
        let mut client = connect(&server).await;
        let mut second_client = connect(&server).await;
        let refused = client
            .model_infer(raw_request("other", &[[1.0, 1.0]]))
            .await;
        assert_eq!(refused.unwrap_err().code(), Code::NotFound);
        let first = tokio::spawn(async move {
            client
                .model_infer(raw_request("double", &[[1.0, 1.0]]))
                .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await; // the first is on the slot
        let second = tokio::spawn(async move {
            second_client
                .model_infer(raw_request("double", &[[2.0, 2.0]]))
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await; // queued behind the first
        second.abort();
        assert!(first.await.unwrap().is_ok());
    });
    let labels = "{model=\"double\",version=\"1\"";
    let requests = format!("kubeinfer_requests_total{labels},code=");
    assert_eq!(
        metric_line(&server, &format!("{requests}\"200\"}}")).as_deref(),
        Some(format!("{requests}\"200\"}} 1.0").as_str())
    );
    assert!(metric_line(&server, &format!("{requests}\"404\"}} 1.0")).is_some());
    let cancelled = format!("kubeinfer_requests_cancelled_total{labels},stage=\"waiting\"}} 1.0");
    assert!(metric_line(&server, &cancelled).is_some());
    let in_progress = format!("kubeinfer_requests_in_progress{labels}}} 0.0");
    assert!(metric_line(&server, &in_progress).is_some());
    server.shutdown();
}
