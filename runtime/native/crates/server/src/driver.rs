//! The scheduler's driver: `step` after every event and when the time it named comes, its
//! decisions carried out (expired and gone requests answered or dropped, stuck batches'
//! requests answered EngineTimeout, batches handed to their slot's thread), and the slots'
//! threads, each running one batch at a time through [`Slot::run`].

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use dataplane_core::batching::Time;
use dataplane_core::batching::assembly::{
    BatchOutput, OutputData, pack_input, row_ranges, split_outputs,
};
use dataplane_core::batching::scheduler::{RunBatch, Step};
use dataplane_core::error::ApiError;
use dataplane_core::tensor::{Tensor, TensorData};

use crate::engine::{InputBuffer, RunError, Slot};
use crate::model::{Model, quoted};
use crate::state::{Answer, Pending, Shared};

/// A batch for a slot's thread.
pub type Job = RunBatch<Pending>;

/// Steps the scheduler until `stop` says so, sleeping until the next event or `wake_at`.
pub async fn drive(
    shared: Arc<Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    slots: Vec<mpsc::Sender<Job>>,
) {
    loop {
        let wake_at = step_once(&shared, &slots);
        if *stop.borrow() {
            return;
        }
        let sleep = async {
            match wake_at {
                Some(at) => tokio::time::sleep(at.saturating_sub(shared.now())).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = sleep => {}
            _ = stop.changed() => {}
        }
    }
}

/// One step, decided under the lock and carried out after it.
fn step_once(shared: &Shared, slots: &[mpsc::Sender<Job>]) -> Option<Time> {
    let now = shared.now();
    let (step, stuck) = {
        let mut core = shared.core();
        let step = core.scheduler.step(now);
        for batch in &step.run {
            let replies = batch
                .members
                .iter()
                .map(|m| m.payload.reply.clone())
                .collect();
            core.running.insert(batch.id, replies);
        }
        let stuck: Vec<_> = step
            .stuck
            .iter()
            .filter_map(|id| core.running.remove(id))
            .collect();
        (step, stuck)
    };
    let Step {
        run,
        expired,
        gone,
        wake_at,
        ..
    } = step;
    for request in expired {
        let error = request.payload.admission.expired(now, request.queued_at);
        request.payload.reply.send(Err(error));
    }
    if !gone.is_empty() {
        log::debug!(
            "Dropped requests whose clients left before they ran count={}",
            gone.len()
        );
    }
    for replies in stuck {
        log::error!(
            "Engine has not returned a batch past its requests' deadlines requests={}; \
             readiness is off until it returns",
            replies.len()
        );
        let error = ApiError::EngineTimeout(
            "the engine did not finish this request's batch by its deadline; the engine may be stuck".into(),
        );
        for reply in replies {
            reply.send(Err(error.clone()));
        }
    }
    for batch in run {
        let queued = batch
            .members
            .iter()
            .map(|m| now.saturating_sub(m.arrived_at));
        shared.metrics.batch_started(batch.rows, queued);
        if let Err(mpsc::SendError(batch)) = slots[batch.slot].send(batch) {
            fail_batch(&batch, &ApiError::NotReady("the server stopped".into()));
        }
    }
    wake_at
}

/// The thread of one slot: runs each batch it is handed, answers its requests, hands the
/// sampled ones to the mirrors (inside the batch's run: [`Slot::run_then`]), tells the
/// scheduler, until the server drops its sender.
pub fn slot_thread(shared: Arc<Shared>, mut slot: Box<dyn Slot>, jobs: mpsc::Receiver<Job>) {
    for batch in jobs {
        let started = Instant::now();
        let pads = |index: usize| {
            if shared.plan.variable() {
                shared.plan.pad_value(index)
            } else {
                None
            }
        };
        let mut was_stuck = None; // Some once the batch's end is recorded
        let run = AssertUnwindSafe(|| {
            let mut after = |outputs: Result<Vec<Tensor>, RunError>| {
                let outcome = outputs
                    .map_err(run_failed)
                    .and_then(|outputs| split_answers(&shared.model, &batch, &outputs));
                was_stuck = Some(finish_batch(
                    &shared,
                    &batch,
                    started,
                    outcome.as_ref().err(),
                ));
                // The slot is free in the scheduler from here: the driver forms the next
                // batch while this one's answers go out, not after.
                shared.wake.notify_one();
                answer_batch(&shared, &batch, outcome);
            };
            run_batch(&shared.model, &pads, slot.as_mut(), &batch, &mut after);
        });
        if std::panic::catch_unwind(run).is_err() && was_stuck.is_none() {
            let failed = engine_failed("the engine panicked");
            was_stuck = Some(finish_batch(&shared, &batch, started, Some(&failed)));
            answer_batch(&shared, &batch, Err(failed));
        }
        if was_stuck.unwrap_or_else(|| shared.core().remove_finished(batch.id, None, shared.now()))
        {
            let seconds = started.elapsed().as_secs_f64();
            log::warn!("Engine returned the stuck batch after {seconds:.3} s");
        }
        shared.wake.notify_one();
    }
}

/// Records the end of a batch that ran or failed (counted, out of the running ones, its
/// compute time given to the scheduler) before any of its answers goes out, so that a
/// client reading the metrics after its answer sees its batch gone; true when the watchdog
/// had taken the batch for stuck.
fn finish_batch(
    shared: &Shared,
    batch: &Job,
    started: Instant,
    failure: Option<&ApiError>,
) -> bool {
    let compute = failure.is_none().then(|| started.elapsed());
    shared.metrics.batch_finished(compute, failure);
    shared
        .core()
        .remove_finished(batch.id, compute, shared.now())
}

/// Answers a batch's requests from its outcome and hands the sampled ones to the mirrors.
fn answer_batch(shared: &Shared, batch: &Job, outcome: Result<Vec<Answer>, ApiError>) {
    match outcome {
        Ok(answers) => {
            let mirrored = crate::mirror::answer_mirrored(shared, batch, answers);
            if let (Some(mirrored), Some(mirror)) = (mirrored, shared.mirror.get()) {
                mirror.hand_over(mirrored);
            }
        }
        Err(error) => {
            log_failed_batch(batch, &error);
            fail_batch(batch, &error);
        }
    }
}

/// Says in the log why a batch failed: its outputs not holding its rows, or the engine's
/// own error (a request that could not be packed is its client's, answered 4xx unlogged).
fn log_failed_batch(batch: &Job, error: &ApiError) {
    if crate::metrics::is_output_rows_mismatch(error) {
        let message = error.message();
        log::error!("Failed a batch whose outputs do not hold its rows: {message}");
    } else if matches!(error, ApiError::EngineFailed(_)) {
        let message = error.message();
        log::error!("Engine failed on a batch of {} rows: {message}", batch.rows);
    }
}

fn fail_batch(batch: &Job, error: &ApiError) {
    for member in &batch.members {
        member.payload.reply.send(Err(error.clone()));
    }
}

fn engine_failed(message: &str) -> ApiError {
    ApiError::EngineFailed(format!(
        "the engine failed on this request's batch: {message}"
    ))
}

fn run_failed(error: RunError) -> ApiError {
    match error {
        RunError::Engine(message) => engine_failed(&message),
        RunError::Fill(error) => error,
    }
}

/// Runs one batch on `slot`: its members' rows packed into the slot's buffers, the engine
/// run, and `after` given the outputs (or why there are none) while the slot still holds
/// the batch ([`Slot::run_then`]).
pub fn run_batch(
    model: &Model,
    pads: &dyn Fn(usize) -> Option<f64>,
    slot: &mut dyn Slot,
    batch: &Job,
    after: &mut dyn FnMut(Result<Vec<Tensor>, RunError>),
) {
    let mut fill = |buffers: &mut [InputBuffer<'_>]| fill_buffers(model, pads, batch, buffers);
    slot.run_then(batch.rows, batch.shape.as_ref(), &mut fill, after);
}

/// Each member's rows of the outputs, checked to be the batch's own (issue 40: any output
/// short of the batch's rows fails the whole batch).
fn split_answers(model: &Model, batch: &Job, outputs: &[Tensor]) -> Result<Vec<Answer>, ApiError> {
    if outputs.len() != model.outputs.len() {
        return Err(engine_failed(&format!(
            "it gave {} outputs, the model has {}",
            outputs.len(),
            model.outputs.len()
        )));
    }
    let views: Vec<BatchOutput<'_>> = outputs
        .iter()
        .zip(&model.outputs)
        .map(|(tensor, spec)| BatchOutput {
            name: &spec.name,
            datatype: tensor.datatype,
            shape: &tensor.shape,
            data: match &tensor.data {
                TensorData::Raw(raw) => OutputData::Raw(raw),
                TensorData::Strings(strings) => OutputData::Strings(strings.clone()),
            },
        })
        .collect();
    let ranges = row_ranges(batch.members.iter().map(|m| m.rows));
    let cuts: Vec<Vec<Option<Vec<usize>>>> =
        if batch.members.iter().all(|m| m.payload.cut.is_empty()) {
            Vec::new()
        } else {
            batch
                .members
                .iter()
                .map(|m| m.payload.cut.clone())
                .collect()
        };
    let answers = split_outputs(&model.name, &views, batch.rows, &ranges, &cuts)?;
    Ok(answers.into_iter().map(Ok).collect())
}

/// Lays the members' rows of each input into the slot's buffers (the model's input order).
fn fill_buffers(
    model: &Model,
    pads: &dyn Fn(usize) -> Option<f64>,
    batch: &Job,
    buffers: &mut [InputBuffer<'_>],
) -> Result<(), ApiError> {
    if buffers.len() != model.inputs.len() {
        return Err(ApiError::invalid(format!(
            "the slot has {} input buffers, the model {} inputs",
            buffers.len(),
            model.inputs.len()
        )));
    }
    for (index, (buffer, spec)) in buffers.iter_mut().zip(&model.inputs).enumerate() {
        let tensors: Vec<&Tensor> = batch
            .members
            .iter()
            .map(|m| &m.payload.inputs[index])
            .collect();
        match buffer {
            InputBuffer::Fixed(dst) => {
                let item_shape: Vec<usize> = match &batch.shape {
                    Some(shape) => shape[index].clone(),
                    None => spec
                        .item_shape()
                        .iter()
                        .map(|&d| d.max(0) as usize)
                        .collect(),
                };
                pack_input(dst, &item_shape, spec.datatype, &tensors, pads(index))?;
            }
            InputBuffer::Elements(elements) => {
                for tensor in tensors {
                    let TensorData::Strings(strings) = &tensor.data else {
                        return Err(ApiError::invalid(format!(
                            "input {} is not BYTES",
                            quoted(&spec.name)
                        )));
                    };
                    elements.extend(strings.iter().cloned());
                }
            }
        }
    }
    Ok(())
}
