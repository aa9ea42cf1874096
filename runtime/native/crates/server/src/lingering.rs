//! A lingering close for the HTTP/1 connections (nginx's `lingering_close`).
//!
//! When a server closes a socket whose receive buffer still holds bytes the client sent (a
//! body refused before it was read, the rest of a head past the limit, a request that came
//! as the connection was closing), the kernel sends a reset in place of a FIN, and a reset
//! makes the client's kernel drop what it had received and not yet read: the answer the
//! server wrote just before. The client sees ECONNRESET or a broken pipe instead of the
//! 503, 413 or 431 it was sent.
//!
//! [`Lingering`] wraps the accepted stream and delegates reading and writing to it. When
//! hyper ends the connection (its `poll_shutdown`, after the last answer was flushed), it
//! shuts the write side down (a FIN after the answer) and then reads and discards what the
//! client still sends, until the client closes its side (at once for a client that already
//! closed or reset), or [`Bounds`] end it: a request's worth of bytes, or a few seconds.
//! Only then is the socket closed, with nothing unread, so the answer reaches the client. A
//! connection dropped without that shutdown (a failed one) lingers the same, on a task of
//! its own. The bounds keep a client that sends forever from holding the socket, and the
//! graceful drain from waiting on one for longer than the bound.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// The longest a connection lingers, whatever the body read timeout.
pub const LINGER_AT_MOST: Duration = Duration::from_secs(2);

/// What a closing connection reads and discards before it closes, at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Bytes discarded, at most (then closed: a client sending more is not waited for).
    pub bytes: usize,
    /// Time from the shutdown of the write side, at most.
    pub time: Duration,
}

impl Bounds {
    /// The server's: a request's head (`head_bytes`) and its largest body, within the body
    /// read timeout and [`LINGER_AT_MOST`].
    pub fn of(max_request_bytes: usize, head_bytes: usize, body_read_timeout_seconds: f64) -> Self {
        let timeout = Duration::try_from_secs_f64(body_read_timeout_seconds.max(0.0))
            .unwrap_or(LINGER_AT_MOST);
        Bounds {
            bytes: max_request_bytes.saturating_add(head_bytes),
            time: timeout.min(LINGER_AT_MOST),
        }
    }
}

/// Where a connection is in its close.
enum Close {
    /// Serving: reads and writes go to the stream.
    Open,
    /// The write side shut down; discarding what comes until the client closes or the
    /// bounds end it.
    Discarding {
        until: Pin<Box<Sleep>>,
        discarded: usize,
    },
    /// Done: the socket closes when this is dropped.
    Closed,
}

/// An accepted TCP stream that closes by lingering (see the module's doc).
pub struct Lingering {
    /// None only once dropped (taken by the lingering task).
    stream: Option<TcpStream>,
    bounds: Bounds,
    close: Close,
}

impl Lingering {
    pub fn new(stream: TcpStream, bounds: Bounds) -> Lingering {
        Lingering {
            stream: Some(stream),
            bounds,
            close: Close::Open,
        }
    }

    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(
            self.stream
                .as_mut()
                .expect("the stream is taken only on drop"),
        )
    }

    /// Shuts the write side down, then discards until the client closes or the bounds end
    /// it; ready once the socket may be closed.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match &mut self.close {
                Close::Closed => return Poll::Ready(Ok(())),
                Close::Open => {
                    if ready!(self.stream().poll_shutdown(cx)).is_err() {
                        // Reset or gone: nothing is left to linger for, and the close is
                        // done all the same.
                        self.close = Close::Closed;
                        return Poll::Ready(Ok(()));
                    }
                    self.close = Close::Discarding {
                        until: Box::pin(tokio::time::sleep_until(
                            Instant::now() + self.bounds.time,
                        )),
                        discarded: 0,
                    };
                }
                Close::Discarding { .. } => {
                    ready!(self.poll_discard(cx));
                    self.close = Close::Closed;
                }
            }
        }
    }

    /// Reads and throws away until the client's end of stream, an error, more than the
    /// bounds' bytes, or their time.
    fn poll_discard(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut scratch = [0u8; 16 * 1024];
        loop {
            let mut buffer = ReadBuf::new(&mut scratch);
            let read = self.stream().poll_read(cx, &mut buffer);
            let limit = self.bounds.bytes;
            let Close::Discarding { until, discarded } = &mut self.close else {
                return Poll::Ready(());
            };
            match read {
                Poll::Ready(Ok(())) if buffer.filled().is_empty() => return Poll::Ready(()),
                Poll::Ready(Ok(())) => {
                    *discarded += buffer.filled().len();
                    if *discarded > limit {
                        return Poll::Ready(());
                    }
                }
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => return until.as_mut().poll(cx),
            }
        }
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.stream().poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.stream().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.stream().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    /// The lingering close: the FIN after the answer, then the discarding.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_close(cx)
    }
}

impl Drop for Lingering {
    /// A connection that ended without its shutdown (hyper failed it) lingers on a task of
    /// its own; one dropped mid-linger (the runtime stopping) closes as it is.
    fn drop(&mut self) {
        if !matches!(self.close, Close::Open) {
            return;
        }
        let (Some(stream), Ok(runtime)) =
            (self.stream.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let mut orphan = Lingering::new(stream, self.bounds);
        runtime.spawn(async move {
            let _ = std::future::poll_fn(|cx| orphan.poll_close(cx)).await;
        });
    }
}

#[cfg(test)]
mod tests;
