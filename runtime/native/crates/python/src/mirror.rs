//! The server's [`Mirror`] over a Python callable: each batch's sampled requests handed to
//! it inside the batch's one GIL crossing (the slot's thread holds the GIL then:
//! [`dataplane_server::engine::Slot::run_then`]), as plain values (names, datatypes,
//! shapes, bytes) for the Python side to make arrays of on its own thread
//! (`kubeinfer.runtime.rust_mirroring`).

use std::sync::atomic::{AtomicU64, Ordering};

use dataplane_server::dataplane_core::tensor::{Tensor, TensorData};
use dataplane_server::mirror::{Mirror, MirroredBatch};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

/// `hand_over(answered, roles, requests)`: `answered` the batch's requests answered,
/// `roles` the mirrored roles' names, `requests` a list of `(inputs, outputs,
/// server_seconds, slice_value, roles)`, each tensor `(name, datatype, shape, data)`
/// (`data`: bytes, little-endian, or a list of bytes for BYTES), `roles` the names of the
/// roles that sampled the request.
pub struct PyMirror {
    hand_over: Py<PyAny>,
    failures: AtomicU64,
}

impl PyMirror {
    pub fn new(hand_over: Py<PyAny>) -> PyMirror {
        PyMirror {
            hand_over,
            failures: AtomicU64::new(0),
        }
    }
}

impl Mirror for PyMirror {
    fn hand_over(&self, batch: MirroredBatch) {
        // The slot's thread holds the GIL here (inside its batch's crossing): attaching
        // again only counts the nesting; it is not a crossing of its own.
        Python::attach(|py| {
            if let Err(error) = self.call(py, &batch) {
                let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if failures == 1 || failures % 10_000 == 0 {
                    log::warn!(
                        "Failed to offer a batch to the mirrors failures={failures} error={error}"
                    );
                }
            }
        });
    }
}

impl PyMirror {
    fn call(&self, py: Python<'_>, batch: &MirroredBatch) -> PyResult<()> {
        let requests = PyList::empty(py);
        for request in &batch.requests {
            let roles: Vec<&str> = (request.roles.iter())
                .filter_map(|&i| batch.roles.get(i).map(String::as_str))
                .collect();
            let item = (
                tensors(py, &request.inputs)?,
                tensors(py, &request.outputs)?,
                request.server_seconds,
                request.slice_value.as_deref(),
                PyTuple::new(py, roles)?,
            );
            requests.append(item)?;
        }
        let roles = PyTuple::new(py, &batch.roles)?;
        self.hand_over
            .bind(py)
            .call1((batch.answered, roles, requests))?;
        Ok(())
    }
}

fn tensors<'py>(py: Python<'py>, tensors: &[Tensor]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for tensor in tensors {
        let data = match &tensor.data {
            TensorData::Raw(raw) => PyBytes::new(py, raw).into_any(),
            TensorData::Strings(strings) => {
                let items = strings.iter().map(|s| PyBytes::new(py, s));
                PyList::new(py, items)?.into_any()
            }
        };
        let shape = PyTuple::new(py, &tensor.shape)?;
        list.append((tensor.name.as_str(), tensor.datatype.name(), shape, data))?;
    }
    Ok(list)
}
