//! Batching, as pure decisions: what the server admits, which queued requests run together
//! on which execution slot and when, and how their rows are laid into the slot's buffers and
//! taken back out. No I/O and no clock: every function is given `now` (a [`Time`]), and the
//! server's tokio driver carries out what they decide (`kubeinfer-dataplane-server`).
//!
//! - [`config`]: the batching policy as the runtime's configuration states it;
//! - [`admission`]: which arriving requests are taken, before their body is read, and their
//!   deadlines, counted from arrival;
//! - [`policy`]: the flush rules of the Static policy (when to run what);
//! - [`adaptive`]: the Adaptive policy's choice of queue delay, preferred batch size and
//!   batches at once, from the compute times and arrivals measured, against the SLO;
//! - [`shapes`]: which input shapes a model takes and which batch a request may join
//!   (EqualShapes, PadToBuckets), with the padding and the cutting back that takes;
//! - [`scheduler`]: the queue (by priority, then arrival), the slots, the watchdog's bound on
//!   a running batch: events in (a request queued, a batch finished, time passed), commands
//!   out (run these on that slot, answer those, wake me at);
//! - [`assembly`]: requests' rows packed into a slot's input buffers and each request's rows
//!   of the outputs taken back, checked to be the batch's own.

pub mod adaptive;
pub mod admission;
pub mod assembly;
pub mod config;
pub mod policy;
pub mod scheduler;
#[cfg(test)]
mod seeded;
pub mod shapes;

/// A reading of the server's monotonic clock: the time since its origin (the server's
/// start), so that tests replay events on a fake clock with plain durations.
pub type Time = std::time::Duration;

/// The item shape of each input of a batch, in the model's input order: what a slot of a
/// model with variable axes is told with the batch's rows.
pub type BatchShape = Vec<Vec<usize>>;
