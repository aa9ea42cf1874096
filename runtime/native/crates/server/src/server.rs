//! The server's lifecycle: bind, slots, serve on its own runtime, drain, stop.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::task::Poll;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use dataplane_core::batching::shapes::ShapePlan;
use dataplane_core::error::ApiError;

use crate::ServerOptions;
use crate::admin::Admin;
use crate::driver::{Job, drive, slot_thread};
use crate::engine::Engine;
use crate::lingering::{Bounds, Lingering};
use crate::model::Model;
use crate::state::{Shared, lock};

/// How long a stopped server waits for its connections' last answers to be written.
const CLOSE_CONNECTIONS_WITHIN: Duration = Duration::from_secs(2);

/// A running server: its own tokio runtime, its listener's port, the state its handlers,
/// driver and slots' threads share.
pub struct Server {
    shared: Arc<Shared>,
    http_port: u16,
    grpc_port: Option<u16>,
    runtime: Mutex<Option<Runtime>>,
    /// Tells the accept loop and the driver to stop.
    stop: watch::Sender<bool>,
    /// Where the accept loop reports that its connections closed.
    served: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Server {
    /// Binds, makes the engine's slots (one OS thread each), and serves on its own tokio
    /// runtime (threads it owns); returns once listening.
    pub fn start(options: ServerOptions, engine: Arc<dyn Engine>) -> Result<Server, String> {
        let batching = &options.batching;
        let plan = ShapePlan::new(
            engine.inputs(),
            engine.outputs(),
            batching.shape_batching,
            &batching.shape_buckets,
            &options.pad_values,
        )?;
        let model = Model::of(engine.as_ref(), batching.max_batch_size);
        let slots = (0..batching.execution_slots.max(1))
            .map(|_| engine.create_slot())
            .collect::<Result<Vec<_>, String>>()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.worker_threads.max(1))
            .thread_name("dataplane-http")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the server's runtime: {e}"))?;
        let listener = bind(&runtime, &options.host, options.http_port, "HTTP")?;
        let http_port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let grpc_listener = (options.grpc_port)
            .map(|port| bind(&runtime, &options.host, port, "gRPC"))
            .transpose()?;
        let grpc_port = (grpc_listener.as_ref())
            .map(|l| l.local_addr().map(|a| a.port()))
            .transpose()
            .map_err(|e| e.to_string())?;
        let ready = options.start_ready;
        let shared = Arc::new(Shared::new(options, model, plan, ready)?);
        let buffers = slots.len() as u64 * crate::metrics::slot_buffer_bytes(engine.as_ref());
        shared.metrics.engine_buffers(buffers);
        let senders = spawn_slots(&shared, slots)?;
        let (stop, stopped) = watch::channel(false);
        runtime.spawn(drive(shared.clone(), stopped.clone(), senders));
        let grpc = grpc_listener.map(|l| crate::grpc::serve(shared.clone(), l, stopped.clone()));
        let http = accept(shared.clone(), listener, stopped);
        let served = runtime.spawn(async move {
            // Both transports' connections are closed before a shutdown returns.
            let grpc = async move {
                if let Some(grpc) = grpc {
                    grpc.await;
                }
            };
            tokio::join!(http, grpc);
        });
        log::info!("Serving HTTP port={http_port}");
        if let Some(port) = grpc_port {
            // Worded exactly: the black-box tests read this line.
            let (model, host) = (&shared.model.name, &shared.options.host);
            log::info!("Started serving gRPC model={model} address={host}:{port}");
        }
        Ok(Server {
            shared,
            http_port,
            grpc_port,
            runtime: Mutex::new(Some(runtime)),
            stop,
            served: Mutex::new(Some(served)),
        })
    }

    /// The HTTP port listened on (the one picked, when the options said 0).
    pub fn http_port(&self) -> u16 {
        self.http_port
    }

    /// The gRPC port listened on (None: the options asked for no gRPC).
    pub fn grpc_port(&self) -> Option<u16> {
        self.grpc_port
    }

    /// Readiness the Python side holds (e.g. false until the known-answer check passed):
    /// while false, readiness is off and infer requests are refused with a 503.
    pub fn set_ready(&self, ready: bool) {
        self.shared.held_ready.store(ready, Ordering::Relaxed);
    }

