//! `kubeinfer_dataplane.Activator`: the activator (`dataplane_server::Activator`, scale to
//! zero's request holder), started from Python with the options `kubeinfer activator`
//! rendered. It serves from threads of its own and never calls Python; its shutdown, which
//! blocks through the drain, lets the GIL go.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use dataplane_server::{Activator, ActivatorOptions};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A running activator; `shutdown()` drains and stops it (also when it is collected).
#[pyclass(module = "kubeinfer_dataplane", name = "Activator", frozen)]
pub struct PyActivator {
    /// None once shut down.
    activator: Mutex<Option<Activator>>,
    http_port: u16,
    grpc_port: Option<u16>,
}

fn lock(activator: &Mutex<Option<Activator>>) -> MutexGuard<'_, Option<Activator>> {
    activator
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[pymethods]
impl PyActivator {
    /// Reads the route table and listens with `options_json` (`ActivatorOptions`,
    /// camelCase); returns once listening. ValueError for options that do not parse,
    /// RuntimeError when it cannot start (a port taken, a wake URL that is not http://),
    /// saying why.
    #[new]
    fn new(py: Python<'_>, options_json: &str) -> PyResult<PyActivator> {
        let options: ActivatorOptions = serde_json::from_str(options_json)
            .map_err(|e| PyValueError::new_err(format!("invalid activator options: {e}")))?;
        let activator = py
            .detach(move || Activator::start(options))
            .map_err(PyRuntimeError::new_err)?;
        Ok(PyActivator {
            http_port: activator.http_port(),
            grpc_port: activator.grpc_port(),
            activator: Mutex::new(Some(activator)),
        })
    }

    /// The HTTP port listened on (the one picked when the options said 0).
    #[getter]
    fn http_port(&self) -> u16 {
        self.http_port
    }

    /// The gRPC port listened on (None: no gRPC listener).
    #[getter]
    fn grpc_port(&self) -> Option<u16> {
        self.grpc_port
    }

    /// Stops accepting; held requests wait for their backends until `grace` seconds
    /// (None: the options' drainGracePeriodSeconds), then are refused with a 503;
    /// forwarded ones are answered. Blocks, without the GIL. Later calls return at once.
    #[pyo3(signature = (grace = None))]
    fn shutdown(&self, py: Python<'_>, grace: Option<f64>) -> PyResult<()> {
        let grace = grace
            .map(Duration::try_from_secs_f64)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("invalid grace: {e}")))?;
        let activator = lock(&self.activator).take();
        let Some(activator) = activator else {
            return Ok(());
        };
        py.detach(move || match grace {
            Some(grace) => activator.shutdown(grace),
            None => activator.stop(),
        });
        Ok(())
    }
}

impl Drop for PyActivator {
    fn drop(&mut self) {
        let activator = lock(&self.activator).take();
        if let Some(activator) = activator {
            // Collected while serving: the same drain, never holding the GIL over it.
            Python::attach(|py| py.detach(move || drop(activator)));
        }
    }
}
