//! Reading a body: its parts kept or copied into a mapping, the same bytes either way.

use super::*;

/// A body of `parts`, declaring `declared` bytes.
struct Declared {
    parts: std::collections::VecDeque<Bytes>,
    declared: u64,
}

impl Body for Declared {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(self.parts.pop_front().map(|part| Ok(Frame::data(part))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.declared)
    }
}

struct Never;

impl Clock for Never {
    fn now(&self) -> Time {
        Time::ZERO
    }
}

async fn read(parts: Vec<Vec<u8>>, declared: u64) -> Bytes {
    let mut body = Declared {
        parts: parts.into_iter().map(Bytes::from).collect(),
        declared,
    };
    let deadline = Time::from_secs(60);
    read_body(
        &mut body,
        64 << 20,
        deadline,
        Duration::from_secs(1),
        &Never,
        &|| {},
    )
    .await
    .expect("the body is read")
}

#[tokio::test]
async fn a_large_declared_body_comes_whole_from_its_mapping() {
    let parts: Vec<Vec<u8>> = (0..5u8)
        .map(|i| vec![i; MAPPED_BODY_BYTES / 2 + 7])
        .collect();
    let whole: Vec<u8> = parts.concat();
    let body = read(parts, whole.len() as u64).await;
    assert_eq!(body.len(), whole.len());
    assert!(body[..] == whole[..]);
}

#[tokio::test]
async fn a_small_body_in_one_part_is_that_part() {
    let body = read(vec![b"{\"inputs\": []}".to_vec()], 14).await;
    assert_eq!(&body[..], b"{\"inputs\": []}");
}
