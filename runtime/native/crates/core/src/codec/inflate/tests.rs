//! Inflating a compressed body with its bounds; broken streams are 400s.

use std::io::Write;

use flate2::Compression;
use flate2::write::{GzEncoder, ZlibEncoder};

use super::*;

const MIB: usize = 1 << 20;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut encoder = ZlibEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn the_header_names_the_encoding() {
    assert_eq!(ContentEncoding::from_header(" Identity "), Ok(None));
    assert_eq!(
        ContentEncoding::from_header("x-gzip"),
        Ok(Some(ContentEncoding::Gzip))
    );
    assert_eq!(
        ContentEncoding::from_header("DEFLATE"),
        Ok(Some(ContentEncoding::Deflate))
    );
    let error = ContentEncoding::from_header("br").unwrap_err();
    assert_eq!(
        error.message(),
        "Content-Encoding 'br' is not supported (gzip, deflate or identity)"
    );
}

#[test]
fn a_body_that_fits_inflates_whole() {
    let document =
        serde_json::to_vec(&serde_json::json!({"data": (0..1000).collect::<Vec<_>>()})).unwrap();
    let n = document.len();
    assert_eq!(
        inflate(&gzip(&document), ContentEncoding::Gzip, n, None, None).unwrap(),
        document
    );
    assert_eq!(
        inflate(
            &zlib(&document),
            ContentEncoding::Deflate,
            n,
            Some(2000),
            None
        )
        .unwrap(),
        document
    );
}

#[test]
fn past_the_byte_limit_it_stops_with_a_413() {
    for (body, encoding) in [
        (gzip(&[b' '; 5000]), ContentEncoding::Gzip),
        (zlib(&[b' '; 5000]), ContentEncoding::Deflate),
    ] {
        let error = inflate(&body, encoding, 1000, None, None).unwrap_err();
        assert_eq!(error.status(), 413);
        assert!(
            error
                .message()
                .contains("inflates past the limit of 1000 bytes (maxRequestBytes"),
            "{error}"
        );
    }
}

#[test]
fn millions_of_empty_lists_stop_at_the_first_part_whatever_the_limit() {
    let mut document = b"[".to_vec();
    document.extend(b"[],".repeat(7 * MIB));
    document.extend_from_slice(b"[]]");
    let bomb = gzip(&document);
    let error = inflate(&bomb, ContentEncoding::Gzip, 64 * MIB, Some(20_000), None).unwrap_err();
    assert_eq!(error.status(), 413);
    assert!(
        error.message().ends_with("(20000); it was not parsed"),
        "{error}"
    );
}

#[test]
fn only_the_json_header_of_a_binary_body_counts() {
    let header = br#"{"inputs": [{"name": "x", "parameters": {"binary_data_size": 4096}}]}"#;
    let mut body = header.to_vec();
    body.extend_from_slice(&[b','; 4096]);
    let packed = gzip(&body);
    assert_eq!(
        inflate(
            &packed,
            ContentEncoding::Gzip,
            MIB,
            Some(50),
            Some(header.len())
        )
        .unwrap(),
        body
    );
    assert_eq!(
        inflate(&packed, ContentEncoding::Gzip, MIB, Some(50), None)
            .unwrap_err()
            .status(),
        413
    );
}

#[test]
fn broken_streams_are_400s() {
    let whole = gzip(&[b'x'; 100]);
    let mut tail = whole.clone();
    tail.extend_from_slice(b"tail");
    let deflated = zlib(&[b'x'; 100]);
    let cases: [(&[u8], ContentEncoding, &str); 6] = [
        (b"not gzip at all", ContentEncoding::Gzip, "corrupt"),
        (
            &whole[..whole.len() - 8],
            ContentEncoding::Gzip,
            "truncated",
        ),
        (&tail, ContentEncoding::Gzip, "trailing"),
        (b"not zlib", ContentEncoding::Deflate, "corrupt"),
        (
            &deflated[..deflated.len() - 3],
            ContentEncoding::Deflate,
            "truncated",
        ),
        (b"", ContentEncoding::Deflate, "truncated"),
    ];
    for (body, encoding, message) in cases {
        let error = inflate(body, encoding, MIB, None, None).unwrap_err();
        assert_eq!(error.status(), 400, "{message}: {error}");
        assert!(error.message().contains(message), "{message}: {error}");
    }
}
