//! An inference request as a transport hands it over once decoded, and its answer as the
//! transport encodes it: the same for REST and gRPC (their codecs translate their wire
//! forms to these types and back, and nothing after them knows which one a request came by).

use crate::tensor::{DataType, Tensor, TensorData};

/// Request-level parameters the server reads (Triton's names); others are ignored.
pub const TIMEOUT_PARAMETER: &str = "timeout"; // microseconds, as tritonclient's `timeout=` sends it
pub const PRIORITY_PARAMETER: &str = "priority"; // 0: the default level; 1 is the most urgent
pub const BINARY_DATA_OUTPUT_PARAMETER: &str = "binary_data_output";
/// Tensor-level parameters.
pub const BINARY_DATA_PARAMETER: &str = "binary_data";
pub const BINARY_DATA_SIZE_PARAMETER: &str = "binary_data_size";
pub const SHARED_MEMORY_REGION_PARAMETER: &str = "shared_memory_region";
pub const SHARED_MEMORY_BYTE_SIZE_PARAMETER: &str = "shared_memory_byte_size";
pub const SHARED_MEMORY_OFFSET_PARAMETER: &str = "shared_memory_offset";
/// The REST header giving the length of a binary body's JSON part.
pub const HEADER_LENGTH_HEADER: &str = "inference-header-content-length";

/// A tensor's place in a registered shared-memory region (the v2 shared-memory extension):
/// `byte_size` bytes from `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedMemoryRef {
    pub region: String,
    pub offset: usize,
    pub byte_size: usize,
}

/// Where an input's elements are.
#[derive(Clone, Debug, PartialEq)]
pub enum InputSource {
    /// In the request itself (JSON data, binary data, gRPC contents).
    Data(TensorData),
    /// In a registered shared-memory region, read when the batch is assembled.
    SharedMemory(SharedMemoryRef),
}

/// One input as decoded: its declared name, datatype and shape, and its elements (already
/// checked to be exactly the shape's count when they came in the request).
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedInput {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<usize>,
    pub source: InputSource,
}

/// An output the client asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestedOutput {
    pub name: String,
    /// Its `binary_data` parameter; None when it did not say (the request's
    /// `binary_data_output` decides).
    pub binary: Option<bool>,
    /// Its shared-memory parameters: written there, not into the answer.
    pub shared_memory: Option<SharedMemoryRef>,
}

/// A decoded inference request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InferRequest {
    pub id: Option<String>,
    pub inputs: Vec<DecodedInput>,
    /// The outputs asked for (None: all of them, as the request's default says).
    pub outputs: Option<Vec<RequestedOutput>>,
    /// Its own deadline, from its arrival (None or 0: the server's default).
    pub timeout_microseconds: Option<u64>,
    /// 0 (or absent): the default level; 1 is the most urgent.
    pub priority: u64,
    pub binary_data_output: bool,
}

/// One output of an answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseOutput {
    pub tensor: Tensor,
    /// Sent as binary data (REST's extension) rather than JSON.
    pub binary: bool,
    /// Written into this shared-memory region already: the answer carries only its
    /// parameters.
    pub shared_memory: Option<SharedMemoryRef>,
}

/// An answer to an inference request.
#[derive(Clone, Debug, PartialEq)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: String,
    pub id: Option<String>,
    pub outputs: Vec<ResponseOutput>,
}
