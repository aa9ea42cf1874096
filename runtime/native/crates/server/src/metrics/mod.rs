//! The runtime's Prometheus metrics at `GET /metrics`: the series of
//! `kubeinfer/runtime/exported_series.py`'s table, as `kubeinfer/contract/metric_series.py`
//! names them (`contract.tsv`, generated from it), labelled with the served model's name and
//! version, in the OpenMetrics text format (`prometheus_client`'s parsers and Prometheus read
//! it).
//!
//! Where each comes from:
//! - the request hooks of the HTTP handler ([`RequestWatch`]): requests by code, their
//!   duration (the span `Server-Timing` reports), requests in progress (from admission to
//!   end, counted once however the request ends) and the cancelled ones by stage;
//! - the driver's hooks: batch size and each member's queue time when a batch starts,
//!   compute time (0 for a failed batch, as Python observes) and output-row mismatches
//!   (issue 40) when it ends;
//! - the server's start: the slots' buffer bytes ([`slot_buffer_bytes`]);
//! - the scheduler's state, read at scrape time ([`Snapshot`]): queue depth, batches and
//!   requests on the slots, stuck batches, and Adaptive's setting;
//! - the Python side, through [`Metrics::set_gauge`], [`Metrics::add_counter`],
//!   [`Metrics::observe`], [`Metrics::remove`] and [`Metrics::clear`]: the known-answer,
//!   shadow and quality series; and at scrape time through
//!   [`Metrics::on_scrape`]: the GPU gauges (NVML, read then, so each scrape is current).
//!
//! Against prometheus_client's exposition (the mirrors' series are written with it, and
//! scrapers and tests compare the two): the same samples (names, labels, values; the
//! serving histograms' `le` written alike, "2.0"); a family with no series yet prints
//! nothing (prometheus_client prints its HELP and TYPE alone), and no `_created` samples
//! are written.

pub(crate) mod contract;
pub(crate) mod registry;
mod request;
mod routes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::histogram::Histogram;

use dataplane_core::batching::adaptive::BatchSetting;
use dataplane_core::batching::config::{BatchingConfig, PolicyKind};
use dataplane_core::error::ApiError;

use crate::engine::Engine;

use contract::names;
pub use contract::{Kind, SeriesSpec};
use registry::{Families, FloatCounter, FloatGauge, Labels};
pub use request::RequestWatch;
pub use routes::{CONTENT_TYPE, batching_status, exposition};

/// The fixed wording of `assembly::output_rows_mismatch` that tells a batch failed because
/// its outputs did not hold its rows (a test builds one through core to keep them in step).
const ROW_MISMATCH_WORDING: &str = "do not line up with the requests' rows";

/// What the scheduler holds at scrape time.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Requests queued.
    pub queued: usize,
    /// Batches on the slots (stuck ones included: they hold their slots).
    pub running_batches: usize,
    /// Requests in those batches.
    pub running_requests: usize,
    pub stuck_batches: usize,
    /// The setting in force (Adaptive's gauges are exported from it).
    pub setting: Option<BatchSetting>,
}

/// The metrics of one served model.
pub struct Metrics {
    families: Families,
    model: String,
    version: String,
    adaptive: Option<AdaptiveGauges>,
    execution_slots: usize,
    queue_depth: FloatGauge,
    inflight_batches: FloatGauge,
    inflight_requests: FloatGauge,
    stuck_batches: FloatGauge,
    in_progress: FloatGauge,
    request_duration: Histogram,
    queue_duration: Histogram,
    compute_duration: Histogram,
    batch_size: Histogram,
    row_mismatches: FloatCounter,
    /// The requests counter's series by code, made on first use.
    by_code: Mutex<Vec<(u16, FloatCounter)>>,
    /// Run at each scrape before the exposition is written (the GPU gauges, read then).
    scrape_hook: Mutex<Option<Arc<ScrapeHook>>>,
}

/// What [`Metrics::on_scrape`] runs.
pub type ScrapeHook = dyn Fn(&Metrics) + Send + Sync;

/// Adaptive's three gauges: absent until its setting first differs from the configured
/// one (Python reports a setting when it changes).
struct AdaptiveGauges {
    initial: (u64, usize, Option<usize>),
    reported: AtomicBool,
}

