//! The Open Inference Protocol's gRPC messages to the data plane's types and back (the
//! direction in each function's name), refusing in the words the black-box tests read.
//!
//! Inputs come either all in `raw_input_contents` (little-endian bytes, one entry per
//! input, in order: the form Triton's clients send) or all as typed `contents` (the
//! repeated field of the input's datatype); FP16 has no typed field and comes raw only. A
//! raw BYTES tensor is Triton's serialized form (each element a 4-byte little-endian
//! length and its bytes). Everything a client can get wrong is an `InvalidRequest` naming
//! the input, before any tensor is built; a typed value out of its datatype's range is
//! refused, never wrapped.
//!
//! Outputs go raw (`raw_output_contents`) by default, as Triton answers, and typed when
//! the request asks (`binary_data_output` false, or `binary_data: false` on the outputs
//! asked for); a response is all raw or all typed, so a request asking both is refused,
//! and FP16 outputs (no typed field) make it raw.

use bytes::Bytes;

use dataplane_core::codec::bytes::{check_text, deserialize};
use dataplane_core::codec::json::MAX_RANK;
use dataplane_core::codec::{DecodeLimits, binary, repr};
use dataplane_core::error::ApiError;
use dataplane_core::request::{
    BINARY_DATA_OUTPUT_PARAMETER, BINARY_DATA_PARAMETER, DecodedInput, InferRequest, InferResponse,
    InputSource, PRIORITY_PARAMETER, RequestedOutput, SharedMemoryRef, TIMEOUT_PARAMETER,
};
use dataplane_core::tensor::{DataType, Tensor, TensorData};

use super::inference::infer_parameter::ParameterChoice;
use super::inference::model_infer_request::InferInputTensor;
use super::inference::model_infer_response::InferOutputTensor;
use super::inference::{
    InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse,
};

type Parameters = std::collections::HashMap<String, InferParameter>;

/// The typed field of each datatype that has one (FP16 travels raw only).
fn contents_field(datatype: DataType) -> Option<&'static str> {
    Some(match datatype {
        DataType::Bool => "bool_contents",
        DataType::I8 | DataType::I16 | DataType::I32 => "int_contents",
        DataType::I64 => "int64_contents",
        DataType::U8 | DataType::U16 | DataType::U32 => "uint_contents",
        DataType::U64 => "uint64_contents",
        DataType::F32 => "fp32_contents",
        DataType::F64 => "fp64_contents",
        DataType::Bytes => "bytes_contents",
        DataType::F16 => return None,
    })
}

/// Each typed field's name and value count, in the proto's order.
fn field_counts(contents: &InferTensorContents) -> [(&'static str, usize); 8] {
    [
        ("bool_contents", contents.bool_contents.len()),
        ("int_contents", contents.int_contents.len()),
        ("int64_contents", contents.int64_contents.len()),
        ("uint_contents", contents.uint_contents.len()),
        ("uint64_contents", contents.uint64_contents.len()),
        ("fp32_contents", contents.fp32_contents.len()),
        ("fp64_contents", contents.fp64_contents.len()),
        ("bytes_contents", contents.bytes_contents.len()),
    ]
}

/// Elements the request's typed contents hold (0 when its inputs are raw): what
/// converting them costs, for the choice of a blocking thread.
pub fn typed_elements(message: &ModelInferRequest) -> usize {
    if !message.raw_input_contents.is_empty() {
        return 0;
    }
    message
        .inputs
        .iter()
        .filter_map(|tensor| tensor.contents.as_ref())
        .map(|contents| field_counts(contents).iter().map(|(_, n)| n).sum::<usize>())
        .sum()
}

/// The oneof's field name, as Python's `WhichOneof` gives it (`None` when unset).
fn kind_name(parameter: &InferParameter) -> &'static str {
    match parameter.parameter_choice {
        None => "None",
        Some(ParameterChoice::BoolParam(_)) => "bool_param",
        Some(ParameterChoice::Int64Param(_)) => "int64_param",
        Some(ParameterChoice::StringParam(_)) => "string_param",
        Some(ParameterChoice::DoubleParam(_)) => "double_param",
        Some(ParameterChoice::Uint64Param(_)) => "uint64_param",
    }
}

