//! The activator (issue 44, scale to zero): while an InferenceDeployment has no serving
//! pod, the operator points its public Service here. Each request is held, in a bounded
//! queue per route, until the route's pods are ready, then forwarded to them; past the
//! bound, the hold time or the drain a request is refused at once with a 503 and
//! Retry-After, never left hanging.
//!
//! The parts, in the order a request meets them:
//! - [`routes`]: the route table the operator writes, and which route a request is for
//!   (pure); [`table`]: the table in force, re-read when its file's content changes;
//! - [`listen`]: HTTP/1 and h2c (gRPC) listeners, as the runtime's server has, and their
//!   drain;
//! - [`handle`]: admission before the body, the hold, the forward; [`hold`]: each route's
//!   held requests, its backend's readiness and the prober that finds it out;
//! - [`forward`]: the clients to the backends (HTTP/1, and HTTP/2 with prior knowledge
//!   for gRPC), answers streamed back with their trailers;
//! - [`own_routes`]: its health, `/v2/activator` and `/metrics` ([`metrics`]).
//!
//! The entry point is [`Activator::start`]; it serves on a tokio runtime of its own, so the
//! Python extension only holds an [`Activator`] and calls [`Activator::shutdown`].

mod answers;
mod forward;
mod handle;
mod hold;
mod listen;
pub mod metrics;
mod options;
mod own_routes;
pub mod routes;
mod table;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::Uri;
use tokio::runtime::Runtime;
use tokio::sync::watch;

use dataplane_core::batching::Time;

pub use options::ActivatorOptions;

use crate::http::body::Clock;
use crate::state::lock;
use forward::Upstream;
use metrics::ActivatorMetrics;
use table::Tables;

/// Where the activator is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Serving,
    /// Not accepting; held requests still wait for their backend.
    Draining,
    /// The drain grace passed: held requests are refused.
    Stopped,
}

/// What the handlers, the probers and the table's follower share.
pub struct Context {
    pub options: ActivatorOptions,
    pub tables: Tables,
    pub upstream: Upstream,
    pub metrics: ActivatorMetrics,
    pub stage: watch::Sender<Stage>,
    /// Where wake-ups go (None: nowhere).
    pub wake_url: Option<Uri>,
    origin: Instant,
}

impl Context {
    /// The state of an activator with `options`, no table read yet.
    pub fn new(options: ActivatorOptions) -> Result<Context, String> {
        Ok(Context {
            wake_url: hold::wake_url(options.wake_url.as_deref())?,
            options,
            tables: Tables::new(),
            upstream: Upstream::new(),
            metrics: ActivatorMetrics::new(),
            stage: watch::channel(Stage::Serving).0,
            origin: Instant::now(),
        })
    }

    pub fn stage(&self) -> Stage {
        *self.stage.borrow()
    }

    pub fn retry_after(&self) -> u32 {
        self.options.retry_after_seconds
    }
}

impl Clock for Context {
    fn now(&self) -> Time {
        self.origin.elapsed()
    }
}

/// A running activator: its own tokio runtime, its listeners' ports, what they share.
pub struct Activator {
    context: Arc<Context>,
    http_port: u16,
    grpc_port: Option<u16>,
    runtime: Mutex<Option<Runtime>>,
    /// The listeners' tasks: done once their connections closed.
    served: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Activator {
    /// Reads the route table, binds, and serves on its own tokio runtime; returns once
    /// listening.
    pub fn start(options: ActivatorOptions) -> Result<Activator, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.worker_threads.max(1))
            .thread_name("activator")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the activator's runtime: {e}"))?;
        let http = listen::bind(&runtime, &options.host, options.http_port, "HTTP")?;
        let grpc = (options.grpc_port)
            .map(|port| listen::bind(&runtime, &options.host, port, "gRPC"))
            .transpose()?;
        let http_port = listen::port(&http)?;
        let grpc_port = grpc.as_ref().map(listen::port).transpose()?;
        let path = options.routes_file.clone();
        let context = Arc::new(Context::new(options)?);
        runtime.block_on(table::refresh(&context, &path));
        runtime.spawn(table::follow(context.clone(), path));
        let served = runtime.spawn(listen::serve(context.clone(), http, grpc));
        log::info!("Activator serving HTTP port={http_port}");
        if let Some(port) = grpc_port {
            log::info!("Activator serving gRPC port={port}");
        }
        Ok(Activator {
            context,
            http_port,
            grpc_port,
            runtime: Mutex::new(Some(runtime)),
            served: Mutex::new(Some(served)),
        })
    }

    /// The HTTP port listened on (the one picked, when the options said 0).
    pub fn http_port(&self) -> u16 {
        self.http_port
    }

    /// The gRPC port listened on (None: no gRPC listener).
    pub fn grpc_port(&self) -> Option<u16> {
        self.grpc_port
    }

    /// `GET /v2/activator`'s body (the tests read it without a request).
    pub fn status(&self) -> serde_json::Value {
        own_routes::status(&self.context)
    }

    /// Stops accepting; held requests keep waiting for their backends until `grace`, then
    /// are refused with a 503; forwarded ones are answered (their connections closed
    /// within a little more). Blocks; later calls return at once.
    pub fn shutdown(&self, grace: Duration) {
        let Some(runtime) = lock(&self.runtime).take() else {
            return;
        };
        let served = lock(&self.served).take();
        let held: usize = (self.context.tables.current().holds.iter())
            .map(|h| h.held(tokio::time::Instant::now()).0)
            .sum();
        log::info!(
            "Started draining the activator held={held} grace_period_seconds={}",
            grace.as_secs_f64()
        );
        let started = Instant::now();
        runtime.block_on(async {
            self.context.stage.send_replace(Stage::Draining);
            if let Some(mut served) = served {
                if tokio::time::timeout(grace, &mut served).await.is_err() {
                    log::warn!("Drain grace period ran out: refusing the requests still held");
                    self.context.stage.send_replace(Stage::Stopped);
                    let _ = served.await;
                }
            }
            self.context.stage.send_replace(Stage::Stopped);
        });
        log::info!(
            "Stopped the activator seconds={:.3}",
            started.elapsed().as_secs_f64()
        );
        runtime.shutdown_timeout(Duration::from_secs(1));
        self.context.tables.clear();
    }

    /// [`Activator::shutdown`] with the options' drain grace.
    pub fn stop(&self) {
        self.shutdown(self.context.options.drain_grace());
    }
}

impl Drop for Activator {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests;
