//! The route table the operator writes (its ConfigMap's JSON), and which route a request
//! is for: pure, no I/O.
//!
//! A request names its route by the name it was sent to (the Host header, or HTTP/2's
//! :authority): the public Service's DNS name, `service`, `service.namespace`,
//! `service.namespace.svc...`. Where the name is none of the table's (a client that
//! dialled an address), the model it asks for names the route, when exactly one route
//! serves that model.

use std::collections::HashSet;

/// One InferenceDeployment whose Service points at the activator, and where its pods are.
/// Fields it does not know are ignored: an operator newer than the activator may write
/// more, and refusing the whole table for them would leave every route unserved.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub namespace: String,
    /// The public Service's name (the one clients send to).
    pub service: String,
    /// The model names served there (`/v2/models/{name}`).
    #[serde(default)]
    pub models: Vec<String>,
    /// The Service that reaches the pods themselves, never the activator.
    pub backend_host: String,
    pub http_port: u16,
    /// None: the pods serve no gRPC.
    #[serde(default)]
    pub grpc_port: Option<u16>,
}

impl Route {
    /// `namespace/service`, as logs and errors name a route.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.service)
    }
}

#[derive(serde::Deserialize)]
struct RouteFile {
    routes: Vec<Route>,
}

/// The routes of a route file's text; why not, for one that is not a table (not JSON,
/// a field missing, a route listed twice).
pub fn parse_routes(text: &str) -> Result<Vec<Route>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new()); // a key written empty: no routes, as a missing file
    }
    let file: RouteFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut seen = HashSet::new();
    for route in &file.routes {
        if route.namespace.is_empty() || route.service.is_empty() || route.backend_host.is_empty() {
            return Err(format!(
                "route {} needs a namespace, a service and a backendHost",
                route.key()
            ));
        }
        if !seen.insert((route.namespace.as_str(), route.service.as_str())) {
            return Err(format!("route {} is listed twice", route.key()));
        }
    }
    Ok(file.routes)
}

/// Which route a request is for, or why none is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Matched {
    /// The index of the route in the table.
    Route(usize),
    /// No route: not the table's name, and not a model any route lists.
    Unrouted,
    /// The model is listed by several routes (their namespaces), the name by none.
    Ambiguous(Vec<String>),
}

/// The route `host` (a Host header or :authority, port and all) names, and else the one
/// that alone lists `model` (None: the request names no model).
pub fn match_route(routes: &[Route], host: Option<&str>, model: Option<&str>) -> Matched {
    let by_host: Vec<usize> = host
        .map(|host| routes_of_host(routes, host))
        .unwrap_or_default();
    if let [index] = by_host[..] {
        return Matched::Route(index);
    }
    // A bare `service` is listed in several namespaces: the model decides among them.
    let candidates: Vec<usize> = if by_host.is_empty() {
        (0..routes.len()).collect()
    } else {
        by_host
    };
    let Some(model) = model else {
        return Matched::Unrouted;
    };
    let listing: Vec<usize> = candidates
        .into_iter()
        .filter(|&i| routes[i].models.iter().any(|m| m == model))
        .collect();
    match listing[..] {
        [] => Matched::Unrouted,
        [index] => Matched::Route(index),
        _ => Matched::Ambiguous(
            listing
                .iter()
                .map(|&i| routes[i].namespace.clone())
                .collect(),
        ),
    }
}

/// The routes whose Service `host` names: its first label the service, and its second
/// (if it has one) the namespace.
pub fn routes_of_host(routes: &[Route], host: &str) -> Vec<usize> {
    let name = strip_port(host);
    let mut labels = name.split('.');
    let service = labels.next().unwrap_or_default();
    let namespace = labels.next();
    (routes.iter().enumerate())
        .filter(|(_, r)| r.service == service && namespace.is_none_or(|n| n == r.namespace))
        .map(|(i, _)| i)
        .collect()
}

/// A host without its port (`[::1]:80` is `[::1]`).
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_once(']').map_or(host, |(address, _)| address);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// The model a v2 HTTP path names (`/v2/models/{name}[/versions/{v}]/...`).
pub fn model_of_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v2/models/")?;
    let name = rest.split('/').next()?;
    (!name.is_empty()).then_some(name)
}

/// The model a gRPC call's message names: its field 1 (ModelInferRequest.model_name,
/// ModelReadyRequest.name and ModelMetadataRequest.name all are), read from the first
/// message of `body` (after gRPC's 5-byte frame header). None: no such field first, or a
/// compressed message (its bytes are not the message's).
pub fn model_of_grpc_message(body: &[u8]) -> Option<&str> {
    let (&compressed, rest) = body.split_first()?;
    let message = rest.get(4..)?;
    if compressed != 0 {
        return None;
    }
    let (&tag, rest) = message.split_first()?;
    if tag != FIELD_1_LENGTH_DELIMITED {
        return None;
    }
    let (length, rest) = varint(rest)?;
    let name = rest.get(..usize::try_from(length).ok()?)?;
    std::str::from_utf8(name).ok()
}

/// Field 1 with wire type 2 (length-delimited): `(1 << 3) | 2`.
const FIELD_1_LENGTH_DELIMITED: u8 = 0x0a;

/// A protobuf varint and what follows it.
fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[index + 1..]));
        }
    }
    None
}
