//! An answer as the REST body: a JSON header (keys in a fixed order), then the
//! binary outputs' bytes, each a part of its own.
//!
//! JSON numbers are written by serde_json: an integer exactly, a float in its shortest
//! round-trip form for its own precision (ryu: an FP32 output reads back bit-exact; FP16
//! is written as the FP32 of the same value, which reads back exactly too), NaN and
//! infinities as null, as orjson writes them.

use bytes::Bytes;
use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer};

use crate::codec::binary;
use crate::codec::repr;
use crate::codec::{EncodedBody, InferResponse};
use crate::error::ApiError;
use crate::request::ResponseOutput;
use crate::tensor::{DataType, Tensor, TensorData};

#[derive(Serialize)]
struct ResponseJson<'a> {
    model_name: &'a str,
    model_version: &'a str,
    outputs: Vec<OutputJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
}

#[derive(Serialize)]
struct OutputJson<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<OutputParameters<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Data<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum OutputParameters<'a> {
    Binary {
        binary_data_size: usize,
    },
    SharedMemory {
        shared_memory_region: &'a str,
        shared_memory_byte_size: usize,
        #[serde(skip_serializing_if = "is_zero")]
        shared_memory_offset: usize,
        /// Always 0: none of the output's bytes follow the JSON. Triton's C++ HTTP client
        /// (perf_analyzer) reads `binary_data_size` from every output that has parameters
        /// and fails without it; 0 keeps its walk over the binary tail in step.
        binary_data_size: usize,
    },
}

fn is_zero(offset: &usize) -> bool {
    *offset == 0
}

/// A tensor's elements as a flat JSON list (checked by [`check_output`] first).
struct Data<'a>(&'a Tensor);

/// The body of `response`: its outputs sent binary follow the JSON, in output order.
pub fn response(response: &InferResponse) -> Result<EncodedBody, ApiError> {
    let mut outputs = Vec::with_capacity(response.outputs.len());
    let mut binary_parts = Vec::new();
    for output in &response.outputs {
        check_output(output)?;
        outputs.push(output_json(output, &mut binary_parts));
    }
    let header = ResponseJson {
        model_name: &response.model_name,
        model_version: &response.model_version,
        outputs,
        id: response.id.as_deref(),
    };
    let mut json = Vec::with_capacity(json_size_hint(response));
    // Serializing these types fails only on a bug (an element check above missed).
    serde_json::to_writer(&mut json, &header).map_err(|_| ApiError::Internal)?;
    let header = Bytes::from(json);
    let header_length = (!binary_parts.is_empty()).then_some(header.len());
    let mut parts = Vec::with_capacity(1 + binary_parts.len());
    parts.push(header);
    parts.extend(binary_parts);
    Ok(EncodedBody {
        parts,
        header_length,
    })
}

/// About what the JSON takes, so that a large output's data is not copied as it grows:
/// a float is up to ~16 characters and a comma, most integers fewer.
fn json_size_hint(response: &InferResponse) -> usize {
    let data: usize = response
        .outputs
        .iter()
        .filter(|output| !output.binary && output.shared_memory.is_none())
        .map(|output| match &output.tensor.data {
            TensorData::Raw(raw) => {
                raw.len() / output.tensor.datatype.item_size().unwrap_or(1) * 12
            }
            TensorData::Strings(elements) => elements.iter().map(|e| e.len() + 3).sum(),
        })
        .sum();
    256 + 128 * response.outputs.len() + data
}

