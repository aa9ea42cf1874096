//! gRPC through the activator's h2c listener: a call held until a backend started late is
//! ready, then forwarded over HTTP/2 to the backend's gRPC port, its answer's message and
//! trailers (gRPC's status is in them) passed on as they came; routed by its :authority
//! or, sent to an address, by the model its message names; refusals trailers-only, with
//! gRPC's codes (NOT_FOUND for no route, UNAVAILABLE past the bound); a call a leaving pod
//! refuses at admission is sent again to one that admits it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::{HeaderMap, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

use super::{Backend, Scratch, activator, client_runtime, free_port, held, until};

/// Frames sent one after the other: a message, then trailers.
struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// A toy gRPC backend on `port` (h2c): answers every call with its own message back,
/// then trailers naming the HTTP version and `te` it was sent with; while `refusing` is
/// above 0 it counts it down and refuses the call as the runtime refuses at admission
/// (trailers-only UNAVAILABLE with retry-after).
async fn grpc_backend(port: u16, refusing: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let refusing = refusing.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let refusing = refusing.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let message = body.collect().await.unwrap().to_bytes();
                    let refused = refusing
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if refused {
                        let mut response = Response::new(Frames(VecDeque::new()));
                        let headers = response.headers_mut();
                        headers.insert("content-type", "application/grpc".parse().unwrap());
                        headers.insert("grpc-status", "14".parse().unwrap());
                        headers.insert(
                            "grpc-message",
                            "the server is shutting down".parse().unwrap(),
                        );
                        headers.insert("retry-after", "1".parse().unwrap());
                        return Ok::<_, Infallible>(response);
                    }
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", "0".parse().unwrap());
                    trailers.insert("x-version", format!("{:?}", parts.version).parse().unwrap());
                    let te = parts
                        .headers
                        .get("te")
                        .cloned()
                        .unwrap_or("none".parse().unwrap());
                    trailers.insert("x-te", te);
                    let frames = Frames(VecDeque::from([
                        Frame::data(message),
                        Frame::trailers(trailers),
                    ]));
                    let mut response = Response::new(frames);
                    response
                        .headers_mut()
                        .insert("content-type", "application/grpc".parse().unwrap());
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service);
            tokio::spawn(connection);
        }
    })
}

#[derive(Clone, PartialEq, prost::Message)]
struct Named {
    #[prost(string, tag = "1")]
    name: String,
}

fn framed(model: &str) -> Bytes {
    let message = Named { name: model.into() }.encode_to_vec();
    let mut frame = vec![0];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    Bytes::from(frame)
}

/// What a gRPC client reads of a call: headers, message bytes, trailers (None:
/// trailers-only, every field in the headers).
struct Called {
    headers: HeaderMap,
    message: Bytes,
    trailers: Option<HeaderMap>,
}

/// A ModelInfer call for `model` to the activator's gRPC `port`, sent to `authority`.
async fn call(port: u16, authority: String, model: &str) -> Called {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = Request::post(format!(
        "http://{authority}/inference.GRPCInferenceService/ModelInfer"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(framed(model)))
    .unwrap();
    let called = async {
        let (parts, mut body) = sender.send_request(request).await.unwrap().into_parts();
        let (mut message, mut trailers) = (Vec::new(), None);
        while let Some(frame) = body.frame().await {
            match frame.unwrap().into_data() {
                Ok(data) => message.extend_from_slice(&data),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        Called {
            headers: parts.headers,
            message: Bytes::from(message),
            trailers,
        }
    };
    // A bound for a broken test (one that would hang), not a wait.
    tokio::time::timeout(Duration::from_secs(30), called)
        .await
        .expect("answered within 30 s")
}

#[test]
fn a_call_held_until_its_backend_is_ready_gets_its_answer_and_trailers_as_they_came() {
    let scratch = Scratch::new("grpc");
    let (http_port, grpc_port) = (free_port(), free_port());
    let activator = activator(&scratch, http_port, Some(grpc_port), json!({}));
    let port = activator.grpc_port().unwrap();
    client_runtime().block_on(async {
        let by_name = tokio::spawn(call(port, "svc.ns:8001".into(), "m"));
        let by_model = tokio::spawn(call(port, format!("127.0.0.1:{port}"), "m"));
        until("2 calls held", || held(&activator) == 2).await;
        let _ready = Backend::start(http_port).await; // readiness is asked over HTTP
        let _grpc = grpc_backend(grpc_port, Arc::default()).await;
        for called in [by_name.await.unwrap(), by_model.await.unwrap()] {
            assert_eq!(called.headers["content-type"], "application/grpc");
            assert_eq!(called.message, framed("m"), "the message came back whole");
            let trailers = called.trailers.expect("the backend's trailers");
            assert_eq!(trailers["grpc-status"], "0");
            assert_eq!(trailers["x-version"], "HTTP/2.0");
            assert_eq!(trailers["x-te"], "trailers");
        }
    });
}

#[test]
fn a_call_for_no_route_or_past_the_bound_is_refused_trailers_only() {
    let scratch = Scratch::new("grpc-refused");
    let changes = json!({"maxHeldRequestsPerRoute": 1});
    let activator = activator(&scratch, free_port(), Some(free_port()), changes);
    let port = activator.grpc_port().unwrap();
    client_runtime().block_on(async {
        let unknown = call(port, "127.0.0.1".into(), "nobody").await;
        assert_eq!(
            (unknown.headers["grpc-status"].as_bytes(), unknown.trailers),
            (b"5".as_ref(), None)
        );
        let message = unknown.headers["grpc-message"].to_str().unwrap();
        assert!(message.contains("no route for host"), "{message}");
        assert!(unknown.message.is_empty());
        let _held = tokio::spawn(call(port, "svc".into(), "m"));
        until("1 call held", || held(&activator) == 1).await;
        let refused = call(port, "svc".into(), "m").await;
        assert_eq!(refused.headers["grpc-status"], "14");
        assert_eq!(refused.headers["retry-after"], "1");
        assert!(refused.trailers.is_none());
    });
}

#[test]
fn a_call_a_leaving_pod_refuses_at_admission_is_sent_again_and_answered() {
    let scratch = Scratch::new("grpc-leaving");
    let (http_port, grpc_port) = (free_port(), free_port());
    let activator = activator(&scratch, http_port, Some(grpc_port), json!({}));
    let port = activator.grpc_port().unwrap();
    client_runtime().block_on(async {
        let _ready = Backend::start(http_port).await;
        let refusing = Arc::new(AtomicUsize::new(0));
        let _grpc = grpc_backend(grpc_port, refusing.clone()).await;
        let first = call(port, "svc.ns:8001".into(), "m").await; // the backend known ready
        assert_eq!(first.trailers.expect("answered")["grpc-status"], "0");
        refusing.store(2, Ordering::SeqCst);
        let called = call(port, "svc.ns:8001".into(), "m").await;
        assert_eq!(refusing.load(Ordering::SeqCst), 0, "both refusals were met");
        assert_eq!(
            called.message,
            framed("m"),
            "answered by the pod that admitted it"
        );
        assert_eq!(
            called.trailers.expect("the backend's trailers")["grpc-status"],
            "0"
        );
    });
}