fn wrong_kind(where_: &str, name: &str, kind: &str, given: &InferParameter) -> ApiError {
    ApiError::invalid(format!(
        "{where_}parameters.{name} must be given as {kind}, not {}",
        kind_name(given)
    ))
}

/// A boolean parameter (None when absent); another kind is the client's mistake.
fn bool_parameter(
    parameters: &Parameters,
    name: &str,
    where_: &str,
) -> Result<Option<bool>, ApiError> {
    match parameters.get(name) {
        None => Ok(None),
        Some(InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(value)),
        }) => Ok(Some(*value)),
        Some(other) => Err(wrong_kind(where_, name, "bool_param", other)),
    }
}

/// The `timeout` parameter (int64, microseconds, >= 0).
fn timeout_parameter(parameters: &Parameters) -> Result<Option<u64>, ApiError> {
    match parameters.get(TIMEOUT_PARAMETER) {
        None => Ok(None),
        Some(InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(value)),
        }) => u64::try_from(*value)
            .map(Some)
            .map_err(|_| ApiError::invalid("parameters.timeout must be >= 0 (microseconds)")),
        Some(other) => Err(wrong_kind("", TIMEOUT_PARAMETER, "int64_param", other)),
    }
}

/// The `priority` parameter: tritonclient sends it as uint64; an int64 >= 0 is taken too.
fn priority_parameter(parameters: &Parameters) -> Result<u64, ApiError> {
    match parameters.get(PRIORITY_PARAMETER) {
        None => Ok(0),
        Some(parameter) => match parameter.parameter_choice {
            Some(ParameterChoice::Uint64Param(value)) => Ok(value),
            Some(ParameterChoice::Int64Param(value)) => u64::try_from(value)
                .map_err(|_| ApiError::invalid("parameters.priority must be >= 0")),
            _ => Err(wrong_kind(
                "",
                PRIORITY_PARAMETER,
                "uint64_param",
                parameter,
            )),
        },
    }
}

