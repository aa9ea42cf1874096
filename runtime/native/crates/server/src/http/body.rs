//! Reading an infer request's body, bounded in size and time: a
//! declared Content-Length over the limit is refused before a byte is read, any other
//! body as soon as it passes the limit; each part must come within the body read timeout
//! of the previous one, and the whole body by the request's deadline (408 otherwise, and
//! the connection is closed).

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use dataplane_core::batching::Time;
use dataplane_core::error::ApiError;

/// The 413 of a declared Content-Length over the limit, before anything is read.
pub fn check_declared_length(declared: Option<u64>, limit: usize) -> Result<(), ApiError> {
    match declared {
        Some(length) if length > limit as u64 => Err(ApiError::over_request_limit(format!(
            "the request body ({length} bytes) is over the limit of {limit} bytes"
        ))),
        _ => Ok(()),
    }
}

/// The clock the reading runs against (the server's, since its start).
pub trait Clock {
    fn now(&self) -> Time;
}

/// The whole body, at most `limit` bytes, each part within `idle` of the previous one and
/// all of it by `deadline`. `client_left` is told when the connection closed mid-body (the
/// request is then counted cancelled while reading, not answered: its 400 reaches
/// nobody).
pub async fn read_body<B>(
    body: &mut B,
    limit: usize,
    deadline: Time,
    idle: Duration,
    clock: &(dyn Clock + Sync),
    client_left: &(dyn Fn() + Sync),
) -> Result<Bytes, ApiError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + 'static,
{
    let declared = body
        .size_hint()
        .exact()
        .and_then(|n| usize::try_from(n).ok());
    let mut parts = Parts::for_declared(declared.filter(|&n| n <= limit));
    let bounds = ReadBounds {
        limit,
        deadline,
        idle,
    };
    let filled = read_parts(body, bounds, clock, client_left, |data| parts.push(data)).await?;
    Ok(parts.join(filled))
}

/// Reads what is left of a body and drops it, within the same bounds as [`read_body`]:
/// the bytes dropped.
pub async fn discard_body<B>(
    body: &mut B,
    limit: usize,
    deadline: Time,
    idle: Duration,
    clock: &(dyn Clock + Sync),
) -> Result<usize, ApiError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + 'static,
{
    let bounds = ReadBounds {
        limit,
        deadline,
        idle,
    };
    read_parts(body, bounds, clock, &|| {}, drop).await
}

#[derive(Clone, Copy)]
struct ReadBounds {
    limit: usize,
    deadline: Time,
    idle: Duration,
}

