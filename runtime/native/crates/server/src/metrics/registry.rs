//! Every family of the contract registered once in a `prometheus_client` registry, found
//! by name, with its series found by label values (checked against the family's labels).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family as PromFamily, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::contract::{Kind, SeriesSpec};

/// One series' labels: (name, value) pairs in the family's label order.
pub type Labels = Vec<(&'static str, String)>;
/// A counter of seconds or rows: f64, as Python's prometheus_client counts.
pub type FloatCounter = Counter<f64, AtomicU64>;
/// A gauge that holds any value (seconds, bytes, ratios).
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// Makes each new series of a histogram family with the family's buckets.
#[derive(Clone, Debug)]
pub struct Buckets(Vec<f64>);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// A registered family of one of the three kinds.
#[derive(Clone, Debug)]
pub enum Family {
    Counter(PromFamily<Labels, FloatCounter>),
    Gauge(PromFamily<Labels, FloatGauge>),
    Histogram(PromFamily<Labels, Histogram, Buckets>),
}

/// The registry and its families by name.
pub struct Families {
    pub registry: Registry,
    by_name: HashMap<&'static str, (SeriesSpec, Family)>,
}

impl Families {
    /// Registers every series of `specs`.
    pub fn new(specs: Vec<SeriesSpec>) -> Families {
        let mut registry = Registry::default();
        let mut by_name = HashMap::with_capacity(specs.len());
        for spec in specs {
            let family = match spec.kind {
                Kind::Counter => Family::Counter(PromFamily::default()),
                Kind::Gauge => Family::Gauge(PromFamily::default()),
                Kind::Histogram => Family::Histogram(PromFamily::new_with_constructor(Buckets(
                    spec.buckets.clone(),
                ))),
            };
            // The registry ends every help with a full stop of its own; the contract's
            // end with one already.
            let help = spec.help.strip_suffix('.').unwrap_or(spec.help);
            match &family {
                Family::Counter(f) => registry.register(spec.name, help, f.clone()),
                Family::Gauge(f) => registry.register(spec.name, help, f.clone()),
                Family::Histogram(f) => registry.register(spec.name, help, f.clone()),
            }
            by_name.insert(spec.name, (spec, family));
        }
        Families { registry, by_name }
    }

    /// The family of this name and its spec, or why not.
    pub fn get(&self, name: &str) -> Result<&(SeriesSpec, Family), String> {
        self.by_name
            .get(name)
            .ok_or_else(|| format!("no series {name:?} in the runtime's metrics contract"))
    }

    /// A family's labels from `given` (name, value) pairs, in the family's order: each of
    /// its labels must be given once and no other, except `model` and `version`, which
    /// default to `defaults`' (the served model's).
    pub fn labels(
        &self,
        name: &str,
        given: &[(&str, &str)],
        defaults: &[(&str, &str)],
    ) -> Result<Labels, String> {
        let (spec, _) = self.get(name)?;
        if let Some((unknown, _)) = given.iter().find(|(k, _)| !spec.labels.contains(k)) {
            return Err(format!(
                "series {name} has no label {unknown:?} (its labels: {})",
                spec.labels.join(", ")
            ));
        }
        spec.labels
            .iter()
            .map(|&label| {
                let value = given
                    .iter()
                    .chain(defaults)
                    .find(|(k, _)| *k == label)
                    .map(|(_, v)| (*v).to_string())
                    .ok_or_else(|| format!("series {name} needs label {label:?}"))?;
                Ok((label, value))
            })
            .collect()
    }

    pub fn counter(&self, name: &str, labels: &Labels) -> Result<FloatCounter, String> {
        match self.get(name)? {
            (_, Family::Counter(family)) => Ok(family.get_or_create_owned(labels)),
            (spec, _) => Err(wrong_kind(spec, "counter")),
        }
    }

    pub fn gauge(&self, name: &str, labels: &Labels) -> Result<FloatGauge, String> {
        match self.get(name)? {
            (_, Family::Gauge(family)) => Ok(family.get_or_create_owned(labels)),
            (spec, _) => Err(wrong_kind(spec, "gauge")),
        }
    }

    pub fn histogram(&self, name: &str, labels: &Labels) -> Result<Histogram, String> {
        match self.get(name)? {
            (_, Family::Histogram(family)) => Ok(family.get_or_create_owned(labels)),
            (spec, _) => Err(wrong_kind(spec, "histogram")),
        }
    }

    /// Removes one series (true when it existed).
    pub fn remove(&self, name: &str, labels: &Labels) -> Result<bool, String> {
        Ok(match &self.get(name)?.1 {
            Family::Counter(f) => f.remove(labels),
            Family::Gauge(f) => f.remove(labels),
            Family::Histogram(f) => f.remove(labels),
        })
    }

    /// Removes every series of a family (its HELP and TYPE stay).
    pub fn clear(&self, name: &str) -> Result<(), String> {
        match &self.get(name)?.1 {
            Family::Counter(f) => f.clear(),
            Family::Gauge(f) => f.clear(),
            Family::Histogram(f) => f.clear(),
        }
        Ok(())
    }
}

fn wrong_kind(spec: &SeriesSpec, asked: &str) -> String {
    format!("series {} is a {:?}, not a {asked}", spec.name, spec.kind).to_lowercase()
}
