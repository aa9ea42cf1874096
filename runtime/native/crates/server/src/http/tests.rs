use super::{Action, Route, route};

#[test]
fn model_paths_name_the_model_the_version_and_the_action() {
    assert_eq!(
        route("/v2/models/m/versions/3/infer"),
        Route::Model {
            name: "m",
            version: Some("3"),
            action: Action::Infer
        }
    );
    assert_eq!(
        route("/v2/models/m"),
        Route::Model {
            name: "m",
            version: None,
            action: Action::Metadata
        }
    );
    assert_eq!(
        route("/v2/models/m/config"),
        Route::Model {
            name: "m",
            version: None,
            action: Action::Config
        }
    );
    assert_eq!(route("/v2/health/live"), Route::Live);
    assert_eq!(route("/v2"), Route::Server);
}

#[test]
fn other_paths_are_no_route() {
    for path in [
        "/",
        "/v2/models",
        "/v2/models//infer",
        "/v2/models/m/explain",
        "/v3",
    ] {
        assert_eq!(route(path), Route::Unknown, "{path}");
    }
}

mod keep_alive {
    //! Keep-alive connections over real HTTP on 127.0.0.1, written and read by hand so
    //! that what the server does to the connection shows: every answer whole, and no
    //! connection closed unless its last answer said `Connection: close`.

    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use crate::server::tests::{client, infer_body, options, serve_with};

    /// One answer as the client read it.
    pub(super) struct Answer {
        pub(super) status: u16,
        pub(super) closes: bool,
        retry_after: bool,
        pub(super) body: Vec<u8>,
    }

