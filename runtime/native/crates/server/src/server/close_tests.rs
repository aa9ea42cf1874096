//! How the server's HTTP/1 connections close (crate::lingering), over real sockets with a
//! raw client: an answer sent while the client is still sending its request (a refusal
//! before the body, a head past the limit) reaches it rather than a reset, and a
//! connection's close holds a shutdown no longer than its bounds.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::tests::{client, get_json, options, serve, serve_with};
use hyper::StatusCode;
use serde_json::Value;

/// Sends `head` and then `body` bytes of filler without reading, as a client sending its
/// request before it reads the answer does, then reads everything until the server closes.
/// A server that closed with bytes of the request unread has reset the connection: the
/// client's sends fail (ECONNRESET, a broken pipe), and a client such as Python's
/// `http.client` never reads the answer; so does this test.
async fn send_then_read(port: u16, head: &[u8], body: usize) -> Vec<u8> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut sent = stream.write_all(head).await;
    let chunk = vec![b'x'; 16 * 1024];
    let mut left = body;
    while sent.is_ok() && left > 0 {
        let n = chunk.len().min(left);
        sent = stream.write_all(&chunk[..n]).await;
        left -= n;
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server closes within its bounds");
    let answered = String::from_utf8_lossy(&answer);
    if let Err(error) = sent {
        panic!("the request could not be sent whole: {error} (then read: {answered:?})");
    }
    read.unwrap_or_else(|e| panic!("the answer was lost to {e} (read so far: {answered:?})"));
    answer
}

/// The status and the body of one raw answer.
fn parsed(answer: &[u8]) -> (u16, String, String) {
    let text = String::from_utf8_lossy(answer).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole head");
    let status = head[9..12].parse().expect("a status line");
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[test]
fn a_refused_request_whose_body_is_still_coming_gets_its_503() {
    let mut options = options();
    options.max_request_bytes = 32 << 20;
    let (server, runs) = serve_with(0, Duration::ZERO, options);
    server.set_ready(false);
    // A client that asked for `100 Continue` and sends its body without waiting for it:
    // refused before a byte of it is read, its connection closed (the body was never
    // invited), and the client sends it all before it reads: more than the sockets'
    // buffers hold, so that a server closing at once resets the connection under it.
    let body = 16 << 20;
    let head = format!(
        "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\
         Content-Length: {body}\r\n\r\n"
    );
    let answer = client().block_on(send_then_read(server.http_port(), head.as_bytes(), body));
    let (status, head, json) = parsed(&answer);
    assert_eq!(status, 503, "{head}");
    assert!(head.contains("connection: close"), "{head}");
    let error: Value = serde_json::from_str(&json).expect("the JSON error, whole");
    assert!(
        error["error"].as_str().is_some_and(|m| !m.is_empty()),
        "{error}"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);
    server.shutdown();
}

#[test]
fn a_body_over_the_limit_gets_its_413_though_the_client_sends_it_all() {
    let mut options = options();
    options.max_request_bytes = 16 << 20;
    let (server, _) = serve_with(0, Duration::ZERO, options);
    // Past the limit, within a request's worth (the limit and a head's buffer).
    let body = (16 << 20) + 32 * 1024;
    let head = format!(
        "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {body}\r\n\r\n"
    );
    let answer = client().block_on(send_then_read(server.http_port(), head.as_bytes(), body));
    let (status, _, json) = parsed(&answer);
    assert_eq!(status, 413);
    assert!(json.contains("over the limit of 16777216 bytes"), "{json}");
    server.shutdown();
}

#[test]
fn a_head_past_the_limit_gets_its_431_and_the_server_serves_on() {
    let (server, _) = serve(0, Duration::ZERO);
    let port = server.http_port();
    // A 70,000-byte header block, sent whole before the answer is read.
    let head = format!(
        "GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Long: {}",
        "a".repeat(66_000)
    );
    let answer = client().block_on(send_then_read(port, head.as_bytes(), 70_000 - head.len()));
    assert_eq!(parsed(&answer).0, 431);
    // Just within the limit: taken.
    let within = format!(
        "GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Long: {}\r\n\r\n",
        "a".repeat(60_000)
    );
    let answer = client().block_on(send_then_read(port, within.as_bytes(), 0));
    assert_eq!(parsed(&answer).0, 200);
    let (status, _) = client().block_on(get_json(port, "/v2/health/live"));
    assert_eq!(status, StatusCode::OK);
    server.shutdown();
}

#[test]
fn an_idle_keep_alive_connection_sees_a_clean_close_at_shutdown_within_the_bounds() {
    let mut options = options();
    options.body_read_timeout_seconds = 0.5;
    let (server, _) = serve_with(0, Duration::ZERO, options);
    let port = server.http_port();
    let runtime = client();
    let mut idle = runtime.block_on(async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let request = "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n";
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buffer = [0u8; 1024];
        let n = stream.read(&mut buffer).await.unwrap();
        assert!(String::from_utf8_lossy(&buffer[..n]).ends_with("{\"live\":true}"));
        stream
    });
    let silent = runtime.block_on(TcpStream::connect(("127.0.0.1", port)));
    let started = Instant::now();
    server.shutdown();
    // The keep-alive linger (2 s while connections are open), then each close's own bound
    // (0.5 s), and the silent one cut at the graceful close's limit: never more.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "the shutdown took {took:?}");
    let mut rest = Vec::new();
    let read = runtime.block_on(idle.read_to_end(&mut rest));
    assert_eq!(read.expect("a FIN, not a reset"), 0);
    drop(silent);
}