/// A shape as Python prints a list of integers (negative ones too).
fn shape_text(shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// The tensor's shape, checked: no negative dimension, at most `MAX_RANK`, no more
/// elements than the model's largest input.
fn shape_of(tensor: &InferInputTensor, limits: &DecodeLimits) -> Result<Vec<usize>, ApiError> {
    let name = repr::string(&tensor.name);
    if tensor.shape.iter().any(|&d| d < 0) {
        return Err(ApiError::invalid(format!(
            "input {name}: shape {} has a negative dimension",
            shape_text(&tensor.shape)
        )));
    }
    if tensor.shape.len() > MAX_RANK {
        return Err(ApiError::invalid(format!(
            "input {name}: shape has {} dimensions",
            tensor.shape.len()
        )));
    }
    let shape: Vec<usize> = tensor.shape.iter().map(|&d| d as usize).collect();
    let count = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if let Some(max) = limits.max_elements {
        if count.is_none_or(|count| count > max) {
            return Err(ApiError::invalid(format!(
                "input {name}: shape {} declares {} elements; this model takes at most {max} \
                 per input",
                repr::shape(&shape),
                repr::product(&shape, 1)
            )));
        }
    }
    Ok(shape)
}

/// One input's raw contents checked against its shape and datatype.
fn from_raw(
    tensor: &InferInputTensor,
    datatype: DataType,
    shape: &[usize],
    raw: &Bytes,
) -> Result<TensorData, ApiError> {
    let name = repr::string(&tensor.name);
    let count = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let Some(item_size) = datatype.item_size() else {
        let what = format!("input {name}: raw_input_contents");
        // Past `usize`, no buffer holds that many elements: it ends first.
        let elements = deserialize(raw, count.unwrap_or(usize::MAX), &what)?;
        check_text(&elements, &what)?;
        return Ok(TensorData::Strings(elements));
    };
    let expected = count.and_then(|n| n.checked_mul(item_size));
    if expected != Some(raw.len()) {
        return Err(ApiError::invalid(format!(
            "input {name}: raw_input_contents holds {} bytes; shape {} of {} takes {}",
            raw.len(),
            repr::shape(shape),
            datatype.name(),
            repr::product(shape, item_size)
        )));
    }
    Ok(TensorData::Raw(raw.clone()))
}

/// One input's typed contents: its datatype's field only, exactly the shape's count, each
/// value within the datatype's range; as the little-endian bytes the batch takes.
fn from_contents(
    tensor: &InferInputTensor,
    datatype: DataType,
    shape: &[usize],
) -> Result<TensorData, ApiError> {
    let name = repr::string(&tensor.name);
    let Some(field) = contents_field(datatype) else {
        return Err(ApiError::invalid(format!(
            "input {name}: {} has no typed contents; send it in raw_input_contents",
            datatype.name()
        )));
    };
    let empty = InferTensorContents::default();
    let contents = tensor.contents.as_ref().unwrap_or(&empty);
    let counts = field_counts(contents);
    if let Some((other, _)) = counts.iter().find(|(f, n)| *f != field && *n > 0) {
        return Err(ApiError::invalid(format!(
            "input {name} is {}: its data goes in contents.{field}, not contents.{other}",
            datatype.name()
        )));
    }
    let given = counts
        .iter()
        .find(|(f, _)| *f == field)
        .map_or(0, |(_, n)| *n);
    let count = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if count != Some(given) {
        return Err(ApiError::invalid(format!(
            "input {name}: contents.{field} holds {given} values; shape {} takes {}",
            repr::shape(shape),
            repr::product(shape, 1)
        )));
    }
    typed_data(contents, datatype, &name)
}

fn typed_data(
    contents: &InferTensorContents,
    datatype: DataType,
    name: &str,
) -> Result<TensorData, ApiError> {
    let c = contents;
    let raw: Vec<u8> = match datatype {
        DataType::Bytes => {
            let elements = c.bytes_contents.clone();
            check_text(&elements, &format!("input {name}: contents.bytes_contents"))?;
            return Ok(TensorData::Strings(elements));
        }
        DataType::Bool => c.bool_contents.iter().map(|&b| u8::from(b)).collect(),
        DataType::I8 => narrowed(&c.int_contents, name, datatype, i8::try_from)?,
        DataType::I16 => narrowed(&c.int_contents, name, datatype, i16::try_from)?,
        DataType::U8 => narrowed(&c.uint_contents, name, datatype, u8::try_from)?,
        DataType::U16 => narrowed(&c.uint_contents, name, datatype, u16::try_from)?,
        DataType::I32 => le(&c.int_contents, |v| v.to_le_bytes()),
        DataType::I64 => le(&c.int64_contents, |v| v.to_le_bytes()),
        DataType::U32 => le(&c.uint_contents, |v| v.to_le_bytes()),
        DataType::U64 => le(&c.uint64_contents, |v| v.to_le_bytes()),
        DataType::F32 => le(&c.fp32_contents, |v| v.to_le_bytes()),
        DataType::F64 => le(&c.fp64_contents, |v| v.to_le_bytes()),
        DataType::F16 => unreachable!("FP16 has no typed field: refused before"),
    };
    Ok(TensorData::Raw(Bytes::from(raw)))
}

fn le<T: Copy, const N: usize>(values: &[T], bytes: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| bytes(v)).collect()
}

/// Values of a wider wire type narrowed to the datatype's; the out-of-range one Python
/// names (the smallest when one is below the range, else the largest) refuses them.
fn narrowed<W, T, const N: usize>(
    values: &[W],
    name: &str,
    datatype: DataType,
    narrow: impl Fn(W) -> Result<T, std::num::TryFromIntError>,
) -> Result<Vec<u8>, ApiError>
where
    W: Copy + Ord + std::fmt::Display,
    T: LittleEndian<N>,
{
    let mut out = Vec::with_capacity(values.len() * N);
    for &value in values {
        match narrow(value) {
            Ok(narrow) => out.extend_from_slice(&narrow.le()),
            Err(_) => {
                let (low, high) = (values.iter().min(), values.iter().max());
                let low = low.expect("a value failed, so there is one");
                let bad = if narrow(*low).is_err() {
                    low
                } else {
                    high.expect("one")
                };
                return Err(ApiError::invalid(format!(
                    "input {name}: {bad} is out of the range of {}",
                    datatype.name()
                )));
            }
        }
    }
    Ok(out)
}

/// A narrow integer's little-endian bytes.
trait LittleEndian<const N: usize> {
    fn le(self) -> [u8; N];
}

