//! The REST body's JSON: an infer request decoded strictly, an answer encoded.
//!
//! Decoding checks the request's fields in a fixed order, in the words the black-box tests
//! read: the value count of a large body before it is parsed, then
//! the JSON, the id, each input (name, datatype, shape, its element count against the
//! model's largest input, its parameters, then its data: binary, shared memory or JSON),
//! the binary bytes no input claims, the request's parameters, the outputs asked for.

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::codec::binary::{self, BinaryPart};
use crate::codec::bytes as strings;
use crate::codec::loose::{Fields, ListOf, ObjectOf, RequestTop};
use crate::codec::{DecodeLimits, EncodedBody, data, repr};
use crate::error::ApiError;
use crate::request::{
    BINARY_DATA_OUTPUT_PARAMETER, BINARY_DATA_PARAMETER, BINARY_DATA_SIZE_PARAMETER, DecodedInput,
    InferRequest, InferResponse, InputSource, PRIORITY_PARAMETER, RequestedOutput,
    SHARED_MEMORY_BYTE_SIZE_PARAMETER, SHARED_MEMORY_OFFSET_PARAMETER,
    SHARED_MEMORY_REGION_PARAMETER, SharedMemoryRef, TIMEOUT_PARAMETER,
};
use crate::tensor::{DataType, TensorData};

mod encode;

/// numpy's own limit; a model never has more dimensions.
pub const MAX_RANK: usize = 64;

/// JSON this large or larger has its values counted before it is parsed.
pub const COUNT_VALUES_FROM_BYTES: usize = 1 << 20;

/// Bytes numpy gives a BYTES element (an object pointer) when it sizes an array.
const OBJECT_ITEM_SIZE: usize = 8;

/// Parses an infer request body; `header_length` is the value of the
/// Inference-Header-Content-Length header (None when the body is all JSON).
pub fn decode_request(
    body: &Bytes,
    header_length: Option<usize>,
    limits: &DecodeLimits,
) -> Result<InferRequest, ApiError> {
    let (header, binary) = binary::split_body(body, header_length)?;
    check_value_count(&header, limits)?;
    let (fields, inputs) = parse_top(&header)?;
    let id = match parsed(fields.get("id").copied())? {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id),
        Some(_) => return Err(ApiError::invalid("id must be a string")),
    };
    let mut part = BinaryPart::new(binary);
    let inputs = decode_inputs(inputs, &mut part, limits)?;
    part.finish("input")?;
    let parameters = parameters(parsed(fields.get("parameters").copied())?, "request")?;
    Ok(InferRequest {
        id,
        inputs,
        timeout_microseconds: natural_parameter(
            &parameters,
            TIMEOUT_PARAMETER,
            "parameters.timeout must be an integer (microseconds) >= 0",
        )?,
        priority: natural_parameter(
            &parameters,
            PRIORITY_PARAMETER,
            "parameters.priority must be an integer >= 0",
        )?
        .unwrap_or(0),
        binary_data_output: binary_data_output(&parameters)?,
        outputs: decode_outputs(parsed(fields.get("outputs").copied())?)?,
    })
}

/// The body (JSON, and binary parts for the outputs sent binary) of an answer.
pub fn encode_response(response: &InferResponse) -> Result<EncodedBody, ApiError> {
    encode::response(response)
}

/// A 413 for a large JSON header holding more values than the model's inputs can take,
/// before it is parsed (parsing is what would cost).
fn check_value_count(header: &[u8], limits: &DecodeLimits) -> Result<(), ApiError> {
    let Some(max) = limits.max_json_values else {
        return Ok(());
    };
    if header.len() < COUNT_VALUES_FROM_BYTES {
        return Ok(());
    }
    let values = json_value_count(header);
    if values <= max {
        return Ok(());
    }
    Err(ApiError::TooLarge(format!(
        "the JSON request holds up to {values} values (counted by its commas and brackets), \
         more than this model's inputs can take ({max}); it was not parsed"
    )))
}

type Inputs<'a> = Option<ListOf<ObjectOf<'a>>>;

/// The request's fields and its inputs, in the one pass that validates the JSON.
fn parse_top(header: &[u8]) -> Result<(Fields<'_>, Inputs<'_>), ApiError> {
    let top: RequestTop<'_> = serde_json::from_slice(header).map_err(malformed)?;
    top.0
        .ok_or_else(|| ApiError::invalid("the request must be a JSON object"))
}

fn malformed(error: serde_json::Error) -> ApiError {
    ApiError::invalid(format!("malformed JSON request: {error}"))
}

