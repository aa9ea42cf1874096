//! kubeinfer's data plane on tokio: HTTP (hyper), gRPC (tonic), admission before the body,
//! the scheduler's driver, the slots' threads, metrics, behind the [`engine::Engine`] trait.
//!
//! The entry point is [`Server::start`]: it binds, makes the engine's slots (one OS thread
//! each) and serves on a tokio runtime of its own, so the Python extension only holds a
//! [`Server`] and calls [`Server::set_ready`] and [`Server::shutdown`]. The same crate
//! holds the activator ([`Activator`]: scale to zero's request holder, issue 44), which
//! shares the runtime's transports and limits but serves no model.

pub mod activator;
pub mod admin;
mod driver;
pub mod engine;
mod grpc;
mod http;
mod lingering;
pub mod metrics;
pub mod mirror;
mod model;
mod options;
mod server;
mod shm;
mod state;

pub use activator::{Activator, ActivatorOptions};
pub use dataplane_core;
pub use options::ServerOptions;
pub use server::Server;
