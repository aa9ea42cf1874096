//! What the handlers, the driver and the slots' threads share: the model, the clock, and
//! the scheduler and admissions behind one lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use dataplane_core::batching::Time;
use dataplane_core::batching::admission::{Admission, Admissions};
use dataplane_core::batching::scheduler::{BatchId, Scheduler, Waiter};
use dataplane_core::batching::shapes::ShapePlan;
use dataplane_core::codec::DecodeLimits;
use dataplane_core::error::ApiError;
use dataplane_core::tensor::Tensor;

use crate::ServerOptions;
use crate::admin::Admin;
use crate::metrics::Metrics;
use crate::mirror::{Mirror, Samplers};
use crate::model::Model;
use crate::shm::Regions;

/// A request's answer from its batch: its rows of every output, in the model's order.
pub type Answer = Result<Vec<Tensor>, ApiError>;

/// Where a queued request's answer goes; taken once (by its batch, or by the watchdog's
/// EngineTimeout when the batch is stuck, whichever comes first).
pub struct Reply(Mutex<Option<oneshot::Sender<Answer>>>);

impl Reply {
    pub fn new() -> (Arc<Reply>, oneshot::Receiver<Answer>) {
        let (tx, rx) = oneshot::channel();
        (Arc::new(Reply(Mutex::new(Some(tx)))), rx)
    }

    /// Sends the answer unless one was sent already (or nobody waits any more); true when
    /// it was delivered (to a request still waiting for it).
    pub fn send(&self, answer: Answer) -> bool {
        match lock(&self.0).take() {
            Some(tx) => tx.send(answer).is_ok(),
            None => false,
        }
    }

    /// Nobody waits for it: the client went away, or it was answered.
    pub fn gone(&self) -> bool {
        lock(&self.0)
            .as_ref()
            .is_none_or(oneshot::Sender::is_closed)
    }
}

/// A queued request's payload: its checked inputs and where its answer goes.
pub struct Pending {
    /// In the model's input order.
    pub inputs: Vec<Tensor>,
    /// Per output: its own item extents to cut its rows back to (empty: none).
    pub cut: Vec<Option<Vec<usize>>>,
    pub reply: Arc<Reply>,
    pub admission: Admission,
    /// The raw value of the quality watch's slice header, read while a watch names one.
    pub slice_value: Option<String>,
}

impl Waiter for Pending {
    fn gone(&self) -> bool {
        self.reply.gone()
    }
}

/// The decisions' state, behind the one lock.
pub struct Core {
    pub scheduler: Scheduler<Pending>,
    pub admissions: Admissions,
    /// The replies of each batch on a slot (the watchdog answers a stuck one's).
    pub running: HashMap<BatchId, Vec<Arc<Reply>>>,
}

impl Core {
    /// A batch off its slot: out of the running ones, its compute time (None: it did not
    /// run) given to the scheduler; true when the watchdog had already taken it for stuck.
    pub fn remove_finished(
        &mut self,
        batch: BatchId,
        compute: Option<Duration>,
        now: Time,
    ) -> bool {
        let was_stuck = self.running.remove(&batch).is_none();
        self.scheduler.finished(batch, compute, now);
        was_stuck
    }
}

/// Everything shared, once per server.
pub struct Shared {
    pub options: ServerOptions,
    pub model: Model,
    pub plan: ShapePlan,
    pub limits: DecodeLimits,
    origin: Instant,
    core: Mutex<Core>,
    /// Readiness as the Python side holds it ([`crate::Server::set_ready`]).
    pub held_ready: AtomicBool,
    /// Why the Python side holds readiness off (the 503 of a refused infer says it).
    hold_reason: Mutex<Option<String>>,
    /// What answers the admin routes whose data is the embedding side's (none: 404).
    pub admin: OnceLock<Arc<dyn Admin>>,
    /// Wakes the driver: something happened (a request queued or gone, a batch finished).
    pub wake: Notify,
    /// The registered system shared-memory regions.
    pub shared_memory: Regions,
    /// The Prometheus series (`GET /metrics`).
    pub metrics: Metrics,
    /// What is mirrored, and each role's sampler ([`crate::mirror`]).
    pub samplers: Samplers,
    /// What takes each batch's mirrored requests (none: nothing is handed over).
    pub mirror: OnceLock<Arc<dyn Mirror>>,
}

