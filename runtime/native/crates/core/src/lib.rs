//! The pure core of kubeinfer's data plane: no I/O, no clock, no Python.
//!
//! - [`tensor`]: datatypes, the model's tensor specs, decoded tensors;
//! - [`request`]: an inference request and its answer, as the transports hand them over;
//! - [`error`]: the one error type, which carries its HTTP status and gRPC code;
//! - [`codec`]: the Open Inference Protocol's REST body (JSON, Triton's binary tensor
//!   extension, BYTES) to a [`request::InferRequest`] and an answer back;
//! - [`batching`]: admission, the flush policy (Static and Adaptive), the sequence shapes a
//!   batch may hold, the scheduler that decides what runs on which slot and when, and the
//!   assembly of requests' rows into a slot's buffers and of its outputs back.
//!
//! Time is a [`batching::Time`] passed in by the caller (a monotonic clock's reading), so
//! every decision replays on a fake clock in tests.

pub mod batching;
pub mod codec;
pub mod error;
pub mod request;
pub mod tensor;