fn output_json<'a>(output: &'a ResponseOutput, binary_parts: &mut Vec<Bytes>) -> OutputJson<'a> {
    let tensor = &output.tensor;
    let (parameters, data) = if let Some(memory) = &output.shared_memory {
        let parameters = OutputParameters::SharedMemory {
            shared_memory_region: &memory.region,
            shared_memory_byte_size: memory.byte_size,
            shared_memory_offset: memory.offset,
            binary_data_size: 0,
        };
        (Some(parameters), None)
    } else if output.binary {
        let part = binary::tensor_part(tensor);
        let parameters = OutputParameters::Binary {
            binary_data_size: part.len(),
        };
        binary_parts.push(part);
        (Some(parameters), None)
    } else {
        (None, Some(Data(tensor)))
    };
    OutputJson {
        name: &tensor.name,
        datatype: tensor.datatype.name(),
        shape: &tensor.shape,
        parameters,
        data,
    }
}

/// An output whose data is not its shape's elements of its datatype is the engine
/// adapter's bug (500); a BYTES output that is not UTF-8 cannot be JSON (400, with the
/// remedy: ask for it in binary).
fn check_output(output: &ResponseOutput) -> Result<(), ApiError> {
    let tensor = &output.tensor;
    let count = tensor.element_count();
    let consistent = match (&tensor.data, tensor.datatype.item_size()) {
        (TensorData::Raw(raw), Some(size)) => count.checked_mul(size) == Some(raw.len()),
        (TensorData::Strings(elements), None) => elements.len() == count,
        _ => false,
    };
    if !consistent {
        return Err(ApiError::Internal);
    }
    let as_json = !output.binary && output.shared_memory.is_none();
    if let (true, TensorData::Strings(elements)) = (as_json, &tensor.data) {
        if elements.iter().any(|e| std::str::from_utf8(e).is_err()) {
            return Err(ApiError::invalid(format!(
                "output {} holds bytes that are not UTF-8 text, which JSON cannot carry; ask \
                 for it in binary (the output's binary_data parameter)",
                repr::string(&tensor.name)
            )));
        }
    }
    Ok(())
}

impl Serialize for Data<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw = match &self.0.data {
            TensorData::Strings(elements) => return strings(serializer, elements),
            TensorData::Raw(raw) => raw.as_ref(),
        };
        match self.0.datatype {
            DataType::Bool => elements(serializer, raw, |[b]: [u8; 1]| b != 0),
            DataType::U8 => elements(serializer, raw, u8::from_le_bytes),
            DataType::U16 => elements(serializer, raw, u16::from_le_bytes),
            DataType::U32 => elements(serializer, raw, u32::from_le_bytes),
            DataType::U64 => elements(serializer, raw, u64::from_le_bytes),
            DataType::I8 => elements(serializer, raw, i8::from_le_bytes),
            DataType::I16 => elements(serializer, raw, i16::from_le_bytes),
            DataType::I32 => elements(serializer, raw, i32::from_le_bytes),
            DataType::I64 => elements(serializer, raw, i64::from_le_bytes),
            DataType::F16 => elements(serializer, raw, |b| half::f16::from_le_bytes(b).to_f32()),
            DataType::F32 => elements(serializer, raw, f32::from_le_bytes),
            DataType::F64 => elements(serializer, raw, f64::from_le_bytes),
            DataType::Bytes => Err(serde::ser::Error::custom("raw data in a BYTES tensor")),
        }
    }
}

/// Each `N` bytes of `raw` as one element.
fn elements<S: Serializer, T: Serialize, const N: usize>(
    serializer: S,
    raw: &[u8],
    read: impl Fn([u8; N]) -> T,
) -> Result<S::Ok, S::Error> {
    let mut seq = serializer.serialize_seq(Some(raw.len() / N))?;
    for chunk in raw.chunks_exact(N) {
        let bytes: [u8; N] = chunk.try_into().expect("chunks_exact gives N bytes");
        seq.serialize_element(&read(bytes))?;
    }
    seq.end()
}

fn strings<S: Serializer>(serializer: S, elements: &[Bytes]) -> Result<S::Ok, S::Error> {
    let mut seq = serializer.serialize_seq(Some(elements.len()))?;
    for element in elements {
        let text = std::str::from_utf8(element).map_err(serde::ser::Error::custom)?;
        seq.serialize_element(text)?;
    }
    seq.end()
}
