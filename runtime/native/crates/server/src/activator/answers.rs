//! What the activator answers itself, in each transport's words: over HTTP a JSON
//! `{"error": ...}` with its status (a 503 with Retry-After), over gRPC a trailers-only
//! answer (HTTP 200, `grpc-status` and `grpc-message` in its headers, no body; a 503's
//! Retry-After as metadata, as the runtime's gRPC service sends it).

use dataplane_core::error::ApiError;
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};

use super::forward::{ProxyBody, own_body};

/// The listener a request came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// HTTP/1 (the v2 REST API).
    Http,
    /// h2c (the v2 gRPC API).
    Grpc,
}

/// An error's answer on `transport`; a 503 says to retry after `retry_after` seconds.
pub fn refusal(error: &ApiError, transport: Transport, retry_after: u32) -> Response<ProxyBody> {
    match transport {
        Transport::Http => http_error(error, retry_after),
        Transport::Grpc => grpc_error(error, retry_after),
    }
}

fn http_error(error: &ApiError, retry_after: u32) -> Response<ProxyBody> {
    let mut response = Response::new(own_body(error.json_body()));
    *response.status_mut() =
        StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if error.status() == 503 {
        headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    }
    response
}

/// A trailers-only gRPC answer: what a gRPC server sends for a call it fails before any
/// message (the body is empty, so hyper ends the stream with these headers).
fn grpc_error(error: &ApiError, retry_after: u32) -> Response<ProxyBody> {
    let mut response = Response::new(own_body(Vec::new()));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(error.grpc_code() as u16));
    if let Ok(message) = HeaderValue::from_str(&percent_encoded(error.message())) {
        headers.insert("grpc-message", message);
    }
    if error.status() == 503 {
        headers.insert("retry-after", HeaderValue::from(retry_after));
    }
    response
}

/// gRPC's `grpc-message` encoding: printable ASCII but `%` as it is, every other byte as
/// `%XX`.
fn percent_encoded(message: &str) -> String {
    let mut encoded = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// A JSON answer of the activator's own routes.
pub fn json(body: &serde_json::Value, status: StatusCode) -> Response<ProxyBody> {
    let bytes = serde_json::to_vec(body).expect("a JSON value serializes");
    let mut response = Response::new(own_body(bytes));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
