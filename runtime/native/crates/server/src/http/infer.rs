//! `POST /v2/models/{name}[/versions/{v}]/infer`: admitted before its body is read, read
//! bounded, decoded, checked against the model, queued, and answered from its batch.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Body;
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::{Request, Response};

use dataplane_core::batching::Time;
use dataplane_core::batching::admission::{Admission, Stage};
use dataplane_core::batching::scheduler::Queued;
use dataplane_core::codec::inflate::{ContentEncoding, inflate};
use dataplane_core::codec::json::{decode_request, encode_response};
use dataplane_core::error::ApiError;
use dataplane_core::request::{
    HEADER_LENGTH_HEADER, InferRequest, InferResponse, InputSource, ResponseOutput,
};
use dataplane_core::tensor::Tensor;

use super::body::{Clock, Watched, check_declared_length, read_body};
use super::{Parts, error};
use crate::metrics::RequestWatch;
use crate::model::quoted;
use crate::shm::{OutputPlace, Regions};
use crate::state::{Answer, Pending, Reply, Shared};

/// The Server-Timing metric of an infer answer: the server's own time for the request.
const SERVER_TIMING: &str = "server-timing";

/// Bodies this large are decoded on a blocking thread, off the runtime's workers.
const DECODE_OFF_RUNTIME_BYTES: usize = 256 * 1024;

impl Clock for Shared {
    fn now(&self) -> Time {
        Shared::now(self)
    }
}

/// An admitted request's place, given back however its handler ends (answered, failed,
/// or dropped because its client left).
pub(crate) struct Admitted<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) admission: Admission,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.shared.release(&mut self.admission);
    }
}

/// Wakes the driver when a queued request's handler goes without its answer (its client
/// left), so the scheduler drops it before it runs.
struct WakeIfGone<'a>(&'a Shared);

impl Drop for WakeIfGone<'_> {
    fn drop(&mut self) {
        self.0.wake.notify_one();
    }
}

pub async fn infer(
    shared: &Arc<Shared>,
    request: Request<&mut Watched>,
    name: &str,
    version: Option<&str>,
) -> Response<Parts> {
    let arrived = shared.now();
    let watch = RequestWatch::new(shared);
    let mut response = match answer(shared, request, name, version, arrived, &watch).await {
        Ok(response) => response,
        Err(failure) => error(&failure),
    };
    let seconds = shared.now().saturating_sub(arrived);
    let millis = seconds.as_secs_f64() * 1000.0;
    if let Ok(value) = HeaderValue::from_str(&format!("infer;dur={millis:.3}")) {
        response.headers_mut().insert(SERVER_TIMING, value);
    }
    watch.answered(response.status().as_u16(), seconds);
    response
}

async fn answer(
    shared: &Arc<Shared>,
    request: Request<&mut Watched>,
    name: &str,
    version: Option<&str>,
    arrived: Time,
    watch: &RequestWatch<'_>,
) -> Result<Response<Parts>, ApiError> {
    shared.model.check(name, version)?;
    let mut admitted = Admitted {
        admission: shared.admit(arrived)?,
        shared,
    };
    watch.admitted();
    let (parts, body) = request.into_parts();
    let slice_value = slice_value(shared, &parts.headers);
    let header_length = header_length(&parts.headers)?;
    let encoding = content_encoding(&parts.headers)?;
    let limit = shared.options.max_request_bytes;
    check_declared_length(body.size_hint().exact(), limit)?;
    let idle = Duration::from_secs_f64(shared.options.body_read_timeout_seconds.max(0.001));
    let raw = read_body(
        body,
        limit,
        admitted.admission.deadline,
        idle,
        &**shared,
        &|| watch.client_left(),
    )
    .await?;
    admitted.admission.stage = Stage::Waiting;
    watch.waiting();
    let decoded = decode(shared, raw, encoding, header_length).await?;
    let response = infer_decoded(
        shared,
        &mut admitted.admission,
        decoded,
        arrived,
        watch,
        slice_value,
    )
    .await?;
    encoded(&response)
}

