//! The runtime's admin routes whose data the embedding side owns (the known-answer
//! verdicts, the mirrors' figures; `GET /v2/batching` is the scheduler's, answered with
//! the metrics), handed to its [`Admin`] on a blocking thread, only on those routes: an
//! infer request never reaches it.

use std::sync::Arc;

use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::{Method, Response, StatusCode};

use dataplane_core::error::ApiError;

use crate::http::{Parts, error};
use crate::state::Shared;

/// The routes an [`Admin`] answers, each with the methods it takes (a POST of the known
/// answers runs the set again first).
pub const ADMIN_ROUTES: &[(&str, &[Method])] = &[
    ("/v2/known-answers", &[Method::GET, Method::POST]),
    ("/v2/shadow", &[Method::GET]),
    ("/v2/quality", &[Method::GET]),
    ("/v2/quality/exemplars", &[Method::GET]),
];

/// An admin route's answer: its status, headers (Content-Type among them) and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The headers, in order (a Content-Type where the body has one).
    pub headers: Vec<(String, String)>,
    /// The body, as it is sent.
    pub body: Vec<u8>,
}

/// What answers the admin routes ([`ADMIN_ROUTES`]) whose data is the embedding side's.
/// Called on a blocking thread of the server's runtime, so it may wait (a POST of the
/// known answers runs them once the scheduler is idle, [`crate::Server::idle`]).
pub trait Admin: Send + Sync {
    /// The answer to `method` on `path` (one of [`ADMIN_ROUTES`], its method allowed).
    fn answer(&self, method: &str, path: &str) -> AdminAnswer;
}

/// Whether `path` is an admin route the [`Admin`] answers.
pub fn is_admin_route(path: &str) -> bool {
    ADMIN_ROUTES.iter().any(|(route, _)| *route == path)
}

/// The answer of an admin route: 404 without an [`Admin`] (as a route the server does not
/// have), 405 for a method the route does not take, else the [`Admin`]'s answer.
pub async fn answer(shared: &Arc<Shared>, method: &Method, path: &str) -> Response<Parts> {
    let allowed = ADMIN_ROUTES
        .iter()
        .find(|(route, _)| *route == path)
        .is_some_and(|(_, methods)| methods.contains(method));
    let Some(admin) = shared.admin.get().cloned() else {
        return error(&ApiError::NotFound(format!("no route {method} {path}")));
    };
    if !allowed {
        return crate::http::method_not_allowed();
    }
    let (method, path) = (method.to_string(), path.to_string());
    match tokio::task::spawn_blocking(move || admin.answer(&method, &path)).await {
        Ok(answer) => response(answer),
        Err(failed) => {
            log::error!("Admin route failed error={failed}");
            error(&ApiError::Internal)
        }
    }
}

fn response(answer: AdminAnswer) -> Response<Parts> {
    let mut response = Response::new(Parts::one(answer.body));
    *response.status_mut() =
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in answer.headers {
        match (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => log::warn!("Dropped an admin answer's invalid header name={name}"),
        }
    }
    if !headers.contains_key(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    response
}

#[cfg(test)]
mod tests;