/// A field's value (None when absent), read from its raw text.
fn parsed(raw: Option<&RawValue>) -> Result<Option<Value>, ApiError> {
    raw.map(|raw| serde_json::from_str(raw.get()).map_err(malformed))
        .transpose()
}

/// An object's `parameters`: absent is none; anything but an object (null too) a 400.
fn parameters(value: Option<Value>, owner: &str) -> Result<Map<String, Value>, ApiError> {
    match value {
        None => Ok(Map::new()),
        Some(Value::Object(parameters)) => Ok(parameters),
        Some(_) => Err(ApiError::invalid(format!(
            "{owner}.parameters must be an object"
        ))),
    }
}

/// A parameter's value; null reads as absent (as Python's `dict.get` of a JSON null).
fn given<'m>(parameters: &'m Map<String, Value>, name: &str) -> Option<&'m Value> {
    parameters.get(name).filter(|value| !value.is_null())
}

/// An integer >= 0 (a JSON integer: not a float, not a boolean) that fits in `usize`.
fn natural(value: &Value) -> Option<usize> {
    value.as_u64().and_then(|n| usize::try_from(n).ok())
}

fn natural_parameter(
    parameters: &Map<String, Value>,
    name: &str,
    refusal: &str,
) -> Result<Option<u64>, ApiError> {
    given(parameters, name)
        .map(|value| value.as_u64().ok_or_else(|| ApiError::invalid(refusal)))
        .transpose()
}

/// The request's `binary_data_output`: false when absent; anything but a boolean, null
/// too, is refused (a null is given, not absent, and is no boolean).
fn binary_data_output(parameters: &Map<String, Value>) -> Result<bool, ApiError> {
    match parameters.get(BINARY_DATA_OUTPUT_PARAMETER) {
        None => Ok(false),
        Some(Value::Bool(binary)) => Ok(*binary),
        Some(_) => Err(ApiError::invalid(
            "parameters.binary_data_output must be a boolean",
        )),
    }
}

fn decode_inputs(
    inputs: Inputs<'_>,
    part: &mut BinaryPart,
    limits: &DecodeLimits,
) -> Result<Vec<DecodedInput>, ApiError> {
    let inputs = match inputs {
        Some(ListOf(Some(inputs))) if !inputs.is_empty() => inputs,
        _ => return Err(ApiError::invalid("inputs must be a non-empty list")),
    };
    inputs
        .into_iter()
        .enumerate()
        .map(|(index, input)| decode_input(index, input, part, limits))
        .collect()
}

/// One input: its fields checked in order (name, datatype, shape, ...), then its data.
fn decode_input(
    index: usize,
    input: ObjectOf<'_>,
    part: &mut BinaryPart,
    limits: &DecodeLimits,
) -> Result<DecodedInput, ApiError> {
    let Some(fields) = input.0 else {
        return Err(ApiError::invalid(format!(
            "inputs[{index}] must be an object"
        )));
    };
    let name = match parsed(fields.get("name").copied())? {
        Some(Value::String(name)) if !name.is_empty() => name,
        _ => {
            return Err(ApiError::invalid(format!(
                "inputs[{index}].name must be a non-empty string"
            )));
        }
    };
    let what = format!("input {}", repr::string(&name));
    let datatype = datatype(parsed(fields.get("datatype").copied())?, &what)?;
    let shape = shape(parsed(fields.get("shape").copied())?, &what)?;
    let count = element_count(&shape);
    check_max_elements(&shape, count, limits, &what)?;
    let parameters = parameters(parsed(fields.get("parameters").copied())?, &what)?;
    let tensor = Declared {
        datatype,
        shape: &shape,
        count,
        what: &what,
    };
    let source = if let Some(memory) = shared_memory(&parameters, |m| format!("{what}: {m}"))? {
        tensor.check_shared_memory(&memory, &parameters, &fields)?;
        InputSource::SharedMemory(memory)
    } else if let Some(size) = given(&parameters, BINARY_DATA_SIZE_PARAMETER) {
        InputSource::Data(tensor.binary(size, part)?)
    } else {
        InputSource::Data(tensor.json(fields.get("data").copied())?)
    };
    check_addressable(&shape, datatype, &what)?;
    Ok(DecodedInput {
        name,
        datatype,
        shape,
        source,
    })
}

fn datatype(value: Option<Value>, what: &str) -> Result<DataType, ApiError> {
    if let Some(datatype) = value
        .as_ref()
        .and_then(Value::as_str)
        .and_then(DataType::from_name)
    {
        return Ok(datatype);
    }
    let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
    Err(ApiError::invalid(format!(
        "{what}: datatype {} is not supported (one of {})",
        repr::value(&value.unwrap_or(Value::Null)),
        names.join(", ")
    )))
}

