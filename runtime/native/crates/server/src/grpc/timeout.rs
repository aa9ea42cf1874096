//! The client's own deadline: gRPC's `grpc-timeout` header (at most 8 digits and a unit,
//! `H` `M` `S` `m` `u` `n`), which tonic's own server reads only in its transport layer,
//! not used here.

use std::time::Duration;

use tonic::metadata::MetadataMap;

/// The header gRPC sends a call's deadline in, relative to when it was sent.
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// The call's deadline from its arrival (None: no deadline, or one that does not parse,
/// which gRPC's servers ignore too).
pub fn client_timeout(metadata: &MetadataMap) -> Option<Duration> {
    parse(metadata.get(GRPC_TIMEOUT)?.to_str().ok()?)
}

/// `grpc-timeout`'s value as a duration.
pub fn parse(value: &str) -> Option<Duration> {
    let unit_at = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(unit_at);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}