/// The path of every admitted infer request once its transport decoded it (REST's body,
/// gRPC's message), one path for both transports: its outputs and
/// inputs checked against the model, its own timeout applied from its arrival, queued (its
/// place in the admissions handed to the queue) and answered from its batch.
pub(crate) async fn infer_decoded(
    shared: &Shared,
    admission: &mut Admission,
    decoded: InferRequest,
    arrived: Time,
    watch: &RequestWatch<'_>,
    slice_value: Option<String>,
) -> Result<InferResponse, ApiError> {
    let wanted = wanted_outputs(shared, &decoded)?;
    start_deadline(shared, admission, &decoded)?;
    let level = level_of(shared, decoded.priority);
    let id = decoded.id.clone();
    let binary_default = decoded.binary_data_output;
    let inputs = inputs_of(&shared.shared_memory, decoded)?;
    let checked = shared.plan.check(inputs, shared.model.max_batch_size)?;
    let (reply, receiver) = Reply::new();
    watch.queued(&reply);
    let (batch_shape, cut) = match checked.shape {
        Some(shape) => (Some(shape.batch_shape), shape.cut),
        None => (None, Vec::new()),
    };
    let queued = Queued {
        rows: checked.rows,
        arrived_at: arrived,
        queued_at: arrived,
        deadline: admission.deadline,
        level,
        shape: batch_shape,
        payload: Pending {
            inputs: checked.inputs,
            cut,
            reply,
            admission: admission.clone(),
            slice_value,
        },
    };
    enqueue(shared, admission, queued)?;
    let outputs = wait(shared, receiver).await?;
    let response = InferResponse {
        model_name: shared.model.name.clone(),
        model_version: shared.model.version.clone(),
        id,
        outputs: wanted
            .into_iter()
            .map(|wanted| {
                let tensor = &outputs[wanted.index];
                Ok(ResponseOutput {
                    shared_memory: wanted.place.map(|p| p.write(tensor)).transpose()?,
                    tensor: tensor.clone(),
                    binary: wanted.binary.unwrap_or(binary_default),
                })
            })
            .collect::<Result<_, ApiError>>()?,
    };
    Ok(response)
}

/// The value of the quality watch's slice header, while a watch names one (a value that
/// is not text is none, as over gRPC).
pub(crate) fn slice_value(shared: &Shared, headers: &HeaderMap) -> Option<String> {
    let header = shared.samplers.slice_header()?;
    let value = headers.get(header.as_str())?;
    value.to_str().ok().map(str::to_owned)
}

fn header_length(headers: &HeaderMap) -> Result<Option<usize>, ApiError> {
    let Some(value) = headers.get(HEADER_LENGTH_HEADER) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map(Some)
        // Named in the header's canonical spelling, as clients send it.
        .ok_or_else(|| ApiError::invalid("Inference-Header-Content-Length must be an integer"))
}

fn content_encoding(headers: &HeaderMap) -> Result<Option<ContentEncoding>, ApiError> {
    match headers.get(CONTENT_ENCODING) {
        None => Ok(None),
        Some(value) => ContentEncoding::from_header(value.to_str().unwrap_or("?")),
    }
}

/// The body inflated (bounded) and decoded; a large one on a blocking thread.
async fn decode(
    shared: &Arc<Shared>,
    raw: Bytes,
    encoding: Option<ContentEncoding>,
    header_length: Option<usize>,
) -> Result<InferRequest, ApiError> {
    let json_bytes = header_length.unwrap_or(raw.len());
    // Compressed bodies always inflate off the runtime's workers; JSON when it is large.
    let offload = encoding.is_some() || json_bytes >= DECODE_OFF_RUNTIME_BYTES;
    let work = {
        let shared = shared.clone();
        move || {
            let body = match encoding {
                None => raw,
                Some(encoding) => Bytes::from(inflate(
                    &raw,
                    encoding,
                    shared.options.max_request_bytes,
                    shared.limits.max_json_values,
                    header_length,
                )?),
            };
            decode_request(&body, header_length, &shared.limits)
        }
    };
    if offload {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|_| ApiError::Internal)?
    } else {
        work()
    }
}

/// An output asked for: its index, its own binary choice, and its place in a registered
/// shared-memory region when it asked to be written there.
struct Wanted {
    index: usize,
    binary: Option<bool>,
    place: Option<OutputPlace>,
}

/// The outputs asked for (all, by default), each with its own binary choice and its
/// shared-memory place (resolved now: a 400 before it runs when the place is wrong).
fn wanted_outputs(shared: &Shared, request: &InferRequest) -> Result<Vec<Wanted>, ApiError> {
    let model = &shared.model;
    let Some(outputs) = &request.outputs else {
        return Ok((0..model.outputs.len())
            .map(|index| Wanted {
                index,
                binary: None,
                place: None,
            })
            .collect());
    };
    outputs
        .iter()
        .map(|output| match model.output_index(&output.name) {
            Some(index) => Ok(Wanted {
                index,
                binary: output.binary,
                place: output
                    .shared_memory
                    .clone()
                    .map(|place| shared.shared_memory.output_place(place))
                    .transpose()?,
            }),
            None => {
                let mut names: Vec<String> =
                    model.outputs.iter().map(|o| quoted(&o.name)).collect();
                names.sort();
                Err(ApiError::invalid(format!(
                    "unknown output {}; the model's outputs are [{}]",
                    quoted(&output.name),
                    names.join(", ")
                )))
            }
        })
        .collect()
}