impl Metrics {
    /// Every series of the contract registered for `model` at `version`, the model's own
    /// series made (at 0) as Python makes them at start, and the SLO gauge set when there
    /// is an SLO.
    pub fn new(model: &str, version: &str, batching: &BatchingConfig) -> Metrics {
        let families = Families::new(contract::series());
        let mv: Labels = vec![("model", model.into()), ("version", version.into())];
        let gauge = |name| families.gauge(name, &mv).expect("a contract gauge");
        let histogram = |name| families.histogram(name, &mv).expect("a contract histogram");
        if let Some(slo) = batching.slo_p99_latency_milliseconds {
            gauge(names::SLO_P99_LATENCY).set(slo / 1000.0);
        }
        gauge(names::ENGINE_BUFFER_BYTES);
        let adaptive = (batching.policy == PolicyKind::Adaptive).then(|| {
            let setting = BatchSetting::of_config(batching);
            AdaptiveGauges {
                initial: setting_values(&setting),
                reported: AtomicBool::new(false),
            }
        });
        Metrics {
            queue_depth: gauge(names::QUEUE_DEPTH),
            inflight_batches: gauge(names::INFLIGHT_BATCHES),
            inflight_requests: gauge(names::INFLIGHT_REQUESTS),
            stuck_batches: gauge(names::ENGINE_STUCK_BATCHES),
            in_progress: gauge(names::REQUESTS_IN_PROGRESS),
            request_duration: histogram(names::REQUEST_DURATION),
            queue_duration: histogram(names::QUEUE_DURATION),
            compute_duration: histogram(names::COMPUTE_DURATION),
            batch_size: histogram(names::BATCH_SIZE),
            row_mismatches: families
                .counter(names::BATCH_OUTPUT_ROW_MISMATCHES, &mv)
                .expect("a contract counter"),
            by_code: Mutex::new(Vec::new()),
            scrape_hook: Mutex::new(None),
            adaptive,
            execution_slots: batching.execution_slots.max(1),
            families,
            model: model.into(),
            version: version.into(),
        }
    }

    /// An infer request was admitted: in progress until [`Metrics::request_finished`].
    pub fn request_started(&self) {
        self.in_progress.inc();
    }

    /// An admitted request ended (answered or cancelled).
    pub fn request_finished(&self) {
        self.in_progress.dec();
    }

    /// An infer request was answered with `code` after `seconds` (its Server-Timing).
    pub fn request_answered(&self, code: u16, seconds: Duration) {
        self.code_counter(code).inc();
        self.request_duration.observe(seconds.as_secs_f64());
    }

    /// An admitted request's client left before its answer, at `stage`.
    pub fn request_cancelled(&self, stage: &str) {
        self.series_counter(names::REQUESTS_CANCELLED, &[("stage", stage)])
            .inc();
    }

    /// A batch of `rows` rows started; each member waited its `queued` time since arrival.
    pub fn batch_started(&self, rows: usize, queued: impl IntoIterator<Item = Duration>) {
        self.batch_size.observe(rows as f64);
        for waited in queued {
            self.queue_duration.observe(waited.as_secs_f64());
        }
    }

    /// A batch ended: `compute` when it ran (a failed one is observed as 0, as Python
    /// does), and its failure, counted when its outputs did not hold its rows.
    pub fn batch_finished(&self, compute: Option<Duration>, failure: Option<&ApiError>) {
        self.compute_duration
            .observe(compute.unwrap_or_default().as_secs_f64());
        if failure.is_some_and(is_output_rows_mismatch) {
            self.row_mismatches.inc();
        }
    }

    /// The bytes the execution slots reserve (set once, at start).
    pub fn engine_buffers(&self, total_bytes: u64) {
        self.set_gauge(names::ENGINE_BUFFER_BYTES, &[], total_bytes as f64)
            .expect("the buffer gauge is in the contract");
    }

    /// Batches failed since start because their outputs did not hold their rows.
    pub fn output_row_mismatches(&self) -> u64 {
        self.row_mismatches.get() as u64
    }

    /// The exposition (OpenMetrics text) after the scrape-time gauges are set from `now`.
    pub fn render(&self, now: &Snapshot) -> String {
        self.queue_depth.set(now.queued as f64);
        self.inflight_batches.set(now.running_batches as f64);
        self.inflight_requests.set(now.running_requests as f64);
        self.stuck_batches.set(now.stuck_batches as f64);
        if let Some(setting) = &now.setting {
            self.adaptive_setting(setting);
        }
        let hook = registry_lock(&self.scrape_hook).clone();
        if let Some(hook) = hook {
            hook(self);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.families.registry)
            .expect("writing to a String does not fail");
        text
    }

    /// Runs `hook` at every scrape, before the exposition is written (replacing any hook
    /// before it): the Python side reads NVML there and sets the GPU gauges, as its
    /// collector does. A hook that cannot read should set nothing rather than fail.
    pub fn on_scrape(&self, hook: impl Fn(&Metrics) + Send + Sync + 'static) {
        *registry_lock(&self.scrape_hook) = Some(Arc::new(hook));
    }

    /// Sets a gauge of the contract (`name` as the contract names it; `labels` its labels,
    /// `model` and `version` defaulting to the served model's).
    pub fn set_gauge(&self, name: &str, labels: &[(&str, &str)], value: f64) -> Result<(), String> {
        let labels = self.labels(name, labels)?;
        self.families.gauge(name, &labels)?.set(value);
        Ok(())
    }

