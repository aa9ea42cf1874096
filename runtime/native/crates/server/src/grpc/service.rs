//! `inference.GRPCInferenceService` over the shared state: thin, as the HTTP routes are.
//! ModelInfer is admitted (an unknown model, a held-not-ready, full or draining server
//! refused before anything else), its size checked, decoded, bounded by the client's own
//! deadline, and from there takes the one path HTTP's requests take ([`infer_decoded`]):
//! the same queue, batches and slots.
//! Every `ApiError` is answered with its gRPC code and its message as the details (a 503's
//! Retry-After as trailing metadata, where HTTP sends it as a header). The system
//! shared-memory RPCs answer from the registry HTTP's routes use (`super::shm`).

use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};

use dataplane_core::batching::Time;
use dataplane_core::batching::admission::Stage;
use dataplane_core::error::ApiError;
use dataplane_core::request::InferRequest;
use dataplane_core::tensor::TensorSpec;

use super::codec::{from_model_infer_request, to_model_infer_response, typed_elements};
use super::inference::grpc_inference_service_server::GrpcInferenceService;
use super::inference::model_metadata_response::TensorMetadata;
use super::inference::{
    ModelConfig, ModelConfigRequest, ModelConfigResponse, ModelInferRequest, ModelInferResponse,
    ModelInput, ModelMetadataRequest, ModelMetadataResponse, ModelOutput, ModelReadyRequest,
    ModelReadyResponse, ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest,
    ServerMetadataResponse, ServerReadyRequest, ServerReadyResponse,
    SystemSharedMemoryRegisterRequest, SystemSharedMemoryRegisterResponse,
    SystemSharedMemoryStatusRequest, SystemSharedMemoryStatusResponse,
    SystemSharedMemoryUnregisterRequest, SystemSharedMemoryUnregisterResponse,
};
use super::timeout::client_timeout;
use crate::http::infer::{Admitted, infer_decoded};
use crate::metrics::RequestWatch;
use crate::model::{EXTENSIONS, SERVER_NAME, SERVER_VERSION};
use crate::state::Shared;

/// Typed contents of this many elements or more are converted on a blocking thread (raw
/// contents are views of the message, never converted).
const TYPED_OFFLOAD_ELEMENTS: usize = 256 * 1024;

/// When the RPC's HTTP/2 request arrived (before its message was read): its deadline
/// counts from here, as an HTTP request's from its arrival.
#[derive(Clone, Copy, Debug)]
pub struct Arrived(pub Time);

/// The gRPC service of one server.
pub struct InferenceService {
    shared: Arc<Shared>,
}

impl InferenceService {
    /// The service of the server whose state is `shared`.
    pub fn new(shared: Arc<Shared>) -> InferenceService {
        InferenceService { shared }
    }
}

/// The gRPC status of an error: its code, its message as details, Retry-After for a 503.
pub fn status(error: &ApiError) -> Status {
    let code = tonic::Code::from_i32(error.grpc_code() as i32);
    let mut metadata = MetadataMap::new();
    if let Some(seconds) = error.retry_after_seconds() {
        metadata.insert("retry-after", MetadataValue::from(seconds));
    }
    Status::with_metadata(code, error.message(), metadata)
}

// tonic's trait answers a `Status` by value; its size is tonic's.
#[allow(clippy::result_large_err)]
fn answered<T>(answer: Result<T, ApiError>) -> Result<Response<T>, Status> {
    answer.map(Response::new).map_err(|error| status(&error))
}

/// The version a request names (empty: any).
fn version(version: &str) -> Option<&str> {
    Some(version).filter(|v| !v.is_empty())
}

