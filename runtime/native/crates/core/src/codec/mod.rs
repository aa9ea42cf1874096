//! The Open Inference Protocol's REST body to an [`InferRequest`] and an answer back.
//!
//! Both the JSON tensor form (`"data": [...]`) and Triton's binary tensor data extension
//! are handled, for requests and responses: with the extension the body is a JSON header
//! of `Inference-Header-Content-Length` bytes followed by raw little-endian tensors, in
//! input order, each announced by a `binary_data_size` parameter. An output is sent binary
//! when its requested `binary_data` parameter is true, or else when the request-level
//! `binary_data_output` parameter is. BYTES tensors are JSON strings or, binary, Triton's
//! length-prefixed elements ([`bytes`]). An input may instead name a registered
//! shared-memory region (`shared_memory_region`, `shared_memory_byte_size`,
//! `shared_memory_offset`): it decodes to [`InputSource::SharedMemory`], which the server
//! resolves.
//!
//! Everything a client can get wrong is an [`ApiError::InvalidRequest`] naming the field
//! (or [`ApiError::TooLarge`] for a body holding more than the model can take), never
//! anything else. Nothing is materialised before it is bounded ([`DecodeLimits`]): a large
//! JSON body's value count is compared with what the model's inputs can hold before it is
//! parsed, each tensor's declared shape with the model's largest tensor and with the data's
//! length before the data is converted. JSON data is read strictly ([`data`]): a numeric
//! tensor takes numbers only, an integer tensor integers in its range only, a BOOL tensor
//! booleans only, a BYTES tensor strings only; flat or nested to match the shape.
//!
//! Floats are written in their shortest round-trip form for their own precision (a float32
//! reads back bit-exact); NaN and infinities, which JSON cannot carry, are written as null.
//!
//! [`ApiError::InvalidRequest`]: crate::error::ApiError::InvalidRequest
//! [`ApiError::TooLarge`]: crate::error::ApiError::TooLarge

pub mod binary;
pub mod bytes;
pub mod data;
mod flat;
pub mod inflate;
pub mod json;
mod loose;
pub mod repr;

pub use crate::request::{InferRequest, InferResponse, InputSource};

/// What one request may make the decoder build (None: unbounded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Elements of any one tensor: the model's largest input at maxBatchSize rows.
    pub max_elements: Option<usize>,
    /// Values the JSON part of a body may hold ([`json::json_value_count`]).
    pub max_json_values: Option<usize>,
}

/// An encoded REST answer: its body in parts (the JSON, then any binary tensors, each a
/// part of its own so that an output buffer is never copied to join them), and the length
/// of its JSON part when binary parts follow (the `Inference-Header-Content-Length`
/// response header).
#[derive(Clone, Debug, PartialEq)]
pub struct EncodedBody {
    /// The JSON, then each binary output's bytes, in output order.
    pub parts: Vec<::bytes::Bytes>,
    /// The JSON part's length when binary parts follow (None: the body is all JSON).
    pub header_length: Option<usize>,
}

impl EncodedBody {
    /// Bytes of the whole body.
    pub fn len(&self) -> usize {
        self.parts.iter().map(::bytes::Bytes::len).sum()
    }

    /// No bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
