//! `kubeinfer_dataplane.Server`: the data plane's server over a Python engine, started from
//! Python with the options the Python side rendered (`kubeinfer.runtime.rust_dataplane`).
//! It serves from threads of its own; every call that can wait on them (start, shutdown)
//! lets the GIL go, since the slots' threads take it to run their batches.

use std::sync::{Arc, Mutex, MutexGuard};

use dataplane_server::admin::{Admin, AdminAnswer};
use dataplane_server::dataplane_core::error::ApiError;
use dataplane_server::{Server, ServerOptions};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::engine::PyEngine;

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