    /// The Prometheus series, for values the Python side pushes (known answers, mirrors).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.shared.metrics
    }

    /// [`Server::set_ready`], with what a refused infer's 503 says while held off (the
    /// known-answer probe that failed).
    pub fn hold(&self, ready: bool, reason: Option<String>) {
        self.shared.hold(ready, reason);
    }

    /// Hands the admin routes whose data is the embedding side's to `admin` (once; until
    /// then they are 404): see [`crate::admin`].
    pub fn set_admin(&self, admin: Arc<dyn Admin>) -> Result<(), String> {
        self.shared
            .admin
            .set(admin)
            .map_err(|_| "the server's admin routes are set already".to_string())
    }

    /// Mirrors as `mirroring` says from the next batch on (no roles: nothing): see
    /// [`crate::mirror`]. Refuses a share above 100.
    pub fn set_mirroring(&self, mirroring: crate::mirror::Mirroring) -> Result<(), String> {
        self.shared.samplers.set(mirroring)
    }

    /// Hands each batch's mirrored requests to `mirror` (once; until then none are).
    pub fn set_mirror(&self, mirror: Arc<dyn crate::mirror::Mirror>) -> Result<(), String> {
        self.shared
            .mirror
            .set(mirror)
            .map_err(|_| "the server's mirror is set already".to_string())
    }

    /// Batches handed to a slot that have not come back from the engine (stuck ones
    /// included): after [`Server::shutdown`], a slot's thread still inside the engine,
    /// which the process must not close the engine under.
    pub fn batches_on_engine(&self) -> usize {
        self.shared.core().scheduler.running().0
    }

    /// Nothing admitted, queued or running: a lowest-priority job may run now.
    pub fn idle(&self) -> bool {
        self.shared.idle()
    }

    /// Stops admitting, answers everything accepted (within the drain grace), then stops;
    /// blocks. Later calls return at once.
    pub fn shutdown(&self) {
        let Some(runtime) = lock(&self.runtime).take() else {
            return;
        };
        let grace =
            Duration::from_secs_f64(self.shared.options.drain_grace_period_seconds.max(0.0));
        let served = lock(&self.served).take();
        let started = std::time::Instant::now();
        runtime.block_on(async {
            // Read before the log, never inside its arguments: a guard there lives through
            // the log call, which takes the GIL (pyo3-log), while a slot's thread holds the
            // GIL over its batch and needs the core to finish it: a deadlock.
            let admitted = self.shared.core().scheduler.queued();
            log::info!(
                "Started draining admitted={admitted} grace_period_seconds={}",
                grace.as_secs_f64()
            );
            if drain(&self.shared, grace).await {
                log::info!("Drained seconds={:.3}", started.elapsed().as_secs_f64());
            } else {
                log::warn!("Drain grace period ran out");
            }
            fail_queued(&self.shared);
            let _ = self.stop.send(true);
            if let Some(served) = served {
                let _ = served.await;
            }
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn bind(runtime: &Runtime, host: &str, port: u16, transport: &str) -> Result<TcpListener, String> {
    let listener = std::net::TcpListener::bind((host, port))
        .map_err(|e| format!("cannot listen on {host}:{port} ({transport}): {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let _entered = runtime.enter();
    TcpListener::from_std(listener).map_err(|e| e.to_string())
}

fn spawn_slots(
    shared: &Arc<Shared>,
    slots: Vec<Box<dyn crate::engine::Slot>>,
) -> Result<Vec<mpsc::Sender<Job>>, String> {
    let mut senders = Vec::with_capacity(slots.len());
    for (index, slot) in slots.into_iter().enumerate() {
        let (sender, jobs) = mpsc::channel();
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("dataplane-slot-{index}"))
            .spawn(move || slot_thread(shared, slot, jobs))
            .map_err(|e| format!("cannot start slot thread {index}: {e}"))?;
        senders.push(sender);
    }
    Ok(senders)
}

/// The most a connection buffers as it reads: a request head (its line and headers) past
/// it is refused (431) before any of it is acted on, and a body is read through it in
/// chunks this size.
pub(crate) const MAX_READ_BUFFER_BYTES: usize = 64 * 1024;

/// Accepts connections until told to stop, then waits (a little) for them to close.
async fn accept(shared: Arc<Shared>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    // Headers go out in title case, `Content-Type`: HTTP
    // names are case-insensitive, but clients that read them into a plain dict are not.
    builder
        .title_case_headers(true)
        .max_buf_size(MAX_READ_BUFFER_BYTES)
        // The buffer's limit alone lets a head a little past it through (a read may fill
        // the buffer past the limit before it is checked): the head's own limit is exact.
        .max_header_size(MAX_READ_BUFFER_BYTES)
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs_f64(
            shared.options.header_read_timeout_seconds.max(0.001),
        ));
    let options = &shared.options;
    let bounds = Bounds::of(
        options.max_request_bytes,
        MAX_READ_BUFFER_BYTES,
        options.body_read_timeout_seconds,
    );
    let serve = |stream: TcpStream| {
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let service = service_fn(move |request| crate::http::handle(shared.clone(), request));
        // Closed by lingering (crate::lingering): an answer sent before the request was
        // all read reaches its client.
        let io = TokioIo::new(Lingering::new(stream, bounds));
        let connection = builder.serve_connection(io, service);
        let watched = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = watched.await {
                log::debug!("Connection ended error={error}");
            }
        });
    };
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    log::warn!("Accept failed error={error}");
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        serve(stream);
    }
    // The listener stays open, answering the drain's 503 with `Connection: close`, until
    // no connection has been open for a while: a client told `close` with its last result
    // reconnects at once, and a listener closed under its connect resets it (the kernel
    // resets what it has queued), which the client cannot tell from a request lost. A
    // client told to retry comes back after Retry-After, longer than the quiet wait, and
    // finds the port closed: refused at connect, which loses nothing.
    let until = tokio::time::Instant::now() + KEEP_ALIVE_LINGER;
    accept_until_quiet(&listener, &graceful, until, serve).await;
    drop(listener);
    linger(&graceful, until).await;
    if tokio::time::timeout(CLOSE_CONNECTIONS_WITHIN, graceful.shutdown())
        .await
        .is_err()
    {
        log::debug!("Connections still open at stop");
    }
}