impl Shared {
    pub fn new(
        options: ServerOptions,
        model: Model,
        plan: ShapePlan,
        ready: bool,
    ) -> Result<Shared, String> {
        let batching = &options.batching;
        let default_timeout = Duration::from_millis(batching.default_timeout_milliseconds);
        let mut admissions = Admissions::new(batching.max_queue_size, default_timeout);
        admissions.open();
        let core = Core {
            scheduler: Scheduler::new(batching.clone())?,
            admissions,
            running: HashMap::new(),
        };
        Ok(Shared {
            metrics: Metrics::new(&model.name, &model.version, batching),
            limits: model.decode_limits(),
            options,
            model,
            plan,
            origin: Instant::now(),
            core: Mutex::new(core),
            held_ready: AtomicBool::new(ready),
            hold_reason: Mutex::new(None),
            admin: OnceLock::new(),
            wake: Notify::new(),
            shared_memory: Regions::default(),
            samplers: Samplers::default(),
            mirror: OnceLock::new(),
        })
    }

    /// The monotonic clock's reading, since the server started.
    pub fn now(&self) -> Time {
        self.origin.elapsed()
    }

    /// The core, locked. Never held over anything that takes the GIL, a log call above
    /// all (pyo3-log hands it to Python's logging): a slot's thread holds the GIL over its
    /// batch and takes the core to finish it, so the GIL comes first, the core second.
    pub fn core(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }

    /// Ready: admitting, not stuck, and held ready by the Python side.
    pub fn ready(&self) -> bool {
        let now = self.now();
        let core = self.core();
        self.held_ready.load(Ordering::Relaxed)
            && core.admissions.accepting()
            && core.scheduler.stuck_for(now).is_none()
    }

    /// Live until a stuck batch has not returned within engineStuckLivenessSeconds.
    pub fn live(&self) -> bool {
        let bound = Duration::from_secs_f64(self.options.engine_stuck_liveness_seconds.max(0.0));
        self.core()
            .scheduler
            .stuck_for(self.now())
            .is_none_or(|stuck| stuck < bound)
    }

    /// Nothing admitted, queued or running (a stuck batch aside: its requests were
    /// answered): the moment a lowest-priority job (the known answers on demand) may run.
    pub fn idle(&self) -> bool {
        let core = self.core();
        core.scheduler.idle() && core.admissions.unqueued() == 0
    }

    /// Holds readiness on or off; `reason` is what a refused infer's 503 says while off.
    pub fn hold(&self, ready: bool, reason: Option<String>) {
        *lock(&self.hold_reason) = reason;
        self.held_ready.store(ready, Ordering::Relaxed);
    }

    pub fn draining(&self) -> bool {
        self.core().admissions.draining()
    }

    /// Admits an infer request arriving at `now` (before its body is read): a 503 when
    /// held not ready, not accepting, stuck or full.
    pub fn admit(&self, now: Time) -> Result<Admission, ApiError> {
        if !self.held_ready.load(Ordering::Relaxed) {
            let reason = lock(&self.hold_reason).clone().unwrap_or_else(|| {
                "the runtime holds the model not ready (its known-answer check has not passed)"
                    .into()
            });
            return Err(ApiError::NotReady(reason));
        }
        let mut core = self.core();
        let core = &mut *core;
        let stuck_for = core.scheduler.stuck_for(now);
        let (queued, sheddable) = (core.scheduler.queued(), core.scheduler.sheddable());
        core.admissions.admit(now, queued, sheddable, stuck_for)
    }

    pub fn release(&self, admission: &mut Admission) {
        self.core().admissions.release(admission);
    }
}

/// A lock whose holder panicked is still the state: the decisions never leave it half-made
/// across a panic point that matters more than serving on.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
