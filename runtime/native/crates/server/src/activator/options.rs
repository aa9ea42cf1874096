//! The activator's options as the Python side renders them (`kubeinfer activator`).

use std::path::PathBuf;
use std::time::Duration;

/// The activator's options (camelCase JSON, as [`crate::ServerOptions`]).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivatorOptions {
    /// The address to listen on (`0.0.0.0`, `127.0.0.1`).
    pub host: String,
    /// The HTTP/1 port; 0 picks a free one ([`super::Activator::http_port`] tells which).
    pub http_port: u16,
    /// The gRPC (h2c) port (None: no gRPC listener; 0 picks one).
    #[serde(default)]
    pub grpc_port: Option<u16>,
    /// The route table (JSON, the operator's ConfigMap key): re-read when its content
    /// changes; missing is no routes.
    pub routes_file: PathBuf,
    /// Requests held at once for one route; the next is refused with a 503 at once.
    #[serde(default = "defaults::max_held")]
    pub max_held_requests_per_route: usize,
    /// Longest a request is held, from its arrival, before it is refused with a 503.
    #[serde(default = "defaults::hold_timeout")]
    pub hold_timeout_seconds: f64,
    /// The largest request body taken (413 past it); held bodies are kept whole, so that
    /// a forward whose connection failed can be sent again.
    #[serde(default = "defaults::max_request_bytes")]
    pub max_request_bytes: usize,
    /// How often a route with held requests and no ready backend asks the backend's
    /// readiness.
    #[serde(default = "defaults::probe_interval")]
    pub probe_interval_milliseconds: u64,
    /// How long a backend stays known ready after it last answered (the prober, or a
    /// forwarded request): a request that comes later is held and the backend asked
    /// again, not sent to a backend that may have no pod left (a connection to a Service
    /// with no endpoint is not refused but waits for the connect timeout). The activator
    /// only receives an object's traffic while it is at zero or waking, so a backend
    /// that answered long ago has most likely gone.
    #[serde(default = "defaults::known_ready")]
    pub known_ready_milliseconds: u64,
    /// The Retry-After of every 503 the activator answers itself.
    #[serde(default = "defaults::retry_after")]
    pub retry_after_seconds: u32,
    /// Where to POST `{"namespace", "service"}` when a route with no ready backend holds
    /// a request (at most once a second a route); None: nobody is told.
    #[serde(default)]
    pub wake_url: Option<String>,
    /// How long a shutdown lets held requests wait for their backend before it refuses
    /// them (forwarded ones are answered whatever it says).
    #[serde(default = "defaults::drain_grace")]
    pub drain_grace_period_seconds: f64,
    /// Longest the request line and headers may take to arrive.
    #[serde(default = "defaults::read_timeout")]
    pub header_read_timeout_seconds: f64,
    /// Longest between two parts of a body (408 past it).
    #[serde(default = "defaults::read_timeout")]
    pub body_read_timeout_seconds: f64,
    /// How often the route table's file is read to see whether its content changed.
    #[serde(default = "defaults::routes_poll")]
    pub routes_poll_interval_milliseconds: u64,
    /// The runtime's worker threads.
    #[serde(default = "defaults::worker_threads")]
    pub worker_threads: usize,
}

impl ActivatorOptions {
    pub fn hold_timeout(&self) -> Duration {
        seconds(self.hold_timeout_seconds)
    }

    pub fn probe_interval(&self) -> Duration {
        Duration::from_millis(self.probe_interval_milliseconds.max(1))
    }

    pub fn known_ready(&self) -> Duration {
        Duration::from_millis(self.known_ready_milliseconds)
    }

    pub fn drain_grace(&self) -> Duration {
        seconds(self.drain_grace_period_seconds)
    }

    pub fn body_idle(&self) -> Duration {
        seconds(self.body_read_timeout_seconds).max(Duration::from_millis(1))
    }

    pub fn routes_poll(&self) -> Duration {
        Duration::from_millis(self.routes_poll_interval_milliseconds.max(1))
    }
}

/// Seconds as a Duration; a negative or non-finite value is none at all.
pub fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.max(0.0)).unwrap_or(Duration::MAX)
}

mod defaults {
    pub fn max_held() -> usize {
        256
    }

    pub fn hold_timeout() -> f64 {
        120.0
    }

    /// The runtime's limit for a model whose requests have no size in bytes
    /// (`UNSIZED_REQUEST_BYTES`): the activator does not know the model's.
    pub fn max_request_bytes() -> usize {
        16 * 1024 * 1024
    }

    pub fn probe_interval() -> u64 {
        100
    }

    /// Shorter than any idle window before zero (scaleToZeroAfterSeconds is at least
    /// 10 s), longer than the handover back to the pods while requests keep coming.
    pub fn known_ready() -> u64 {
        5000
    }

    pub fn retry_after() -> u32 {
        1
    }

    pub fn drain_grace() -> f64 {
        30.0
    }

    pub fn read_timeout() -> f64 {
        10.0
    }

    pub fn routes_poll() -> u64 {
        1000
    }

    pub fn worker_threads() -> usize {
        2
    }
}
