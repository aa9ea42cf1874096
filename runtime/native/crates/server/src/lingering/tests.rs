//! The lingering close on real loopback sockets: an answer written while the client is
//! still sending reaches it (the bytes after it are read and thrown away, no reset), a
//! client that closed ends the close at once, and the bounds end it for a client that
//! never stops or never closes.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Bounds, LINGER_AT_MOST, Lingering};

const ANSWER: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A connected pair: the server's end wrapped, the client's end bare.
async fn pair(bounds: Bounds) -> (Lingering, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    (Lingering::new(server, bounds), client)
}

const ROOMY: Bounds = Bounds {
    bytes: 64 << 20,
    time: Duration::from_secs(5),
};

/// The client's side of a refused upload: `body` bytes sent (more than the sockets'
/// buffers hold: a reset fails the sends), then everything read until the server's end of
/// stream.
async fn upload_then_read(mut client: TcpStream, body: usize) -> std::io::Result<Vec<u8>> {
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < body {
        let n = chunk.len().min(body - sent);
        client.write_all(&chunk[..n]).await?;
        sent += n;
    }
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await?;
    Ok(answer)
}

#[test]
fn an_answer_written_before_the_body_is_read_reaches_the_client() {
    runtime().block_on(async {
        let (mut server, mut client) = pair(ROOMY).await;
        client.write_all(b"POST / HTTP/1.1\r\n").await.unwrap();
        let uploading = tokio::spawn(upload_then_read(client, 16 << 20));
        server.write_all(ANSWER).await.unwrap();
        server.shutdown().await.unwrap();
        drop(server);
        let answer = uploading.await.unwrap().expect("no reset");
        assert_eq!(answer, ANSWER);
    });
}

#[test]
fn a_connection_dropped_without_its_shutdown_lingers_too() {
    runtime().block_on(async {
        let (mut server, mut client) = pair(ROOMY).await;
        client.write_all(b"POST / HTTP/1.1\r\n").await.unwrap();
        let uploading = tokio::spawn(upload_then_read(client, 16 << 20));
        server.write_all(ANSWER).await.unwrap();
        drop(server);
        assert_eq!(uploading.await.unwrap().expect("no reset"), ANSWER);
    });
}

#[test]
fn a_client_that_closed_ends_the_close_at_once() {
    runtime().block_on(async {
        let (mut server, client) = pair(ROOMY).await;
        drop(client);
        let started = Instant::now();
        server.shutdown().await.unwrap();
        assert!(started.elapsed() < Duration::from_millis(500));
    });
}

#[test]
fn a_client_that_never_closes_is_closed_after_the_time_bound() {
    runtime().block_on(async {
        let bounds = Bounds {
            time: Duration::from_millis(300),
            ..ROOMY
        };
        let (mut server, _client) = pair(bounds).await;
        let started = Instant::now();
        server.shutdown().await.unwrap();
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(290), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    });
}

#[test]
fn a_client_that_sends_past_the_byte_bound_is_closed_without_waiting() {
    runtime().block_on(async {
        let bounds = Bounds {
            bytes: 256 * 1024,
            time: Duration::from_secs(30),
        };
        let (mut server, mut client) = pair(bounds).await;
        let sending = tokio::spawn(async move {
            let chunk = vec![b'x'; 64 * 1024];
            while client.write_all(&chunk).await.is_ok() {}
        });
        let started = Instant::now();
        server.shutdown().await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(server);
        tokio::time::timeout(Duration::from_secs(5), sending)
            .await
            .expect("the client's sends fail once the socket is closed")
            .unwrap();
    });
}

#[test]
fn the_bounds_are_a_request_within_the_body_timeout_and_two_seconds() {
    assert_eq!(
        Bounds::of(4096, 65536, 1.0),
        Bounds {
            bytes: 4096 + 65536,
            time: Duration::from_secs(1)
        }
    );
    assert_eq!(Bounds::of(10, 0, 30.0).time, LINGER_AT_MOST);
    assert_eq!(Bounds::of(10, 0, f64::INFINITY).time, LINGER_AT_MOST);
}
