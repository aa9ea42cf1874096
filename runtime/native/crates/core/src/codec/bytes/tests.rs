//! Triton's binary BYTES form, its strict reader and the UTF-8 check of inputs.

use super::*;

fn prefixed(length: u32, rest: &[u8]) -> Bytes {
    let mut raw = length.to_le_bytes().to_vec();
    raw.extend_from_slice(rest);
    Bytes::from(raw)
}

#[test]
fn elements_round_trip_through_the_binary_form() {
    let elements = vec![
        Bytes::from_static(b"ab"),
        Bytes::new(),
        Bytes::from_static(b"\xff"),
    ];
    let raw = Bytes::from(serialize(&elements));
    assert_eq!(&raw[..6], b"\x02\x00\x00\x00ab");
    assert_eq!(deserialize(&raw, 3, "input 't'").unwrap(), elements);
}

#[test]
fn malformed_binary_strings_are_400s_naming_the_tensor() {
    let cases = [
        (
            prefixed(5, b"abc"),
            1,
            "input 't': BYTES element 0 declares 5 bytes; only 3 are left",
        ),
        (
            prefixed(1, b"axx"),
            1,
            "input 't': 2 bytes follow the 1 BYTES elements the shape declares",
        ),
        (
            prefixed(1, b"a"),
            2,
            "input 't': BYTES data ends after 1 of 2 elements",
        ),
        (
            Bytes::from_static(b"\x01\x00"),
            1,
            "input 't': BYTES data ends after 0 of 1",
        ),
        (
            prefixed(u32::MAX, b""),
            1,
            "declares 4294967295 bytes; only 0",
        ),
    ];
    for (raw, count, message) in cases {
        let error = deserialize(&raw, count, "input 't'").unwrap_err();
        assert_eq!(error.status(), 400);
        assert!(error.message().contains(message), "{error}");
    }
}

#[test]
fn a_huge_declared_count_meets_the_short_buffer_first() {
    let error = deserialize(&Bytes::new(), usize::MAX, "input 't'").unwrap_err();
    assert!(error.message().contains("ends after 0 of"), "{error}");
}

#[test]
fn string_inputs_must_be_utf8() {
    let ok = [Bytes::from_static("é".as_bytes())];
    assert!(check_text(&ok, "input 't'").is_ok());
    let bad = [Bytes::from_static(b"ok"), Bytes::from_static(b"a\xffb")];
    let error = check_text(&bad, "input 't'").unwrap_err();
    assert_eq!(
        error.message(),
        "input 't': BYTES element 1 is not UTF-8 text (invalid start byte at byte 1); string \
         inputs are UTF-8"
    );
    let cut = [Bytes::from_static(b"\xc3")];
    assert!(
        check_text(&cut, "t")
            .unwrap_err()
            .message()
            .contains("unexpected end of data")
    );
}