fn shape(value: Option<Value>, what: &str) -> Result<Vec<usize>, ApiError> {
    let dims: Option<Vec<usize>> = match &value {
        Some(Value::Array(dims)) => dims.iter().map(natural).collect(),
        _ => None,
    };
    let Some(dims) = dims else {
        return Err(ApiError::invalid(format!(
            "{what}.shape must be a list of non-negative integers"
        )));
    };
    if dims.len() > MAX_RANK {
        return Err(ApiError::invalid(format!(
            "{what}.shape has {} dimensions; at most {MAX_RANK}",
            dims.len()
        )));
    }
    Ok(dims)
}

/// The elements `shape` declares; None when past `usize` (no data can match it).
fn element_count(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |count, &dim| count.checked_mul(dim))
}

fn check_max_elements(
    shape: &[usize],
    count: Option<usize>,
    limits: &DecodeLimits,
    what: &str,
) -> Result<(), ApiError> {
    let Some(max) = limits.max_elements else {
        return Ok(());
    };
    if count.is_some_and(|count| count <= max) {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "{what}: shape {} declares {} elements; this model takes at most {max} per input",
        repr::shape(shape),
        repr::product(shape, 1)
    )))
}

/// numpy's refusal of an array of 0 elements whose other dimensions overflow its sizes
/// (one with elements met a data length that cannot match first).
fn check_addressable(shape: &[usize], datatype: DataType, what: &str) -> Result<(), ApiError> {
    let item_size = datatype.item_size().unwrap_or(OBJECT_ITEM_SIZE);
    let bytes = shape
        .iter()
        .filter(|&&dim| dim != 0)
        .try_fold(item_size, |bytes, &dim| bytes.checked_mul(dim));
    if bytes.is_some_and(|bytes| isize::try_from(bytes).is_ok()) {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "{what}: shape {} cannot be used: array is too big; `arr.size * arr.dtype.itemsize` \
         is larger than the maximum possible size.",
        repr::shape(shape)
    )))
}

/// A shared-memory place from `parameters` (None when no region is named); `refusal`
/// words a parameter's error.
fn shared_memory(
    parameters: &Map<String, Value>,
    refusal: impl Fn(&str) -> String,
) -> Result<Option<SharedMemoryRef>, ApiError> {
    let Some(region) = given(parameters, SHARED_MEMORY_REGION_PARAMETER) else {
        return Ok(None);
    };
    let Value::String(region) = region else {
        return Err(ApiError::invalid(refusal(
            "shared_memory_region must be a string",
        )));
    };
    let byte_size = given(parameters, SHARED_MEMORY_BYTE_SIZE_PARAMETER)
        .and_then(natural)
        .ok_or_else(|| {
            ApiError::invalid(refusal("shared_memory_byte_size must be an integer >= 0"))
        })?;
    let offset = match given(parameters, SHARED_MEMORY_OFFSET_PARAMETER) {
        None => 0,
        Some(offset) => natural(offset).ok_or_else(|| {
            ApiError::invalid(refusal("shared_memory_offset must be an integer >= 0"))
        })?,
    };
    Ok(Some(SharedMemoryRef {
        region: region.clone(),
        offset,
        byte_size,
    }))
}

/// An input's declared datatype and shape, which its data must match.
struct Declared<'d> {
    datatype: DataType,
    shape: &'d [usize],
    /// None: past `usize`.
    count: Option<usize>,
    what: &'d str,
}

