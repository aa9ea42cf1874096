//! The system shared-memory extension's routes (Triton's):
//! `GET /v2/systemsharedmemory[/region/{name}]/status`,
//! `POST /v2/systemsharedmemory/region/{name}/register` (body: key, offset, byte_size) and
//! `POST /v2/systemsharedmemory[/region/{name}]/unregister`.

use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::Value;

use dataplane_core::error::ApiError;

use super::body::{Watched, read_body};
use super::{Parts, error, json, method_not_allowed};
use crate::state::Shared;

/// The largest register body taken (three small fields).
const REGISTER_BODY_LIMIT: usize = 64 * 1024;

/// What a `/v2/systemsharedmemory` path asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmAction {
    /// `GET .../status`: the regions' (or one region's) name, key, offset and size.
    Status,
    /// `POST .../region/{name}/register`.
    Register,
    /// `POST [.../region/{name}]/unregister`: one region, or all of them.
    Unregister,
}

/// The region (None: all of them) and the action of a `/v2/systemsharedmemory` path's
/// segments after `systemsharedmemory`; None when it is no such route.
pub fn shm_route<'a>(rest: &[&'a str]) -> Option<(Option<&'a str>, ShmAction)> {
    let (region, action) = match rest {
        ["region", name, action] if !name.is_empty() => (Some(*name), *action),
        [action] => (None, *action),
        _ => return None,
    };
    match (region, action) {
        (_, "status") => Some((region, ShmAction::Status)),
        (_, "unregister") => Some((region, ShmAction::Unregister)),
        (Some(_), "register") => Some((region, ShmAction::Register)),
        _ => None,
    }
}

/// Answers one shared-memory request.
pub async fn handle(
    shared: &Shared,
    request: Request<&mut Watched>,
    region: Option<&str>,
    action: ShmAction,
) -> Response<Parts> {
    let regions = &shared.shared_memory;
    let answer = match (action, request.method(), region) {
        (ShmAction::Status, &Method::GET, _) => regions
            .status(region)
            .map(|status| json(serde_json::json!(status), StatusCode::OK)),
        (ShmAction::Unregister, &Method::POST, Some(name)) => {
            regions.unregister(name);
            Ok(empty())
        }
        (ShmAction::Unregister, &Method::POST, None) => {
            regions.unregister_all();
            Ok(empty())
        }
        (ShmAction::Register, &Method::POST, Some(name)) => register(shared, request, name).await,
        _ => return method_not_allowed(),
    };
    answer.unwrap_or_else(|failure| error(&failure))
}

async fn register(
    shared: &Shared,
    request: Request<&mut Watched>,
    name: &str,
) -> Result<Response<Parts>, ApiError> {
    let idle = Duration::from_secs_f64(shared.options.body_read_timeout_seconds.max(0.001));
    let deadline = shared.now() + idle;
    let body = request.into_body();
    let raw = read_body(body, REGISTER_BODY_LIMIT, deadline, idle, shared, &|| {}).await?;
    let (key, offset, byte_size) = register_fields(&raw)?;
    shared
        .shared_memory
        .register(name, &key, offset, byte_size)?;
    Ok(empty())
}

/// The register body's key, offset (0 when absent) and byte size.
pub fn register_fields(body: &Bytes) -> Result<(String, usize, usize), ApiError> {
    let refusal = || {
        ApiError::invalid(
            "a register request is a JSON object with key (a string), offset and byte_size \
             (integers >= 0)",
        )
    };
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
        return Err(refusal());
    };
    let natural = |field: &str, default: Option<usize>| match fields.get(field) {
        None => default.ok_or_else(refusal),
        Some(value) => value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(refusal),
    };
    let Some(Value::String(key)) = fields.get("key") else {
        return Err(refusal());
    };
    Ok((
        key.clone(),
        natural("offset", Some(0))?,
        natural("byte_size", None)?,
    ))
}

/// A 200 with no body (Triton's answer to register and unregister).
fn empty() -> Response<Parts> {
    Response::new(Parts::many(Vec::new()))
}

#[cfg(test)]
mod tests;
