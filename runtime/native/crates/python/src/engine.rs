//! The server's [`Engine`] over a Python engine (`kubeinfer.runtime.engines.base`): its
//! tensor specs read once, at start, and execution slots that take the GIL once per batch.
//!
//! [`Slot::run`] is that one crossing: the slot's `input_views(rows, shape)` (numpy views of
//! its preallocated buffers), `fill` writing the requests' rows straight into their memory,
//! the slot's `run(rows, shape)` (ONNX Runtime releases the GIL while it computes), and its
//! outputs copied into tensors the server owns, before the GIL is let go.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use dataplane_server::dataplane_core::batching::BatchShape;
use dataplane_server::dataplane_core::error::ApiError;
use dataplane_server::dataplane_core::tensor::{DataType, Tensor, TensorSpec};
use dataplane_server::engine::{Engine, InputBuffer, RunError, Slot};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::arrays::{self, LentView};

#[cfg(test)]
mod tests;

static GIL_CROSSINGS: AtomicU64 = AtomicU64::new(0);

/// Times a thread of the server has taken the GIL (creating a slot, running a batch), so a
/// benchmark can state crossings per batch: one.
pub fn gil_crossings() -> u64 {
    GIL_CROSSINGS.load(Ordering::Relaxed)
}

fn attach_counted<R>(f: impl FnOnce(Python<'_>) -> R) -> R {
    GIL_CROSSINGS.fetch_add(1, Ordering::Relaxed);
    Python::attach(f)
}

/// A loaded Python engine, served under the model's name and version.
pub struct PyEngine {
    engine: Py<PyAny>,
    name: String,
    version: String,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    max_batch_size: usize,
    platform: String,
}

impl PyEngine {
    /// Reads the engine's `inputs`, `outputs`, `max_batch_size` and platform (the GIL held).
    pub fn new(engine: &Bound<'_, PyAny>, name: String, version: String) -> PyResult<PyEngine> {
        Ok(PyEngine {
            inputs: specs(&engine.getattr("inputs")?)?,
            outputs: specs(&engine.getattr("outputs")?)?,
            max_batch_size: engine.getattr("max_batch_size")?.extract()?,
            platform: platform(engine)?,
            engine: engine.clone().unbind(),
            name,
            version,
        })
    }
}

/// The model's `platform` in its metadata: the engine's own `platform`
/// attribute when it has one, else its class's name (`OnnxRuntimeEngine`).
fn platform(engine: &Bound<'_, PyAny>) -> PyResult<String> {
    match engine.getattr_opt("platform")? {
        Some(platform) => platform.extract(),
        None => engine.get_type().name()?.extract(),
    }
}

fn specs(python_specs: &Bound<'_, PyAny>) -> PyResult<Vec<TensorSpec>> {
    python_specs.try_iter()?.map(|s| spec(&s?)).collect()
}

/// A `kubeinfer.runtime.engines.base.TensorSpec` as the server's.
fn spec(python_spec: &Bound<'_, PyAny>) -> PyResult<TensorSpec> {
    let datatype: String = python_spec.getattr("datatype")?.extract()?;
    Ok(TensorSpec {
        name: python_spec.getattr("name")?.extract()?,
        datatype: DataType::from_name(&datatype).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "{datatype:?} is not an Open Inference Protocol datatype"
            ))
        })?,
        shape: python_spec.getattr("shape")?.extract()?,
        axis_names: python_spec.getattr("axis_names")?.extract()?,
        min_item_shape: python_spec.getattr("min_item_shape")?.extract()?,
        max_item_shape: python_spec.getattr("max_item_shape")?.extract()?,
    })
}

impl Engine for PyEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    fn max_batch_size(&self) -> usize {
        self.max_batch_size
    }

    fn platform(&self) -> &str {
        &self.platform
    }

    fn create_slot(&self) -> Result<Box<dyn Slot>, String> {
        attach_counted(|py| {
            let slot = self
                .engine
                .bind(py)
                .call_method0("create_slot")
                .map_err(|e| format!("cannot create an execution slot: {e}"))?;
            Ok(Box::new(PySlot {
                slot: slot.unbind(),
                inputs: self.inputs.clone(),
                outputs: self.outputs.clone(),
            }) as Box<dyn Slot>)
        })
    }
}

/// One of the Python engine's execution slots.
pub struct PySlot {
    slot: Py<PyAny>,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
}

impl Slot for PySlot {
    fn run(
        &mut self,
        rows: usize,
        shape: Option<&BatchShape>,
        fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
    ) -> Result<Vec<Tensor>, RunError> {
        attach_counted(|py| self.run_attached(py, rows, shape, fill))
    }

    /// The batch's one crossing: `after` (the answers sent, the mirrored requests handed
    /// over) runs before the GIL is let go.
    fn run_then(
        &mut self,
        rows: usize,
        shape: Option<&BatchShape>,
        fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
        after: &mut dyn FnMut(Result<Vec<Tensor>, RunError>),
    ) {
        attach_counted(|py| {
            let outcome = self.run_attached(py, rows, shape, fill);
            after(outcome);
        })
    }
}