/// Applies the request's own timeout (0 or absent: the default), counted from its arrival,
/// and refuses it when that passed already while it was read and decoded.
fn start_deadline(
    shared: &Shared,
    admission: &mut Admission,
    request: &InferRequest,
) -> Result<(), ApiError> {
    if let Some(micros) = request.timeout_microseconds.filter(|&t| t > 0) {
        admission.set_timeout(Duration::from_micros(micros));
    }
    let now = shared.now();
    if now >= admission.deadline {
        let since = now.saturating_sub(admission.arrived_at).as_secs_f64() * 1000.0;
        return Err(ApiError::DeadlineExceeded(format!(
            "the request's deadline passed {since:.1} ms after it arrived, before it was \
             queued (reading and decoding it); it was not executed"
        )));
    }
    Ok(())
}

/// The priority level: 0 (or one past the levels) is the default level; 1 is the most
/// urgent.
fn level_of(shared: &Shared, priority: u64) -> u32 {
    let batching = &shared.options.batching;
    match u32::try_from(priority) {
        Ok(level) if level >= 1 && level <= batching.priority_levels => level,
        _ => batching.default_priority_level,
    }
}

/// The decoded inputs as tensors (one in shared memory read from its region: a view of
/// it, copied only into the batch); an input named twice is refused.
fn inputs_of(regions: &Regions, request: InferRequest) -> Result<Vec<Tensor>, ApiError> {
    let mut tensors: Vec<Tensor> = Vec::with_capacity(request.inputs.len());
    for input in request.inputs {
        if tensors.iter().any(|t| t.name == input.name) {
            return Err(ApiError::invalid(format!(
                "input {} is given twice",
                quoted(&input.name)
            )));
        }
        let data = match input.source {
            InputSource::Data(data) => data,
            InputSource::SharedMemory(place) => {
                let what = format!("input {}", quoted(&input.name));
                regions.input_data(&what, input.datatype, &input.shape, &place)?
            }
        };
        tensors.push(Tensor {
            name: input.name,
            datatype: input.datatype,
            shape: input.shape,
            data,
        });
    }
    Ok(tensors)
}

/// Queues the request (its place handed to it in the queue), shedding a less urgent one
/// when the queue is full and there is one; the driver is woken to step.
fn enqueue(
    shared: &Shared,
    admission: &mut Admission,
    item: Queued<Pending>,
) -> Result<(), ApiError> {
    let shed = {
        let mut core = shared.core();
        let core = &mut *core;
        core.admissions.release(admission);
        if !core.admissions.accepting() && !core.admissions.draining() {
            return Err(ApiError::NotReady("the server stopped".into()));
        }
        let mut shed = None;
        if !core.admissions.fits(core.scheduler.queued()) {
            shed = core.scheduler.shed_for(item.level);
            if shed.is_none() {
                return Err(core.admissions.full_queue());
            }
        }
        core.scheduler.push(item, shared.now());
        shed
    };
    if let Some(shed) = shed {
        shed.payload.reply.send(Err(ApiError::Overloaded(
            "the request was shed for a more urgent one; retry later".into(),
        )));
    }
    shared.wake.notify_one();
    Ok(())
}

async fn wait(shared: &Shared, receiver: tokio::sync::oneshot::Receiver<Answer>) -> Answer {
    let guard = WakeIfGone(shared);
    let answer = receiver.await;
    std::mem::forget(guard);
    answer.unwrap_or_else(|_| {
        log::error!("A queued request's answer was dropped without being sent");
        Err(ApiError::Internal)
    })
}

fn encoded(response: &InferResponse) -> Result<Response<Parts>, ApiError> {
    let body = encode_response(response)?;
    let content_type = if body.header_length.is_some() {
        "application/octet-stream"
    } else {
        "application/json"
    };
    let header_length = body.header_length;
    let mut answer = Response::new(Parts::many(body.parts));
    let headers = answer.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(length) = header_length {
        headers.insert(HEADER_LENGTH_HEADER, HeaderValue::from(length));
    }
    Ok(answer)
}