impl LittleEndian<1> for i8 {
    fn le(self) -> [u8; 1] {
        self.to_le_bytes()
    }
}
impl LittleEndian<1> for u8 {
    fn le(self) -> [u8; 1] {
        [self]
    }
}
impl LittleEndian<2> for i16 {
    fn le(self) -> [u8; 2] {
        self.to_le_bytes()
    }
}
impl LittleEndian<2> for u16 {
    fn le(self) -> [u8; 2] {
        self.to_le_bytes()
    }
}

/// One input decoded: name, datatype and shape checked, then its raw or typed contents.
fn decode_input(
    index: usize,
    tensor: &InferInputTensor,
    source: Source<'_>,
    limits: &DecodeLimits,
) -> Result<DecodedInput, ApiError> {
    if tensor.name.is_empty() {
        return Err(ApiError::invalid(format!(
            "inputs[{index}].name must not be empty"
        )));
    }
    let name = repr::string(&tensor.name);
    let Some(datatype) = DataType::from_name(&tensor.datatype) else {
        let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
        return Err(ApiError::invalid(format!(
            "input {name}: datatype {} is not supported (one of {})",
            repr::string(&tensor.datatype),
            names.join(", ")
        )));
    };
    let shape = shape_of(tensor, limits)?;
    let source = match source {
        Source::SharedMemory(place) => super::shm::input_source(tensor, datatype, &shape, place)?,
        Source::Raw(_) if tensor.contents.is_some() => {
            return Err(ApiError::invalid(format!(
                "input {name} has contents beside raw_input_contents; use one"
            )));
        }
        Source::Raw(raw) => InputSource::Data(from_raw(tensor, datatype, &shape, raw)?),
        Source::Contents => InputSource::Data(from_contents(tensor, datatype, &shape)?),
    };
    Ok(DecodedInput {
        name: tensor.name.clone(),
        datatype,
        shape,
        source,
    })
}

/// Where an input's elements are in the message.
enum Source<'m> {
    /// Its entry of `raw_input_contents`.
    Raw(&'m Bytes),
    /// Its typed `contents`.
    Contents,
    /// A registered shared-memory region (its parameters name it).
    SharedMemory(SharedMemoryRef),
}