impl PySlot {
    fn run_attached(
        &self,
        py: Python<'_>,
        rows: usize,
        shape: Option<&BatchShape>,
        fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
    ) -> Result<Vec<Tensor>, RunError> {
        let slot = self.slot.bind(py);
        let shape_argument = match shape {
            None => py.None().into_bound(py),
            Some(shape) => shape_tuple(py, shape).map_err(engine_error)?.into_any(),
        };
        let views = slot
            .call_method1("input_views", (rows, &shape_argument))
            .map_err(engine_error)?;
        self.fill_views(&views, rows, shape, fill)?;
        let outputs = slot
            .call_method1("run", (rows, &shape_argument))
            .map_err(engine_error)?;
        self.copy_outputs(&outputs)
    }

    /// Lends each input view's memory to `fill` (BYTES inputs: a list it pushes to, stored
    /// into the object view after).
    fn fill_views(
        &self,
        views: &Bound<'_, PyAny>,
        rows: usize,
        shape: Option<&BatchShape>,
        fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
    ) -> Result<(), RunError> {
        let views = views
            .cast::<PyDict>()
            .map_err(|_| RunError::Engine("the slot's input_views is not a dict".into()))?;
        let mut lent: Vec<Option<LentView<'_>>> = Vec::with_capacity(self.inputs.len());
        let mut elements: Vec<Vec<Bytes>> = Vec::new();
        let mut views_in_order = Vec::with_capacity(self.inputs.len());
        for (index, spec) in self.inputs.iter().enumerate() {
            let view = views
                .get_item(&spec.name)
                .map_err(engine_error)?
                .ok_or_else(|| {
                    RunError::Engine(format!("the slot has no input view of {:?}", spec.name))
                })?;
            if spec.datatype == DataType::Bytes {
                lent.push(None);
                elements.push(Vec::new());
            } else {
                let expected = batch_shape_of(spec, index, rows, shape)?;
                let view = arrays::lend_view(&view, &spec.name, spec.datatype, &expected)
                    .map_err(RunError::Engine)?;
                lent.push(Some(view));
            }
            views_in_order.push(view);
        }
        fill_lent(&mut lent, &mut elements, fill)?;
        drop(lent); // the write borrows end before the engine reads the buffers
        let mut elements = elements.into_iter();
        for (spec, view) in self.inputs.iter().zip(&views_in_order) {
            if spec.datatype == DataType::Bytes {
                let packed = elements.next().unwrap_or_default();
                arrays::store_elements(view, &spec.name, &packed).map_err(RunError::Engine)?;
            }
        }
        Ok(())
    }

    fn copy_outputs(&self, outputs: &Bound<'_, PyAny>) -> Result<Vec<Tensor>, RunError> {
        self.outputs
            .iter()
            .map(|spec| {
                let value = outputs.get_item(&spec.name).map_err(|_| {
                    RunError::Engine(format!("the engine returned no output {:?}", spec.name))
                })?;
                arrays::copy_output(&spec.name, &value).map_err(RunError::Engine)
            })
            .collect()
    }
}

/// Calls `fill` with the lent views (in the model's input order), BYTES ones as lists.
fn fill_lent(
    lent: &mut [Option<LentView<'_>>],
    elements: &mut [Vec<Bytes>],
    fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
) -> Result<(), RunError> {
    let mut elements = elements.iter_mut();
    let mut buffers: Vec<InputBuffer<'_>> = lent
        .iter_mut()
        .map(|view| match view {
            // SAFETY: the view's memory stays valid and unaliased while its write borrow
            // (held in `lent`, which outlives `buffers`) lives, and the GIL is held.
            Some(view) => {
                InputBuffer::Fixed(unsafe { std::slice::from_raw_parts_mut(view.data, view.len) })
            }
            None => InputBuffer::Elements(elements.next().expect("one list per BYTES input")),
        })
        .collect();
    fill(&mut buffers).map_err(RunError::Fill)
}

/// The shape of input `index`'s view for this batch: rows, then the batch's item shape for
/// a model with variable axes, else the input's fixed one.
fn batch_shape_of(
    spec: &TensorSpec,
    index: usize,
    rows: usize,
    shape: Option<&BatchShape>,
) -> Result<Vec<usize>, RunError> {
    let item: Vec<usize> = match shape.and_then(|shape| shape.get(index)) {
        Some(item) => item.clone(),
        None if !spec.variable() => spec.item_shape().iter().map(|&d| d as usize).collect(),
        None => {
            return Err(RunError::Engine(format!(
                "input {:?} has variable axes and the batch gave no shape for it",
                spec.name
            )));
        }
    };
    Ok(std::iter::once(rows).chain(item).collect())
}

fn shape_tuple<'py>(py: Python<'py>, shape: &BatchShape) -> PyResult<Bound<'py, PyTuple>> {
    let items = shape
        .iter()
        .map(|item| PyTuple::new(py, item))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, items)
}

/// The Python exception's own message (`str(error)`), as the Python batcher reports it.
fn engine_error(error: PyErr) -> RunError {
    RunError::Engine(Python::attach(|py| {
        error
            .value(py)
            .str()
            .map(|s| s.to_string())
            .unwrap_or_else(|_| error.to_string())
    }))
}
