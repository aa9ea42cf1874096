//! `kubeinfer_dataplane.Server`: the data plane's server over a Python engine, started from
//! Python with the options the Python side rendered (`kubeinfer.runtime.rust_dataplane`).
//! It serves from threads of its own; every call that can wait on them (start, shutdown)
//! lets the GIL go, since the slots' threads take it to run their batches.

use std::sync::{Arc, Mutex, MutexGuard};

use dataplane_server::admin::{Admin, AdminAnswer};
use dataplane_server::dataplane_core::error::ApiError;
use dataplane_server::mirror::{MirrorRole, Mirroring};
use dataplane_server::{Server, ServerOptions};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::engine::PyEngine;
use crate::mirror::PyMirror;

/// A running server; `shutdown()` drains and stops it (also when it is collected).
#[pyclass(module = "kubeinfer_dataplane", name = "Server", frozen)]
pub struct PyServer {
    /// None once shut down.
    server: Mutex<Option<Server>>,
    http_port: u16,
}

fn lock(server: &Mutex<Option<Server>>) -> MutexGuard<'_, Option<Server>> {
    server
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[pymethods]
impl PyServer {
    /// Starts serving `engine` (a loaded `kubeinfer.runtime.engines.base.Engine`) with
    /// `options_json` (`ServerOptions`, camelCase); returns once listening. ValueError for
    /// options that do not parse, RuntimeError when the server cannot start (a port taken,
    /// a slot that cannot be made), saying why. `admin`, when given, answers the admin
    /// routes whose data is Python's (`dataplane_server::admin::ADMIN_ROUTES`): called as
    /// `admin(method, path)` with the GIL, on a thread of the server's, only on those
    /// routes; it returns `(status, [(header, value), ...], body_bytes)`.
    #[new]
    #[pyo3(signature = (
        options_json, engine, *, model_name, model_version = "1".to_owned(), admin = None
    ))]
    fn new(
        py: Python<'_>,
        options_json: &str,
        engine: &Bound<'_, PyAny>,
        model_name: String,
        model_version: String,
        admin: Option<Py<PyAny>>,
    ) -> PyResult<PyServer> {
        let options: ServerOptions = serde_json::from_str(options_json)
            .map_err(|e| PyValueError::new_err(format!("invalid server options: {e}")))?;
        let engine = Arc::new(PyEngine::new(engine, model_name, model_version)?);
        // The GIL goes while the server starts: it creates the slots (each takes the GIL).
        let server = py
            .detach(move || Server::start(options, engine))
            .map_err(PyRuntimeError::new_err)?;
        if let Some(admin) = admin {
            server
                .set_admin(Arc::new(PyAdmin(admin)))
                .map_err(PyRuntimeError::new_err)?;
        }
        Ok(PyServer {
            http_port: server.http_port(),
            server: Mutex::new(Some(server)),
        })
    }

    /// The HTTP port listened on (the one picked when the options said 0).
    #[getter]
    fn http_port(&self) -> u16 {
        self.http_port
    }

    /// Holds readiness (and infer) off while false: the known-answer check's verdict;
    /// `reason` is what a refused infer's 503 says meanwhile (the check's hold reason).
    #[pyo3(signature = (ready, reason = None))]
    fn set_ready(&self, ready: bool, reason: Option<String>) {
        if let Some(server) = lock(&self.server).as_ref() {
            server.hold(ready, reason);
        }
    }

    /// Mirrors from the next batch on as the Python mirrors say (`kubeinfer.runtime.
    /// rust_mirroring`): `roles` as `(role, traffic_percent, token)` (another token:
    /// another mirror, sampled from a fresh sampler), `slice_header` the quality watch's
    /// (None: none read). ValueError for a share above 100.
    #[pyo3(signature = (roles, slice_header = None))]
    fn set_mirroring(
        &self,
        roles: Vec<(String, u32, u64)>,
        slice_header: Option<String>,
    ) -> PyResult<()> {
        let mirroring = Mirroring {
            roles: (roles.into_iter())
                .map(|(role, percent, token)| MirrorRole {
                    role,
                    percent,
                    token,
                })
                .collect(),
            slice_header,
        };
        match lock(&self.server).as_ref() {
            Some(server) => server
                .set_mirroring(mirroring)
                .map_err(PyValueError::new_err),
            None => Ok(()),
        }
    }

    /// Hands each batch's sampled requests to `hand_over` (once), called on a slot's
    /// thread inside the batch's GIL crossing ([`crate::mirror::PyMirror`]).
    fn set_mirror(&self, hand_over: Py<PyAny>) -> PyResult<()> {
        match lock(&self.server).as_ref() {
            Some(server) => server
                .set_mirror(Arc::new(PyMirror::new(hand_over)))
                .map_err(PyRuntimeError::new_err),
            None => Ok(()),
        }
    }

    /// Adds `value` to the contract's counter `name` (without `_total`) at `labels`
    /// (`model` and `version` default to the served model's). ValueError: no such series.
    fn metric_add(&self, name: &str, labels: Vec<(String, String)>, value: f64) -> PyResult<()> {
        self.with_metrics(|m| m.add_counter(name, &pairs(&labels), value))
    }

    /// Sets the contract's gauge `name` at `labels`.
    fn metric_set(&self, name: &str, labels: Vec<(String, String)>, value: f64) -> PyResult<()> {
        self.with_metrics(|m| m.set_gauge(name, &pairs(&labels), value))
    }

    /// Observes `value` in the contract's histogram `name` at `labels`.
    fn metric_observe(
        &self,
        name: &str,
        labels: Vec<(String, String)>,
        value: f64,
    ) -> PyResult<()> {
        self.with_metrics(|m| m.observe(name, &pairs(&labels), value))
    }

    /// Makes the series at zero if it is not there yet (Python's `labels()`).
    fn metric_touch(&self, name: &str, labels: Vec<(String, String)>) -> PyResult<()> {
        self.with_metrics(|m| m.touch(name, &pairs(&labels)))
    }

    /// Removes the series; false when it was not there.
    fn metric_remove(&self, name: &str, labels: Vec<(String, String)>) -> PyResult<bool> {
        self.with_metrics(|m| m.remove(name, &pairs(&labels)))
    }

    /// Nothing admitted, queued or running (true once shut down): when a lowest-priority
    /// job, such as the known answers run on demand, may take its turn.
    fn idle(&self) -> bool {
        lock(&self.server).as_ref().is_none_or(Server::idle)
    }

    /// Stops admitting, answers what was admitted within the drain grace period, and
    /// stops; blocks, without the GIL (the batches still running need it). Returns the
    /// batches still on the engine (a stuck one: its slot's thread is inside the engine,
    /// so the engine must not be closed). Later calls return 0 at once.
    fn shutdown(&self, py: Python<'_>) -> usize {
        let server = lock(&self.server).take();
        let Some(server) = server else {
            return 0;
        };
        py.detach(move || {
            server.shutdown();
            let on_engine = server.batches_on_engine();
            drop(server);
            on_engine
        })
    }
}