/// Serves what connects after the stop until no connection has been open for
/// `LISTENER_QUIET` (or `until`); the connections the kernel has queued are served first.
async fn accept_until_quiet(
    listener: &TcpListener,
    graceful: &GracefulShutdown,
    until: tokio::time::Instant,
    mut serve: impl FnMut(TcpStream),
) {
    while let Some((stream, _)) = queued(listener).await {
        serve(stream);
    }
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        let now = tokio::time::Instant::now();
        if graceful.count() > 0 {
            quiet_since = now;
        }
        if now >= until || now >= quiet_since + LISTENER_QUIET {
            return;
        }
        tokio::select! {
            accepted = listener.accept() => if let Ok((stream, _)) = accepted {
                serve(stream);
            },
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
}

/// Shorter than the Retry-After the drain's refusals carry, longer than a client takes to
/// reconnect after a `Connection: close`.
const LISTENER_QUIET: Duration = Duration::from_millis(250);

/// A connection the listener has queued already (None when it has none now).
async fn queued(listener: &TcpListener) -> Option<(TcpStream, std::net::SocketAddr)> {
    std::future::poll_fn(|cx| match listener.poll_accept(cx) {
        Poll::Ready(Ok(accepted)) => Poll::Ready(Some(accepted)),
        Poll::Ready(Err(_)) | Poll::Pending => Poll::Ready(None),
    })
    .await
}

/// Once the listener is closed, leaves the open connections until `until` before closing
/// them: a client told to retry after a second before the drain began
/// comes back on its keep-alive connection within it, and is answered 503 with
/// `Connection: close` instead of finding the connection closed under its request (which
/// it cannot tell from a request lost). Ends as soon as no connection is open.
async fn linger(graceful: &GracefulShutdown, until: tokio::time::Instant) {
    while graceful.count() > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Longer than the Retry-After the server's refusals carry.
const KEEP_ALIVE_LINGER: Duration = Duration::from_secs(2);

/// Stops admitting and waits until every admitted request is answered (or `grace` ran
/// out: false).
async fn drain(shared: &Shared, grace: Duration) -> bool {
    {
        let mut core = shared.core();
        core.admissions.stop(true);
        core.scheduler.drain();
    }
    shared.wake.notify_one();
    let until = tokio::time::Instant::now() + grace;
    loop {
        {
            let core = shared.core();
            if core.scheduler.idle() && core.admissions.unqueued() == 0 {
                return true;
            }
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What is still queued after the grace fails: the server stopped.
fn fail_queued(shared: &Shared) {
    let queued = shared.core().scheduler.take_queued();
    for request in queued {
        request
            .payload
            .reply
            .send(Err(ApiError::NotReady("the server stopped".into())));
    }
}

#[cfg(test)]
mod close_tests;
#[cfg(test)]
mod priority_tests;
#[cfg(test)]
pub(crate) mod tests;