impl Declared<'_> {
    /// Bytes the shape's elements take (None: BYTES, or past `usize`).
    fn byte_size(&self) -> Option<usize> {
        self.count?.checked_mul(self.datatype.item_size()?)
    }

    fn size_mismatch(&self, parameter: &str, size: usize) -> ApiError {
        let item_size = self.datatype.item_size().unwrap_or(1);
        ApiError::invalid(format!(
            "{}: {parameter} {size} does not match shape {} of {} ({} bytes)",
            self.what,
            repr::shape(self.shape),
            self.datatype.name(),
            repr::product(self.shape, item_size)
        ))
    }

    /// The next `size` bytes of the binary part, checked against the shape.
    fn binary(&self, size: &Value, part: &mut BinaryPart) -> Result<TensorData, ApiError> {
        let what = self.what;
        let size = natural(size).ok_or_else(|| {
            ApiError::invalid(format!("{what}: binary_data_size must be an integer >= 0"))
        })?;
        let chunk = part.take(size, what)?;
        if self.datatype.item_size().is_some() && self.byte_size().is_none() {
            return Err(self.size_mismatch(BINARY_DATA_SIZE_PARAMETER, size));
        }
        let Some(count) = self.count else {
            return Err(self.strings_past_usize(chunk));
        };
        binary::tensor_data(chunk, self.datatype, self.shape, count, what, true)
    }

    /// The refusal of BYTES data for a shape whose count is past `usize` (no buffer holds
    /// that many elements): the reader's own, with the count as Python prints it.
    fn strings_past_usize(&self, chunk: Bytes) -> ApiError {
        // Each element takes 4 bytes at least: the reader always stops short of the count.
        let Err(error) = strings::deserialize(&chunk, usize::MAX, self.what) else {
            return ApiError::Internal;
        };
        let exact = format!(" of {} elements", repr::product(self.shape, 1));
        ApiError::invalid(error.message().replacen(
            &format!(" of {} elements", usize::MAX),
            &exact,
            1,
        ))
    }

    /// The JSON `data`, which must be a list.
    fn json(&self, data: Option<&RawValue>) -> Result<TensorData, ApiError> {
        let Some(data) = data.filter(|data| data.get().starts_with('[')) else {
            return Err(ApiError::invalid(format!(
                "{}: 'data' must be a list (or use binary_data_size)",
                self.what
            )));
        };
        let count = self.count.unwrap_or(usize::MAX);
        data::read(data, self.datatype, self.shape, count, self.what)
    }

    /// A shared-memory input carries no data of its own, and a fixed-size one's byte size
    /// is its shape's.
    fn check_shared_memory(
        &self,
        memory: &SharedMemoryRef,
        parameters: &Map<String, Value>,
        fields: &Fields<'_>,
    ) -> Result<(), ApiError> {
        if given(parameters, BINARY_DATA_SIZE_PARAMETER).is_some() || fields.contains_key("data") {
            return Err(ApiError::invalid(format!(
                "{}: shared_memory_region cannot be combined with binary_data_size or data",
                self.what
            )));
        }
        if self.datatype.item_size().is_some() && self.byte_size() != Some(memory.byte_size) {
            return Err(self.size_mismatch(SHARED_MEMORY_BYTE_SIZE_PARAMETER, memory.byte_size));
        }
        Ok(())
    }
}

fn decode_outputs(value: Option<Value>) -> Result<Option<Vec<RequestedOutput>>, ApiError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid("outputs must be a list")),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| decode_output(index, item))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn decode_output(index: usize, item: Value) -> Result<RequestedOutput, ApiError> {
    let where_ = format!("outputs[{index}]");
    let refusal = || ApiError::invalid(format!("{where_} must be an object with a string name"));
    let Value::Object(mut object) = item else {
        return Err(refusal());
    };
    let Some(Value::String(name)) = object.remove("name") else {
        return Err(refusal());
    };
    let parameters = parameters(object.remove("parameters"), &where_)?;
    let binary = match given(&parameters, BINARY_DATA_PARAMETER) {
        None => None,
        Some(Value::Bool(binary)) => Some(*binary),
        Some(_) => {
            return Err(ApiError::invalid(format!(
                "{where_}.parameters.binary_data must be a boolean"
            )));
        }
    };
    let shared_memory = shared_memory(&parameters, |m| format!("{where_}.parameters.{m}"))?;
    Ok(RequestedOutput {
        name,
        binary,
        shared_memory,
    })
}

/// An upper bound on the JSON values `document` holds, from its commas and opening
/// brackets (nothing parsed).
pub fn json_value_count(document: &[u8]) -> usize {
    // Separators inside strings count too, which only makes the bound larger.
    document
        .iter()
        .filter(|&&b| matches!(b, b',' | b'[' | b'{'))
        .count()
        + 1
}

/// The most JSON values a valid request to a model with these inputs (item shapes, batch
/// axis left out) can hold at `max_rows` rows; None when an item axis is unbounded.
pub fn model_json_value_limit(
    item_shapes: &[Option<Vec<usize>>],
    max_rows: usize,
) -> Option<usize> {
    // Every element, every list of the nested form, and room for the rest of the request.
    let mut total = HEADER_VALUES;
    for item in item_shapes {
        let (mut lists, mut rows) = (1usize, max_rows);
        for &dim in item.as_ref()? {
            lists = lists.saturating_add(rows);
            rows = rows.saturating_mul(dim);
        }
        total = total.saturating_add(rows).saturating_add(lists);
    }
    Some(total)
}

/// Values a request holds besides its tensors' data: shapes, names, parameters, outputs.
const HEADER_VALUES: usize = 4096;

#[cfg(test)]
mod tests;
