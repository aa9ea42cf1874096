//! The activator's Prometheus series at its `GET /metrics`: those of
//! `kubeinfer/contract/metric_series.py`'s activator block, as `activator.tsv` (generated
//! from it by `metrics/contract_tsv.py --activator`) lists them, in the OpenMetrics text
//! format the runtime's `/metrics` has. Each route's series are made (at 0) with the
//! route, so a rate over them has a start.

use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::contract::series_of;
use crate::metrics::registry::{Families, FloatCounter, FloatGauge, Labels};

/// The generated listing of the activator's series.
const ACTIVATOR_TSV: &str = include_str!("../metrics/activator.tsv");

/// The names the activator's hooks use (each is checked against the listing by a test).
pub mod names {
    pub const HELD_REQUESTS: &str = "kubeinfer_activator_held_requests";
    pub const REQUESTS: &str = "kubeinfer_activator_requests";
    pub const HOLD_DURATION: &str = "kubeinfer_activator_hold_seconds";
    pub const UNROUTED_REQUESTS: &str = "kubeinfer_activator_unrouted_requests";
}

/// How a routed request ended (`outcome`, the contract's `ACTIVATOR_OUTCOMES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Forwarded,
    RefusedFull,
    RefusedHoldTimeout,
    RefusedDraining,
    /// Its body was refused (413 past maxRequestBytes, 408 too slow, 400 unreadable).
    RefusedBody,
    Cancelled,
    BackendError,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Forwarded,
        Outcome::RefusedFull,
        Outcome::RefusedHoldTimeout,
        Outcome::RefusedDraining,
        Outcome::RefusedBody,
        Outcome::Cancelled,
        Outcome::BackendError,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::RefusedFull => "refused_full",
            Outcome::RefusedHoldTimeout => "refused_hold_timeout",
            Outcome::RefusedDraining => "refused_draining",
            Outcome::RefusedBody => "refused_body",
            Outcome::Cancelled => "cancelled",
            Outcome::BackendError => "backend_error",
        }
    }
}

/// The activator's registry.
pub struct ActivatorMetrics {
    families: Families,
    unrouted: FloatCounter,
}

/// One route's series.
pub struct RouteSeries {
    pub held: FloatGauge,
    pub hold_duration: Histogram,
    outcomes: Vec<FloatCounter>,
}

impl RouteSeries {
    /// Counts a request that ended as `outcome`.
    pub fn ended(&self, outcome: Outcome) {
        let index = Outcome::ALL.iter().position(|&o| o == outcome);
        if let Some(counter) = index.and_then(|i| self.outcomes.get(i)) {
            counter.inc();
        }
    }
}

impl ActivatorMetrics {
    pub fn new() -> ActivatorMetrics {
        let families = Families::new(series_of(ACTIVATOR_TSV));
        let unrouted = families
            .counter(names::UNROUTED_REQUESTS, &Vec::new())
            .expect("the unrouted counter is in the activator's listing");
        ActivatorMetrics { families, unrouted }
    }

    /// The series of the route of `namespace`/`service` (made at 0 the first time).
    pub fn route(&self, namespace: &str, service: &str) -> RouteSeries {
        let labels: Labels = vec![("namespace", namespace.into()), ("service", service.into())];
        let listed = "the activator's route series are in its listing";
        let outcomes = (Outcome::ALL.iter())
            .map(|outcome| {
                let mut labels = labels.clone();
                labels.push(("outcome", outcome.label().into()));
                self.families
                    .counter(names::REQUESTS, &labels)
                    .expect(listed)
            })
            .collect();
        RouteSeries {
            held: self
                .families
                .gauge(names::HELD_REQUESTS, &labels)
                .expect(listed),
            hold_duration: (self.families)
                .histogram(names::HOLD_DURATION, &labels)
                .expect(listed),
            outcomes,
        }
    }

    /// A request no route is for.
    pub fn unrouted(&self) {
        self.unrouted.inc();
    }

    /// The exposition (OpenMetrics text).
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.families.registry)
            .expect("writing to a String does not fail");
        text
    }
}

impl Default for ActivatorMetrics {
    fn default() -> Self {
        ActivatorMetrics::new()
    }
}
