//! One route's state: the requests held for it (bounded), whether its backend is known
//! ready (a watch the held requests wait on), and the prober that finds out: while a
//! route holds requests and its backend is not known ready, it asks the backend's
//! readiness every probe interval and, where a wake URL is set, says so there at most
//! once a second. Nothing is probed while nothing is held.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::Uri;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Context;
use super::metrics::{Outcome, RouteSeries};
use super::routes::Route;
use crate::state::lock;

/// At most one wake-up a second a route.
const WAKE_EVERY: Duration = Duration::from_secs(1);

/// A route's state, shared by its held requests, its prober and the table.
pub struct Hold {
    context: Arc<Context>,
    /// The route as the table says now (its backend may move on a reload).
    route: Mutex<Route>,
    /// Whether the backend is known ready: set by the prober, cleared by a forward that
    /// could not connect or was refused, and by its age (`known_ready`).
    ready: watch::Sender<bool>,
    /// When the backend last answered: the prober's ready, or a forwarded request's answer.
    answered_at: Mutex<Option<Instant>>,
    held: Mutex<Held>,
    pub series: RouteSeries,
}

/// The requests held, by arrival.
#[derive(Default)]
struct Held {
    /// Each held request's arrival, by the id its guard holds.
    arrivals: BTreeMap<u64, Instant>,
    next: u64,
    /// A prober runs (at most one a route).
    probing: bool,
    last_wake: Option<Instant>,
}

/// How a wait for the backend ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    Ready,
    /// The request's hold timeout passed.
    TimedOut,
    /// The activator stopped (its drain grace passed) before the backend was ready.
    Stopped,
}

/// A held request's place: given back when it is dropped (forwarded, refused, or its
/// client left).
pub struct HeldGuard {
    hold: Arc<Hold>,
    id: u64,
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        let mut held = lock(&self.hold.held);
        held.arrivals.remove(&self.id);
        self.hold.series.held.set(held.arrivals.len() as f64);
    }
}

impl Hold {
    pub fn new(route: Route, context: Arc<Context>) -> Arc<Hold> {
        let series = context.metrics.route(&route.namespace, &route.service);
        Arc::new(Hold {
            context,
            route: Mutex::new(route),
            ready: watch::channel(false).0,
            answered_at: Mutex::new(None),
            held: Mutex::new(Held::default()),
            series,
        })
    }

    pub fn route(&self) -> Route {
        lock(&self.route).clone()
    }

    /// The table changed this route: a new backend is not known ready until probed.
    pub fn update(self: &Arc<Self>, route: Route) {
        let mut current = lock(&self.route);
        let moved = (current.backend_host != route.backend_host)
            || current.http_port != route.http_port
            || current.grpc_port != route.grpc_port;
        *current = route;
        drop(current);
        if moved {
            self.not_ready();
        }
    }

    /// Whether the backend is known ready, and answered within `known_ready`.
    pub fn ready(&self) -> bool {
        let recent = lock(&self.answered_at)
            .is_some_and(|at| at.elapsed() < self.context.options.known_ready());
        *self.ready.borrow() && recent
    }

    /// The backend answered ready: the held requests go.
    pub fn mark_ready(&self) {
        self.answered();
        self.ready.send_replace(true);
    }

    /// The backend answered a forwarded request: it stays known ready a while longer.
    pub fn answered(&self) {
        *lock(&self.answered_at) = Some(Instant::now());
    }

    /// A forward found the backend unreachable: requests wait for it again (and are
    /// probed for, if any is held).
    pub fn not_ready(self: &Arc<Self>) {
        self.ready.send_replace(false);
        let start = {
            let mut held = lock(&self.held);
            let start = !held.arrivals.is_empty() && !held.probing;
            held.probing |= start;
            start
        };
        if start {
            tokio::spawn(self.clone().probe());
        }
    }