/// The data plane's request from a ModelInferRequest (its model name and version are the
/// transport's, for admission).
pub fn from_model_infer_request(
    message: &ModelInferRequest,
    limits: &DecodeLimits,
) -> Result<InferRequest, ApiError> {
    if message.inputs.is_empty() {
        return Err(ApiError::invalid("inputs must not be empty"));
    }
    // Triton's clients send raw contents for the inputs that are not in shared memory only.
    let places = (message.inputs.iter())
        .map(|t| super::shm::place(&t.parameters, &format!("input {}", repr::string(&t.name))))
        .collect::<Result<Vec<_>, _>>()?;
    let raw = &message.raw_input_contents;
    let in_message = places.iter().filter(|p| p.is_none()).count();
    if !raw.is_empty() && raw.len() != in_message {
        let which = if in_message == message.inputs.len() {
            String::new()
        } else {
            " not in shared memory".to_string()
        };
        return Err(ApiError::invalid(format!(
            "raw_input_contents has {} entries for {in_message} inputs{which}; give one per \
             input{which}, in the order of inputs",
            raw.len(),
        )));
    }
    let mut raws = raw.iter();
    let inputs = (message.inputs.iter().zip(places).enumerate())
        .map(|(index, (tensor, place))| {
            let source = match place {
                Some(place) => Source::SharedMemory(place),
                None => raws.next().map_or(Source::Contents, Source::Raw),
            };
            decode_input(index, tensor, source, limits)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let parameters = &message.parameters;
    let timeout_microseconds = timeout_parameter(parameters)?;
    let priority = priority_parameter(parameters)?;
    let default_raw = bool_parameter(parameters, BINARY_DATA_OUTPUT_PARAMETER, "")?.unwrap_or(true);
    Ok(InferRequest {
        id: Some(message.id.clone()).filter(|id| !id.is_empty()),
        inputs,
        outputs: requested_outputs(message, default_raw)?,
        timeout_microseconds,
        priority,
        binary_data_output: default_raw,
    })
}

/// The outputs asked for (None: all), all raw or all typed.
fn requested_outputs(
    message: &ModelInferRequest,
    default_raw: bool,
) -> Result<Option<Vec<RequestedOutput>>, ApiError> {
    if message.outputs.is_empty() {
        return Ok(None);
    }
    let outputs = message
        .outputs
        .iter()
        .enumerate()
        .map(|(index, output)| {
            let where_ = format!("outputs[{index}].");
            Ok(RequestedOutput {
                name: output.name.clone(),
                binary: bool_parameter(&output.parameters, BINARY_DATA_PARAMETER, &where_)?,
                shared_memory: super::shm::place(&output.parameters, &format!("outputs[{index}]"))?,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    // Outputs written into shared memory have no contents either way.
    let raw = (outputs.iter())
        .filter(|o| o.shared_memory.is_none())
        .map(|o| o.binary.unwrap_or(default_raw))
        .collect::<Vec<_>>();
    if raw.iter().any(|&r| r != raw[0]) {
        return Err(ApiError::invalid(
            "outputs ask for raw and for typed contents at once; a gRPC response has either \
             raw_output_contents for every output or contents for every one",
        ));
    }
    Ok(Some(outputs))
}

/// The ModelInferResponse of an answer: raw unless every output asked for typed contents
/// (and has a typed field). An output written into shared memory has its place as its
/// parameters and no contents: an empty entry of `raw_output_contents` in a raw answer (as
/// Triton answers, one entry per output, so that clients find each output's by its index).
pub fn to_model_infer_response(response: InferResponse) -> ModelInferResponse {
    let in_message = || {
        response
            .outputs
            .iter()
            .filter(|o| o.shared_memory.is_none())
    };
    let raw = in_message().next().is_none()
        || in_message().any(|o| o.binary || contents_field(o.tensor.datatype).is_none());
    let mut message = ModelInferResponse {
        model_name: response.model_name,
        model_version: response.model_version,
        id: response.id.unwrap_or_default(),
        ..ModelInferResponse::default()
    };
    for output in response.outputs {
        let tensor = output.tensor;
        let mut entry = InferOutputTensor {
            name: tensor.name.clone(),
            datatype: tensor.datatype.name().to_string(),
            shape: tensor.shape.iter().map(|&d| d as i64).collect(),
            ..InferOutputTensor::default()
        };
        if let Some(place) = &output.shared_memory {
            entry.parameters = super::shm::output_parameters(place);
            if raw {
                message.raw_output_contents.push(Bytes::new());
            }
        } else if raw {
            message
                .raw_output_contents
                .push(binary::tensor_part(&tensor));
        } else {
            entry.contents = Some(typed_contents(&tensor));
        }
        message.outputs.push(entry);
    }
    message
}

/// A tensor's elements in its datatype's typed field.
fn typed_contents(tensor: &Tensor) -> InferTensorContents {
    let mut contents = InferTensorContents::default();
    let raw: &[u8] = match &tensor.data {
        TensorData::Strings(elements) => {
            contents.bytes_contents = elements.clone();
            return contents;
        }
        TensorData::Raw(raw) => raw,
    };
    fn each<const N: usize, T>(raw: &[u8], read: impl Fn([u8; N]) -> T) -> Vec<T> {
        raw.chunks_exact(N)
            .map(|c| read(c.try_into().expect("N bytes")))
            .collect()
    }
    let c = &mut contents;
    match tensor.datatype {
        DataType::Bool => c.bool_contents = raw.iter().map(|&b| b != 0).collect(),
        DataType::I8 => c.int_contents = each(raw, |b: [u8; 1]| i32::from(i8::from_le_bytes(b))),
        DataType::I16 => c.int_contents = each(raw, |b| i32::from(i16::from_le_bytes(b))),
        DataType::I32 => c.int_contents = each(raw, i32::from_le_bytes),
        DataType::I64 => c.int64_contents = each(raw, i64::from_le_bytes),
        DataType::U8 => c.uint_contents = raw.iter().map(|&b| u32::from(b)).collect(),
        DataType::U16 => c.uint_contents = each(raw, |b| u32::from(u16::from_le_bytes(b))),
        DataType::U32 => c.uint_contents = each(raw, u32::from_le_bytes),
        DataType::U64 => c.uint64_contents = each(raw, u64::from_le_bytes),
        DataType::F32 => c.fp32_contents = each(raw, f32::from_le_bytes),
        DataType::F64 => c.fp64_contents = each(raw, f64::from_le_bytes),
        DataType::F16 | DataType::Bytes => {}
    }
    contents
}

#[cfg(test)]
mod tests;
