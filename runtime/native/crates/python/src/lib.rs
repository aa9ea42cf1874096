//! `kubeinfer_dataplane`: kubeinfer's data plane (`dataplane_server`) as a Python
//! extension. The Python side loads the engine and checks its known answers as before, then
//! hands the engine to [`server::PyServer`] (`kubeinfer_dataplane.Server`), which serves it
//! over HTTP (and gRPC) from Rust threads, taking the GIL once per batch ([`engine`]).
//! [`activator::PyActivator`] (`kubeinfer_dataplane.Activator`) is the activator of
//! `kubeinfer activator`, which serves no model and never calls Python.

pub mod activator;
mod arrays;
pub mod engine;
pub mod mirror;
pub mod server;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn kubeinfer_dataplane(module: &Bound<'_, PyModule>) -> PyResult<()> {
    // The server's `log` records go to Python's logging (the runtime's handlers and line
    // format), under loggers named `kubeinfer.dataplane_server.<module>`. Levels are
    // cached, so a record below the logger's level never takes the GIL.
    let logger = pyo3_log::Logger::new(module.py(), pyo3_log::Caching::LoggersAndLevels)?
        .set_prefix("kubeinfer");
    if let Err(error) = logger.install() {
        // Another extension set the process's logger first: the records go there.
        eprintln!("kubeinfer_dataplane: Rust logs stay out of Python logging: {error}");
    }
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add_function(wrap_pyfunction!(gil_crossings, module)?)?;
    module.add_class::<server::PyServer>()?;
    module.add_class::<activator::PyActivator>()?;
    Ok(())
}

/// Times the server's threads have taken the GIL since the module loaded: one per batch,
/// plus one per execution slot created at start.
#[pyfunction]
fn gil_crossings() -> u64 {
    engine::gil_crossings()
}