impl PyServer {
    /// `f` on the server's metrics (a shut-down server's: nothing, the default).
    fn with_metrics<R: Default>(
        &self,
        f: impl FnOnce(&dataplane_server::metrics::Metrics) -> Result<R, String>,
    ) -> PyResult<R> {
        match lock(&self.server).as_ref() {
            Some(server) => f(server.metrics()).map_err(PyValueError::new_err),
            None => Ok(R::default()),
        }
    }
}

fn pairs(labels: &[(String, String)]) -> Vec<(&str, &str)> {
    labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

impl Drop for PyServer {
    fn drop(&mut self) {
        let server = lock(&self.server).take();
        if let Some(server) = server {
            // Collected while serving: the same drain, never holding the GIL over it.
            Python::attach(|py| py.detach(move || drop(server)));
        }
    }
}

/// The Python callable that answers the admin routes (`PyServer::new`'s `admin`).
struct PyAdmin(Py<PyAny>);

impl Admin for PyAdmin {
    fn answer(&self, method: &str, path: &str) -> AdminAnswer {
        // Not counted among the GIL crossings: those are the infer path's, per batch.
        Python::attach(|py| {
            self.call(py, method, path).unwrap_or_else(|error| {
                log::error!("Admin route failed method={method} path={path} error={error}");
                let internal = ApiError::Internal;
                AdminAnswer {
                    status: internal.status(),
                    headers: vec![("Content-Type".into(), "application/json".into())],
                    body: internal.json_body(),
                }
            })
        })
    }
}

impl PyAdmin {
    fn call(&self, py: Python<'_>, method: &str, path: &str) -> PyResult<AdminAnswer> {
        let answer = self.0.bind(py).call1((method, path))?;
        let (status, headers, body): (u16, Vec<(String, String)>, Bound<'_, PyBytes>) =
            answer.extract()?;
        Ok(AdminAnswer {
            status,
            headers,
            body: body.as_bytes().to_vec(),
        })
    }
}