/// Each part of the body handed to `keep` as it comes, within `bounds`: the bytes read.
async fn read_parts<B>(
    body: &mut B,
    bounds: ReadBounds,
    clock: &(dyn Clock + Sync),
    client_left: &(dyn Fn() + Sync),
    mut keep: impl FnMut(Bytes),
) -> Result<usize, ApiError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + 'static,
{
    let ReadBounds {
        limit,
        deadline,
        idle,
    } = bounds;
    let mut filled = 0usize;
    loop {
        let remaining = deadline.saturating_sub(clock.now());
        if remaining.is_zero() {
            return Err(ApiError::RequestTimeout(format!(
                "the request body did not arrive by the request's deadline ({filled} bytes had come)"
            )));
        }
        let frame = match tokio::time::timeout(idle.min(remaining), body.frame()).await {
            Err(_) if idle < remaining => return Err(stalled(filled, idle)),
            Err(_) => continue, // the deadline: answered at the top
            Ok(None) => return Ok(filled),
            Ok(Some(Err(error))) => {
                if closed_mid_body(&error) {
                    client_left();
                }
                return Err(ApiError::invalid(format!(
                    "the request body cannot be read: {error}"
                )));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if filled + data.len() > limit {
            return Err(ApiError::over_request_limit(format!(
                "the request body is over the limit of {limit} bytes"
            )));
        }
        filled += data.len();
        keep(data);
    }
}

/// Declared bodies this large are assembled in an anonymous mapping of their own.
const MAPPED_BODY_BYTES: usize = 1024 * 1024;

/// A body as it comes: hyper's parts kept (joined at the end), or, for a large declared
/// length, copied as they come into a mapping of that length. The mapping is returned to
/// the system as soon as the request's last view of it goes (an abandoned upload's at
/// once), where parts kept in the allocator's arenas would stay resident after they are
/// freed, scattered among the small allocations of the other requests.
enum Parts {
    Kept(Vec<Bytes>),
    Mapped(memmap2::MmapMut, usize),
}

impl Parts {
    fn for_declared(declared: Option<usize>) -> Parts {
        match declared {
            Some(length) if length >= MAPPED_BODY_BYTES => {
                match memmap2::MmapMut::map_anon(length) {
                    Ok(map) => Parts::Mapped(map, 0),
                    Err(_) => Parts::Kept(Vec::new()), // no mapping: the allocator's then
                }
            }
            _ => Parts::Kept(Vec::new()),
        }
    }

    fn push(&mut self, data: Bytes) {
        match self {
            Parts::Kept(parts) => parts.push(data),
            Parts::Mapped(map, at) if *at + data.len() <= map.len() => {
                map[*at..*at + data.len()].copy_from_slice(&data);
                *at += data.len();
            }
            Parts::Mapped(map, at) => {
                // More than declared (hyper refuses that): kept as parts from here on.
                let mut kept = vec![Bytes::copy_from_slice(&map[..*at])];
                kept.push(data);
                *self = Parts::Kept(kept);
            }
        }
    }

    fn join(self, total: usize) -> Bytes {
        match self {
            Parts::Kept(parts) => join(parts, total),
            Parts::Mapped(map, at) => Bytes::from_owner(map).slice(..at),
        }
    }
}

/// A request's body as its route reads it, watched so that what the route left unread
/// can be told afterwards (hyper's own `is_end_stream` cannot tell a chunked body's end).
pub struct Watched {
    inner: Incoming,
    /// Read to its end, or failed (nothing more will come of it).
    ended: bool,
    /// Polled at all: a client waiting for `100 Continue` has been invited to send it.
    polled: bool,
}

impl Watched {
    pub fn new(inner: Incoming) -> Watched {
        Watched {
            inner,
            ended: false,
            polled: false,
        }
    }

    /// Nothing of the body is left to read.
    pub fn ended(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    /// The route never asked for a byte of it.
    pub fn untouched(&self) -> bool {
        !self.polled
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.polled = true;
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            self.ended = true;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.ended()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// hyper's error for a connection that closed (or was reset) before the body it declared
/// was complete.
fn closed_mid_body(error: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let Some(error) = error.downcast_ref::<hyper::Error>() else {
        return false;
    };
    let io = std::error::Error::source(error).and_then(|s| s.downcast_ref::<std::io::Error>());
    error.is_incomplete_message()
        || io.is_some_and(|io| {
            matches!(
                io.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
            )
        })
}

fn stalled(filled: usize, idle: Duration) -> ApiError {
    ApiError::RequestTimeout(format!(
        "the request body stalled ({filled} bytes had come; a part must come within {} s of \
         the previous one, and the whole body by the request's deadline)",
        seconds_g(idle.as_secs_f64())
    ))
}

/// Seconds as Python's `{:g}` writes them for the usual values (30, 0.5).
fn seconds_g(seconds: f64) -> String {
    let text = format!("{seconds}");
    text.strip_suffix(".0").map(str::to_string).unwrap_or(text)
}

/// One part as it is (the common case: no copy); several, copied once into one buffer.
fn join(mut parts: Vec<Bytes>, total: usize) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut joined = BytesMut::with_capacity(total);
    for part in parts {
        joined.extend_from_slice(&part);
    }
    joined.freeze()
}

#[cfg(test)]
mod tests;
