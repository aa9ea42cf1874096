//! The activator's listeners: HTTP/1 (the v2 REST API) and h2c (the v2 gRPC API), built
//! as the runtime's server builds its own (`crate::server`, `crate::grpc`), and their
//! drain: once the activator drains, they accept no more, their connections are told to
//! close after what they carry (HTTP/1: no keep-alive; HTTP/2: GOAWAY), and they are done
//! when every connection closed; once it stops (the drain grace passed, the held requests
//! refused), the connections left get [`CLOSE_CONNECTIONS_WITHIN`] to write their last
//! answers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

use super::answers::Transport;
use super::handle::handle;
use super::{Context, Stage};
use crate::lingering::{Bounds, Lingering};
use crate::server::MAX_READ_BUFFER_BYTES;

/// How long a stopped activator waits for its connections' last answers to be written.
const CLOSE_CONNECTIONS_WITHIN: Duration = Duration::from_secs(2);

pub fn bind(
    runtime: &Runtime,
    host: &str,
    port: u16,
    transport: &str,
) -> Result<TcpListener, String> {
    let listener = std::net::TcpListener::bind((host, port))
        .map_err(|e| format!("cannot listen on {host}:{port} ({transport}): {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let _entered = runtime.enter();
    TcpListener::from_std(listener).map_err(|e| e.to_string())
}

pub fn port(listener: &TcpListener) -> Result<u16, String> {
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Serves both listeners until the activator drains and their connections closed.
pub async fn serve(context: Arc<Context>, http: TcpListener, grpc: Option<TcpListener>) {
    let grpc = async {
        if let Some(grpc) = grpc {
            accept(context.clone(), grpc, Transport::Grpc).await;
        }
    };
    tokio::join!(accept(context.clone(), http, Transport::Http), grpc);
}

/// Accepts on `listener` until the activator drains, then waits for its connections.
async fn accept(context: Arc<Context>, listener: TcpListener, transport: Transport) {
    let graceful = GracefulShutdown::new();
    let serve = connection_server(&context, transport);
    let mut stage = context.stage.subscribe();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    log::warn!("Accept failed error={error}");
                    continue;
                }
            },
            _ = stage.wait_for(|s| *s != Stage::Serving) => break,
        };
        serve(stream, peer, &graceful);
    }
    drop(listener);
    let closed = graceful.shutdown();
    tokio::pin!(closed);
    tokio::select! {
        () = &mut closed => return,
        _ = stage.wait_for(|s| *s == Stage::Stopped) => {}
    }
    if tokio::time::timeout(CLOSE_CONNECTIONS_WITHIN, closed)
        .await
        .is_err()
    {
        log::debug!("Activator connections still open at stop");
    }
}

/// What serves one accepted connection of `transport`.
fn connection_server(
    context: &Arc<Context>,
    transport: Transport,
) -> impl Fn(TcpStream, SocketAddr, &GracefulShutdown) + use<> {
    let options = &context.options;
    let mut h1 = http1::Builder::new();
    h1.title_case_headers(true)
        .max_buf_size(MAX_READ_BUFFER_BYTES)
        .max_header_size(MAX_READ_BUFFER_BYTES)
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs_f64(
            options.header_read_timeout_seconds.max(0.001),
        ));
    let h2 = http2::Builder::new(TokioExecutor::new());
    let bounds = Bounds::of(
        options.max_request_bytes,
        MAX_READ_BUFFER_BYTES,
        options.body_read_timeout_seconds,
    );
    let context = context.clone();
    move |stream: TcpStream, peer: SocketAddr, graceful: &GracefulShutdown| {
        let _ = stream.set_nodelay(true);
        let context = context.clone();
        let client = Some(peer.ip());
        let service =
            service_fn(move |request| handle(context.clone(), request, transport, client));
        let ended = |result: Result<(), hyper::Error>| {
            if let Err(error) = result {
                log::debug!("Activator connection ended error={error}");
            }
        };
        match transport {
            Transport::Http => {
                // Closed by lingering (crate::lingering): a refusal sent before its body
                // was read reaches its client.
                let io = TokioIo::new(Lingering::new(stream, bounds));
                let watched = graceful.watch(h1.serve_connection(io, service));
                tokio::spawn(async move { ended(watched.await) });
            }
            Transport::Grpc => {
                let watched = graceful.watch(h2.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move { ended(watched.await) });
            }
        }
    }
}
