//! What the server asks of an engine: its tensors, its batch bound, and execution slots that
//! each run one batch at a time. The Python extension (`kubeinfer_dataplane`) implements it
//! over the Python engine's slots, taking the GIL once per batch: `Slot::run` is that one
//! crossing (the input buffers are the slot's own preallocated ones, filled by `fill`
//! while the GIL is held, then the engine runs and its outputs are copied out). Tests
//! implement it in Rust.

use dataplane_core::batching::BatchShape;
use dataplane_core::error::ApiError;
use dataplane_core::tensor::{Tensor, TensorSpec};

/// One input's buffer of a batch, as the slot holds it.
pub enum InputBuffer<'a> {
    /// A fixed-size datatype: exactly the batch's rows at its item shape, row-major,
    /// little-endian (the slot's own memory: pinned on a GPU).
    Fixed(&'a mut [u8]),
    /// BYTES elements: the batch's elements, row-major, pushed by `fill`.
    Elements(&'a mut Vec<bytes::Bytes>),
}

/// Why a batch failed on the engine: the engine's own message (answered 500 to each of the
/// batch's requests, naming the model), or the server's packing refused (answered as its
/// `ApiError` says).
#[derive(Debug)]
pub enum RunError {
    Engine(String),
    Fill(ApiError),
}

/// One execution slot: its own buffers, one batch at a time.
pub trait Slot: Send + 'static {
    /// Runs one batch of `rows` rows (at `shape`, for a model with variable axes): `fill`
    /// is handed the batch's input buffers in the model's input order and lays the
    /// requests' rows into them; then the engine runs, and each output comes back, in
    /// the model's output order, as a tensor the server owns (checked against the rows by
    /// `assembly::check_output_rows` before any row is handed out).
    fn run(
        &mut self,
        rows: usize,
        shape: Option<&BatchShape>,
        fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
    ) -> Result<Vec<Tensor>, RunError>;

    /// [`Slot::run`], then `after` with its outcome before the slot lets go of what it
    /// ran the batch with: the Python slot calls `after` with the GIL still held, so what
    /// the server does there (its mirrored requests handed over) is in the batch's one
    /// crossing. The default runs, then calls `after`.
    fn run_then(
        &mut self,
        rows: usize,
        shape: Option<&BatchShape>,
        fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
        after: &mut dyn FnMut(Result<Vec<Tensor>, RunError>),
    ) {
        let outcome = self.run(rows, shape, fill);
        after(outcome);
    }
}

/// A loaded engine.
pub trait Engine: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn version(&self) -> &str;
    fn inputs(&self) -> &[TensorSpec];
    fn outputs(&self) -> &[TensorSpec];
    fn max_batch_size(&self) -> usize;
    /// The `platform` of the model's metadata (the Python engine's, e.g. `onnxruntime`).
    fn platform(&self) -> &str {
        ""
    }
    /// A new slot with its own buffers (the server makes as many as it runs batches at
    /// once, at start).
    fn create_slot(&self) -> Result<Box<dyn Slot>, String>;
}