fn tensor_metadata(specs: &[TensorSpec]) -> Vec<TensorMetadata> {
    specs
        .iter()
        .map(|s| TensorMetadata {
            name: s.name.clone(),
            datatype: s.datatype.name().to_string(),
            shape: s.shape.clone(),
        })
        .collect()
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(
        &self,
        _: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        let live = self.shared.live();
        Ok(Response::new(ServerLiveResponse { live }))
    }

    async fn server_ready(
        &self,
        _: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        let ready = self.shared.ready();
        Ok(Response::new(ServerReadyResponse { ready }))
    }

    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let request = request.get_ref();
        let checked = self
            .shared
            .model
            .check(&request.name, version(&request.version));
        answered(checked.map(|()| ModelReadyResponse {
            ready: self.shared.ready(),
        }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: SERVER_NAME.into(),
            version: SERVER_VERSION.into(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let request = request.get_ref();
        let model = &self.shared.model;
        answered(
            model
                .check(&request.name, version(&request.version))
                .map(|()| ModelMetadataResponse {
                    name: model.name.clone(),
                    versions: vec![model.version.clone()],
                    platform: model.platform.clone(),
                    inputs: tensor_metadata(&model.inputs),
                    outputs: tensor_metadata(&model.outputs),
                }),
        )
    }

    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let request = request.get_ref();
        let model = &self.shared.model;
        let checked = model.check(&request.name, version(&request.version));
        answered(checked.map(|()| ModelConfigResponse {
            config: Some(config_message(&model.config())),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let shared = &self.shared;
        let arrived = request
            .extensions()
            .get::<Arrived>()
            .map_or_else(|| shared.now(), |a| a.0);
        let client = client_timeout(request.metadata());
        let slice = slice_value(shared, request.metadata());
        let message = request.into_inner();
        let watch = RequestWatch::new(shared);
        let answer = infer(shared, message, arrived, client, &watch, slice).await;
        // Counted by the HTTP status of its answer: one `code` label for both transports.
        let code = answer.as_ref().map_or_else(ApiError::status, |_| 200);
        watch.answered(code, shared.now().saturating_sub(arrived));
        answered(answer)
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        answered(super::shm::status(
            &self.shared.shared_memory,
            request.get_ref(),
        ))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        let registered = super::shm::register(&self.shared.shared_memory, request.get_ref());
        answered(registered.map(|()| SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        super::shm::unregister(&self.shared.shared_memory, request.get_ref());
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }
}

/// The value of the quality watch's slice metadata key, while a watch names one (the
/// header's name in lower case, as gRPC metadata keys are; a value that is not text is none).
fn slice_value(shared: &Shared, metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    let header = shared.samplers.slice_header()?.to_ascii_lowercase();
    let value = metadata.get(header.as_str())?;
    value.to_str().ok().map(str::to_owned)
}

/// ModelInfer's path: admitted, sized, decoded, bounded by the client, then HTTP's.
async fn infer(
    shared: &Arc<Shared>,
    message: ModelInferRequest,
    arrived: Time,
    client: Option<Duration>,
    watch: &RequestWatch<'_>,
    slice: Option<String>,
) -> Result<ModelInferResponse, ApiError> {
    shared
        .model
        .check(&message.model_name, version(&message.model_version))?;
    let mut admitted = Admitted {
        admission: shared.admit(arrived)?,
        shared,
    };
    watch.admitted();
    // The message is read: decoding, then queued.
    admitted.admission.stage = Stage::Waiting;
    watch.waiting();
    check_message_size(shared, prost::Message::encoded_len(&message))?;
    let mut decoded = decode(shared, message).await?;
    bound_by_client(shared, &mut decoded, client);
    let response = infer_decoded(
        shared,
        &mut admitted.admission,
        decoded,
        arrived,
        watch,
        slice,
    )
    .await?;
    Ok(to_model_infer_response(response))
}

/// A 413 (RESOURCE_EXHAUSTED) for a message over maxRequestBytes (gRPC itself refuses
/// those past twice the limit, before they are read).
fn check_message_size(shared: &Shared, size: usize) -> Result<(), ApiError> {
    let limit = shared.options.max_request_bytes;
    if size > limit {
        return Err(ApiError::over_request_limit(format!(
            "the request message ({size} bytes) is over the limit of {limit} bytes"
        )));
    }
    Ok(())
}

/// The message decoded; large typed contents on a blocking thread, off the workers.
async fn decode(shared: &Shared, message: ModelInferRequest) -> Result<InferRequest, ApiError> {
    let limits = shared.limits;
    if typed_elements(&message) < TYPED_OFFLOAD_ELEMENTS {
        return from_model_infer_request(&message, &limits);
    }
    tokio::task::spawn_blocking(move || from_model_infer_request(&message, &limits))
        .await
        .map_err(|_| ApiError::Internal)?
}

/// The client's own deadline (gRPC's `grpc-timeout`, from the request's arrival) becomes
/// the request's timeout when it is sooner than its `timeout` parameter (or the default).
fn bound_by_client(shared: &Shared, request: &mut InferRequest, client: Option<Duration>) {
    let default = shared.options.batching.default_timeout_milliseconds * 1000;
    request.timeout_microseconds = bounded_timeout(request.timeout_microseconds, default, client);
}

/// The timeout (microseconds) of a request whose own is `own` (None or 0: `default`) and
/// whose client waits `client` from its arrival: the sooner, at least 1 µs.
pub fn bounded_timeout(own: Option<u64>, default: u64, client: Option<Duration>) -> Option<u64> {
    let Some(client) = client else {
        return own;
    };
    let own = own.filter(|&t| t > 0).unwrap_or(default);
    let client = u64::try_from(client.as_micros()).unwrap_or(u64::MAX);
    Some(own.min(client).max(1))
}

/// The ModelConfig message of `Model::config`'s JSON form (Triton's), so both transports
/// answer one configuration.
fn config_message(config: &serde_json::Value) -> ModelConfig {
    let text = |key: &str| config[key].as_str().unwrap_or_default().to_string();
    let tensors = |key: &str| -> Vec<(String, i32, Vec<i64>)> {
        let entries = config[key]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        entries
            .iter()
            .map(|entry| {
                let data_type = entry["data_type"].as_str().unwrap_or_default();
                let data_type = super::inference::DataType::from_str_name(data_type)
                    .unwrap_or(super::inference::DataType::TypeInvalid);
                let dims = entry["dims"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let dims = dims.iter().filter_map(serde_json::Value::as_i64).collect();
                (
                    entry["name"].as_str().unwrap_or_default().into(),
                    data_type as i32,
                    dims,
                )
            })
            .collect()
    };
    ModelConfig {
        name: text("name"),
        platform: text("platform"),
        max_batch_size: config["max_batch_size"].as_i64().unwrap_or(0) as i32,
        input: tensors("input")
            .into_iter()
            .map(|(name, data_type, dims)| ModelInput {
                name,
                data_type,
                dims,
            })
            .collect(),
        output: tensors("output")
            .into_iter()
            .map(|(name, data_type, dims)| ModelOutput {
                name,
                data_type,
                dims,
            })
            .collect(),
    }
}