/// One GET on a new connection: its status and whether it said `Connection: close`; Err
/// when the connection was refused or reset. An answer that closes its connection is read
/// to the server's FIN (a reset is an Err); one that keeps it open (the readiness's 200
/// before the drain shows) is read to the end of its body and its connection dropped.
async fn get_once(port: u16, path: &str) -> Result<(u16, bool), std::io::Error> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = whole_answer(&answer) {
            let (status, head, _) = parsed(&answer[..end]);
            let close = head.contains("connection: close");
            if close {
                stream.read_to_end(&mut answer).await?;
            }
            return Ok((status, close));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        answer.extend_from_slice(&chunk[..n]);
    }
}

/// Where the answer in `bytes` ends, once its head and its Content-Length of body are in.
fn whole_answer(bytes: &[u8]) -> Option<usize> {
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(0, |value| value.trim().parse().expect("a Content-Length"));
    (bytes.len() >= head_end + length).then_some(head_end + length)
}

#[test]
fn after_the_drain_a_client_that_reconnects_at_once_is_answered_not_reset() {
    use std::io::{Read, Write};
    let (server, _) = serve_with(0, Duration::ZERO, options());
    let port = server.http_port();
    // An idle keep-alive connection, which the server leaves open a while after its drain
    // (so the listener is not quiet yet).
    let mut idle = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    idle.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first[9..12], b"200");
    std::thread::scope(|scope| {
        scope.spawn(|| server.shutdown());
        // Until the drain shows (nothing is queued, so it ends at once), then clients
        // reconnecting one after another, as one told `close` does: each answered 503
        // with `close`, none refused at connect or reset.
        let answered = client().block_on(async {
            let mut answered_in_drain = 0;
            while answered_in_drain < 5 {
                match get_once(port, "/v2/health/ready").await {
                    Ok((503, true)) => answered_in_drain += 1,
                    Ok((200, _)) if answered_in_drain == 0 => {}
                    other => return Err(format!("{other:?} after {answered_in_drain}")),
                }
            }
            Ok(answered_in_drain)
        });
        drop(idle);
        assert_eq!(
            answered,
            Ok(5),
            "a client reconnecting in the drain was not answered"
        );
    });
}