    /// Holds a request that arrived at `arrived`, unless the route holds its most (None:
    /// refused); the first one held for a backend not known ready starts the prober.
    pub fn hold(self: &Arc<Self>, arrived: Instant) -> Option<HeldGuard> {
        if *self.ready.borrow() && !self.ready() {
            // Known ready too long ago: the held request waits for the prober, not on a
            // readiness that may be stale.
            self.ready.send_replace(false);
        }
        let (id, start) = {
            let mut held = lock(&self.held);
            if held.arrivals.len() >= self.context.options.max_held_requests_per_route {
                return None;
            }
            let id = held.next;
            held.next += 1;
            held.arrivals.insert(id, arrived);
            self.series.held.set(held.arrivals.len() as f64);
            let start = !held.probing && !self.ready();
            held.probing |= start;
            (id, start)
        };
        if start {
            tokio::spawn(self.clone().probe());
        }
        Some(HeldGuard {
            hold: self.clone(),
            id,
        })
    }

    /// Requests held now, and how long the oldest of them has been (None: none).
    pub fn held(&self, now: Instant) -> (usize, Option<Duration>) {
        let held = lock(&self.held);
        let oldest = held.arrivals.values().min().map(|&a| now - a);
        (held.arrivals.len(), oldest)
    }

    /// Waits until the backend is known ready, `deadline` passes, or the activator stops.
    pub async fn wait_ready(&self, deadline: Instant) -> Waited {
        let mut ready = self.ready.subscribe();
        let mut stage = self.context.stage.subscribe();
        tokio::select! {
            waited = ready.wait_for(|&ready| ready) => match waited {
                Ok(_) => Waited::Ready,
                Err(_) => Waited::Stopped, // the route's state went: never, it holds it
            },
            _ = tokio::time::sleep_until(deadline) => Waited::TimedOut,
            _ = stage.wait_for(|stage| *stage == super::Stage::Stopped) => Waited::Stopped,
        }
    }

    /// Counts a request of this route that ended as `outcome`.
    pub fn ended(&self, outcome: Outcome) {
        self.series.ended(outcome);
    }

    /// The prober: while requests are held and the backend is not known ready, asks its
    /// readiness every probe interval (waking it where a wake URL is set); ends once it is
    /// ready or nothing is held.
    async fn probe(self: Arc<Self>) {
        let interval = self.context.options.probe_interval();
        loop {
            let wake = {
                let mut held = lock(&self.held);
                if held.arrivals.is_empty() || self.ready() {
                    held.probing = false;
                    return;
                }
                let now = Instant::now();
                let due = held.last_wake.is_none_or(|at| now >= at + WAKE_EVERY);
                if due {
                    held.last_wake = Some(now);
                }
                due
            };
            let route = self.route();
            if wake {
                self.wake(&route);
            }
            if self
                .context
                .upstream
                .ready(&route.backend_host, route.http_port)
                .await
            {
                log::info!(
                    "Backend ready route={} backend={}",
                    route.key(),
                    route.backend_host
                );
                self.mark_ready();
                // Loops once more to end the prober (a forward may already have cleared
                // readiness again, with requests still held: then it goes on).
                continue;
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// POSTs `{"namespace", "service"}` to the wake URL, on a task of its own.
    fn wake(&self, route: &Route) {
        let Some(url) = self.context.wake_url.clone() else {
            return;
        };
        let body = serde_json::json!({"namespace": route.namespace, "service": route.service});
        let body = serde_json::to_vec(&body).expect("a JSON object serializes");
        let context = self.context.clone();
        tokio::spawn(async move { context.upstream.wake(&url, body).await });
    }
}

/// The wake URL of the options, checked: an `http://` URL (None: no wake-ups).
pub fn wake_url(url: Option<&str>) -> Result<Option<Uri>, String> {
    let Some(url) = url.filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("wakeUrl {url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!("wakeUrl {url:?} must be an http:// URL"));
    }
    Ok(Some(uri))
}