    /// Reads one whole answer (head, then Content-Length bytes); Err when the connection
    /// ended or failed first.
    pub(super) async fn read_answer(
        stream: &mut TcpStream,
        pending: &mut Vec<u8>,
    ) -> Result<Answer, String> {
        let mut buffer = [0u8; 8192];
        let head_end = loop {
            if let Some(at) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match stream.read(&mut buffer).await {
                Ok(0) => return Err(format!("ended before an answer ({} bytes)", pending.len())),
                Ok(n) => pending.extend_from_slice(&buffer[..n]),
                Err(error) => return Err(format!("failed before an answer: {error}")),
            }
        };
        let head = String::from_utf8_lossy(&pending[..head_end]).to_lowercase();
        let header = |name: &str| {
            head.lines()
                .find_map(|line| line.strip_prefix(name).map(|v| v.trim().to_string()))
        };
        let length: usize = header("content-length:")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("an answer without Content-Length: {head}"))?;
        while pending.len() < head_end + length {
            match stream.read(&mut buffer).await {
                Ok(0) => return Err("ended mid-answer".into()),
                Ok(n) => pending.extend_from_slice(&buffer[..n]),
                Err(error) => return Err(format!("failed mid-answer: {error}")),
            }
        }
        let body = pending[head_end..head_end + length].to_vec();
        pending.drain(..head_end + length);
        Ok(Answer {
            status: head[9..12]
                .parse()
                .map_err(|_| format!("no status: {head}"))?,
            closes: header("connection:").is_some_and(|v| v == "close"),
            retry_after: header("retry-after:").is_some(),
            body,
        })
    }

    /// A whole infer request of `rows` for the test server's `double` model.
    pub(super) fn infer_head_and_body(rows: &[[f32; 2]]) -> Vec<u8> {
        let body = infer_body(rows);
        let mut request = format!(
            "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Type: \
             application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        request
    }

    /// `requests` infer requests, each head written a moment before its body (as a client
    /// under load may), on one keep-alive connection, a new one only after an answer that
    /// said `Connection: close`. The statuses, or the first failure.
    async fn keep_alive_client(port: u16, requests: usize) -> Result<Vec<u16>, String> {
        let body = infer_body(&[[1.0, 2.0]]);
        let head = format!(
            "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Type: \
             application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let connect = || TcpStream::connect(("127.0.0.1", port));
        let mut stream = connect().await.map_err(|e| e.to_string())?;
        let mut pending = Vec::new();
        let mut statuses = Vec::new();
        for _ in 0..requests {
            stream
                .write_all(head.as_bytes())
                .await
                .map_err(|e| format!("the head could not be written: {e}"))?;
            tokio::time::sleep(Duration::from_millis(2)).await;
            // A server that answered already and closed may refuse the body; its answer
            // must still be read whole and say that it closes.
            let _ = stream.write_all(&body).await;
            let answer = read_answer(&mut stream, &mut pending).await?;
            let json: serde_json::Value = serde_json::from_slice(&answer.body)
                .map_err(|e| format!("a body that is not JSON ({e})"))?;
            match answer.status {
                200 => {}
                503 if answer.retry_after && json["error"].is_string() => {}
                other => return Err(format!("an unexpected answer {other}: {json}")),
            }
            statuses.push(answer.status);
            if answer.closes {
                stream = connect().await.map_err(|e| e.to_string())?;
                pending.clear();
            }
        }
        Ok(statuses)
    }

    #[test]
    fn refused_requests_on_keep_alive_connections_never_lose_their_connection_silently() {
        let mut options = options();
        options.batching.max_queue_size = 1;
        options.batching.max_batch_size = 1;
        let (server, _) = serve_with(0, Duration::from_millis(20), options);
        let port = server.http_port();
        let outcomes = client().block_on(async {
            let clients: Vec<_> = (0..24)
                .map(|_| tokio::spawn(keep_alive_client(port, 8)))
                .collect();
            let mut outcomes = Vec::new();
            for each in clients {
                outcomes.push(each.await.unwrap());
            }
            outcomes
        });
        server.shutdown();
        let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        assert!(
            failures.is_empty(),
            "{} clients failed: {failures:?}",
            failures.len()
        );
        let statuses: Vec<u16> = outcomes.into_iter().flat_map(Result::unwrap).collect();
        let refused = statuses.iter().filter(|&&s| s == 503).count();
        assert_eq!(statuses.len(), 24 * 8);
        assert!(
            refused > statuses.len() / 2,
            "only {refused} of {} refused",
            statuses.len()
        );
        assert!(statuses.contains(&200));
    }
}

mod unread_bodies {
    //! A refusal whose body will not be read says so: `Connection: close`, at once.

    use std::time::{Duration, Instant};

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    use super::keep_alive::read_answer;
    use crate::server::tests::{client, options, serve_with};

    /// The status, whether it closes, and how long it took, of `head` sent with no body.
    async fn refuse(port: u16, head: &str) -> (u16, bool, Duration) {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let started = Instant::now();
        stream.write_all(head.as_bytes()).await.unwrap();
        let answer = read_answer(&mut stream, &mut Vec::new()).await.unwrap();
        (answer.status, answer.closes, started.elapsed())
    }

    #[test]
    fn a_refusal_is_sent_before_its_body_and_the_connection_stays_in_step() {
        let (server, _) = serve_with(0, Duration::ZERO, options());
        let port = server.http_port();
        // Within the test server's request limit, so read and dropped, not refused.
        let garbage = b"this is not JSON \x00\xff".repeat(100);
        let refused = format!(
            "POST /v2/models/other/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            garbage.len()
        );
        let valid = super::keep_alive::infer_head_and_body(&[[1.0, 2.0]]);
        let (first, second) = client().block_on(async {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let mut pending = Vec::new();
            stream.write_all(refused.as_bytes()).await.unwrap();
            // Answered with none of its body sent: the refusal did not wait on it.
            let first = read_answer(&mut stream, &mut pending).await.unwrap();
            stream.write_all(&garbage).await.unwrap();
            stream.write_all(&valid).await.unwrap();
            let second = read_answer(&mut stream, &mut pending).await.unwrap();
            (first, second)
        });
        server.shutdown();
        assert_eq!((first.status, first.closes), (404, false));
        // The garbage was dropped as the refused request's body, not parsed as a request.
        assert_eq!(
            second.status,
            200,
            "{}",
            String::from_utf8_lossy(&second.body)
        );
        let answer: serde_json::Value = serde_json::from_slice(&second.body).unwrap();
        assert_eq!(answer["outputs"][0]["data"], serde_json::json!([2.0, 4.0]));
    }

    #[test]
    fn a_refusal_that_cannot_read_its_body_says_connection_close_without_waiting() {
        let (server, _) = serve_with(0, Duration::ZERO, options());
        let port = server.http_port();
        let waits_for_continue = "POST /v2/models/other/infer HTTP/1.1\r\nHost: x\r\n\
            Expect: 100-continue\r\nContent-Length: 100\r\n\r\n";
        let over_the_limit = "POST /v2/models/other/infer HTTP/1.1\r\nHost: x\r\n\
            Content-Length: 5000\r\n\r\n";
        for head in [waits_for_continue, over_the_limit] {
            let (status, closes, took) = client().block_on(refuse(port, head));
            assert_eq!((status, closes), (404, true), "{head}");
            // Well within the body read timeout (1 s): nothing was waited for.
            assert!(took < Duration::from_millis(500), "{took:?}: {head}");
        }
        server.shutdown();
    }
}