    /// Adds `value` (not negative) to a counter of the contract (its name without `_total`).
    pub fn add_counter(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        value: f64,
    ) -> Result<(), String> {
        // NaN is refused too: a counter only goes up.
        if value.is_nan() || value < 0.0 {
            return Err(format!("counter {name} cannot add {value}"));
        }
        let labels = self.labels(name, labels)?;
        self.families.counter(name, &labels)?.inc_by(value);
        Ok(())
    }

    /// Observes `value` in a histogram of the contract.
    pub fn observe(&self, name: &str, labels: &[(&str, &str)], value: f64) -> Result<(), String> {
        let labels = self.labels(name, labels)?;
        self.families.histogram(name, &labels)?.observe(value);
        Ok(())
    }

    /// Makes one series of the contract at zero if it is not there yet (as Python's
    /// `labels()` does: a mirror target's outcome counters exist from its start).
    pub fn touch(&self, name: &str, labels: &[(&str, &str)]) -> Result<(), String> {
        let labels = self.labels(name, labels)?;
        match &self.families.get(name)?.1 {
            registry::Family::Counter(_) => self.families.counter(name, &labels).map(drop),
            registry::Family::Gauge(_) => self.families.gauge(name, &labels).map(drop),
            registry::Family::Histogram(_) => self.families.histogram(name, &labels).map(drop),
        }
    }

    /// Removes one series (a mirror target that changed); true when it existed.
    pub fn remove(&self, name: &str, labels: &[(&str, &str)]) -> Result<bool, String> {
        let labels = self.labels(name, labels)?;
        self.families.remove(name, &labels)
    }

    /// Removes every series of a family (a mirror target gone).
    pub fn clear(&self, name: &str) -> Result<(), String> {
        self.families.clear(name)
    }

    fn labels(&self, name: &str, given: &[(&str, &str)]) -> Result<Labels, String> {
        let defaults = [("model", self.model.as_str()), ("version", &self.version)];
        self.families.labels(name, given, &defaults)
    }

    fn series_counter(&self, name: &str, given: &[(&str, &str)]) -> FloatCounter {
        self.labels(name, given)
            .and_then(|labels| self.families.counter(name, &labels))
            .expect("the server's own counters are in the contract")
    }

    fn code_counter(&self, code: u16) -> FloatCounter {
        let mut by_code = registry_lock(&self.by_code);
        if let Some((_, counter)) = by_code.iter().find(|(c, _)| *c == code) {
            return counter.clone();
        }
        let counter = self.series_counter(names::REQUESTS, &[("code", &code.to_string())]);
        by_code.push((code, counter.clone()));
        counter
    }

    fn adaptive_setting(&self, setting: &BatchSetting) {
        let Some(adaptive) = &self.adaptive else {
            return;
        };
        if setting_values(setting) != adaptive.initial {
            adaptive.reported.store(true, Ordering::Relaxed);
        }
        if !adaptive.reported.load(Ordering::Relaxed) {
            return;
        }
        let concurrent = setting.concurrent_batches.unwrap_or(self.execution_slots);
        let gauges = [
            (
                names::BATCHING_QUEUE_DELAY,
                setting.queue_delay_microseconds as f64 / 1e6,
            ),
            (
                names::BATCHING_PREFERRED_BATCH_SIZE,
                setting.preferred_batch_size as f64,
            ),
            (names::BATCHING_CONCURRENT_BATCHES, concurrent as f64),
        ];
        for (name, value) in gauges {
            self.set_gauge(name, &[], value)
                .expect("the adaptive gauges are in the contract");
        }
    }
}

/// The three values Python reports a new setting for when one of them changes.
fn setting_values(setting: &BatchSetting) -> (u64, usize, Option<usize>) {
    (
        setting.queue_delay_microseconds,
        setting.preferred_batch_size,
        setting.concurrent_batches,
    )
}

/// What one execution slot of `engine` holds (Python's `slot_buffer_bytes`): a full batch
/// (the engine's maxBatchSize rows) of every tensor at its largest item shape; a tensor of
/// unknown largest shape is left out (its engine allocates it per batch), and a BYTES
/// element counts as numpy's object array holds it, one pointer.
pub fn slot_buffer_bytes(engine: &dyn Engine) -> u64 {
    let rows = engine.max_batch_size() as u64;
    engine
        .inputs()
        .iter()
        .chain(engine.outputs())
        .filter_map(|spec| {
            let shape = spec.largest_item_shape()?;
            let item = spec.datatype.item_size().unwrap_or(POINTER_BYTES) as u64;
            Some(rows * shape.iter().map(|&d| d as u64).product::<u64>() * item)
        })
        .sum()
}

/// A BYTES element's size in a numpy object array.
const POINTER_BYTES: usize = 8;

/// The batch failed because an output did not hold its rows (issue 40).
pub fn is_output_rows_mismatch(error: &ApiError) -> bool {
    matches!(error, ApiError::EngineFailed(message)
        if message.starts_with("model ") && message.contains(ROW_MISMATCH_WORDING))
}

fn registry_lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
