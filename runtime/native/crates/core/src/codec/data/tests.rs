//! JSON tensor data read strictly: what each datatype takes, flat and nested forms, and
//! which error is answered when several are present (the most fundamental).

use super::*;

fn read_json(text: &str, datatype: DataType, shape: &[usize]) -> Result<TensorData, ApiError> {
    let data: &RawValue = serde_json::from_str(text).unwrap();
    let count = shape.iter().product();
    read(data, datatype, shape, count, "input 'x'")
}

fn raw(text: &str, datatype: DataType, shape: &[usize]) -> Vec<u8> {
    match read_json(text, datatype, shape) {
        Ok(TensorData::Raw(raw)) => raw.to_vec(),
        other => panic!("{text}: {other:?}"),
    }
}

fn refused(text: &str, datatype: DataType, shape: &[usize]) -> String {
    let error = read_json(text, datatype, shape).expect_err(text);
    assert_eq!(error.status(), 400);
    error.message().to_owned()
}

#[test]
fn flat_and_nested_data_read_to_the_same_row_major_bytes() {
    let expected: Vec<u8> = [1i32, 2, 3, 4, 5, 6]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(raw("[1,2,3,4,5,6]", DataType::I32, &[2, 3]), expected);
    assert_eq!(raw("[[1,2,3],[4,5,6]]", DataType::I32, &[2, 3]), expected);
    assert_eq!(
        raw("[[[1],[2],[3]],[[4],[5],[6]]]", DataType::I32, &[2, 3, 1]),
        expected
    );
}

#[test]
fn empty_tensors_read_flat_or_nested() {
    assert_eq!(raw("[]", DataType::F32, &[0]), Vec::<u8>::new());
    assert_eq!(raw("[[],[]]", DataType::F32, &[2, 0]), Vec::<u8>::new());
}

#[test]
fn float_tensors_take_integers_and_fp64_takes_the_largest() {
    assert_eq!(
        raw("[1, -2]", DataType::F32, &[2]),
        [1f32.to_le_bytes(), (-2f32).to_le_bytes()].concat()
    );
    let max = u64::MAX.to_string();
    assert_eq!(
        raw(&format!("[{max}]"), DataType::F64, &[1]),
        (u64::MAX as f64).to_le_bytes()
    );
    assert_eq!(
        raw("[65504]", DataType::F16, &[1]),
        half::f16::MAX.to_le_bytes()
    );
    // Underflow is a value (0), not an error, as in numpy.
    assert_eq!(raw("[1e-50]", DataType::F32, &[1]), 0f32.to_le_bytes());
}

#[test]
fn a_float_past_its_datatypes_range_is_refused() {
    assert_eq!(
        refused("[65520]", DataType::F16, &[1]),
        "input 'x': data holds a value out of FP16's range"
    );
    assert_eq!(
        refused("[1, -1e39]", DataType::F32, &[2]),
        "input 'x': data holds a value out of FP32's range"
    );
}

#[test]
fn integers_past_their_datatypes_bounds_are_refused_with_numpys_words() {
    let cases = [
        ("[256]", DataType::U8, "UINT8", "256", "uint8"),
        ("[-1]", DataType::U64, "UINT64", "-1", "uint64"),
        ("[-129]", DataType::I8, "INT8", "-129", "int8"),
        ("[65536]", DataType::U16, "UINT16", "65536", "uint16"),
        ("[-32769]", DataType::I16, "INT16", "-32769", "int16"),
        (
            "[4294967296]",
            DataType::U32,
            "UINT32",
            "4294967296",
            "uint32",
        ),
        (
            "[2147483648]",
            DataType::I32,
            "INT32",
            "2147483648",
            "int32",
        ),
        (
            "[9223372036854775808]",
            DataType::I64,
            "INT64",
            "9223372036854775808",
            "int64",
        ),
    ];
    for (text, datatype, name, value, numpy) in cases {
        assert_eq!(
            refused(text, datatype, &[1]),
            format!(
                "input 'x': data is not a valid {name} tensor: Python integer {value} out of bounds for {numpy}"
            )
        );
    }
}

#[test]
fn each_datatype_refuses_the_kinds_it_does_not_take_showing_the_value() {
    let cases = [
        (
            "[1, true]",
            DataType::F64,
            "input 'x': FP64 data takes numbers only; it holds a boolean (True)",
        ),
        (
            "[1, 1.0]",
            DataType::U8,
            "input 'x': UINT8 data takes integers only; it holds a number with a fraction or an exponent (1.0)",
        ),
        (
            "[1, 1e2]",
            DataType::I64,
            "input 'x': INT64 data takes integers only; it holds a number with a fraction or an exponent (100.0)",
        ),
        (
            "[true, 0]",
            DataType::Bool,
            "input 'x': BOOL data takes booleans only; it holds an integer (0)",
        ),
        (
            "[true, null]",
            DataType::Bool,
            "input 'x': BOOL data takes booleans only; it holds null (None)",
        ),
        (
            "[[1], 2]",
            DataType::F32,
            "input 'x': FP32 data takes numbers only; it holds a list ([1])",
        ),
        (
            "[1, {\"a\": [1, \"b\"]}]",
            DataType::I8,
            "input 'x': INT8 data takes integers only; it holds an object ({'a': [1, 'b']})",
        ),
        (
            "[\"a\", 1.5]",
            DataType::Bytes,
            "input 'x': BYTES data takes strings only; it holds 1.5",
        ),
        (
            "[\"a\", false]",
            DataType::Bytes,
            "input 'x': BYTES data takes strings only; it holds False",
        ),
    ];
    for (text, datatype, message) in cases {
        assert_eq!(refused(text, datatype, &[2]), message, "{text}");
    }
}

#[test]
fn a_long_offending_value_is_cut_to_forty_characters() {
    let long = "x".repeat(60);
    assert_eq!(
        refused(&format!("[\"{long}\"]"), DataType::F32, &[1]),
        format!(
            "input 'x': FP32 data takes numbers only; it holds a string ('{}...)",
            "x".repeat(39)
        )
    );
}

#[test]
fn the_first_offending_value_is_named() {
    assert_eq!(
        refused("[1, \"a\", null, true]", DataType::F32, &[4]),
        "input 'x': FP32 data takes numbers only; it holds a string ('a')"
    );
}

#[test]
fn the_length_is_checked_before_the_kinds_and_the_kinds_before_the_ranges() {
    assert_eq!(
        refused("[\"a\", 300, 1]", DataType::I8, &[2]),
        "input 'x': data has 3 elements, shape [2] needs 2"
    );
    assert_eq!(
        refused("[300, \"a\"]", DataType::I8, &[2]),
        "input 'x': INT8 data takes integers only; it holds a string ('a')"
    );
    assert_eq!(
        refused("[1, 2, 3]", DataType::Bytes, &[2]),
        "input 'x': data has 3 elements, shape [2] needs 2"
    );
}

#[test]
fn nested_data_is_checked_rows_first_then_each_depth_from_the_top() {
    assert_eq!(
        refused("[[1, \"a\"], [3], [4, 5]]", DataType::F32, &[2, 2]),
        "input 'x': nested data has 3 rows, shape [2, 2] needs 2"
    );
    // Row 0 breaks depth 2, row 1 depth 1: depth 1 is answered.
    assert_eq!(
        refused("[[[1, 2], [3]], [[1, 2]]]", DataType::F32, &[2, 2, 2]),
        "input 'x': nested data does not match shape [2, 2, 2] at depth 1 (every item there must be a list of 2)"
    );
    assert_eq!(
        refused("[[1, 2], 3]", DataType::F32, &[2, 2]),
        "input 'x': nested data does not match shape [2, 2] at depth 1 (every item there must be a list of 2)"
    );
    assert_eq!(
        refused(
            "[[[1, 2], [3, 4]], [[5, 6], [7, [8]]]]",
            DataType::F32,
            &[2, 2, 2]
        ),
        "input 'x': FP32 data takes numbers only; it holds a list ([8])"
    );
}

#[test]
fn data_is_flat_when_its_first_element_is_not_a_list() {
    assert_eq!(raw("[1, 2]", DataType::U8, &[1, 2]), vec![1, 2]);
    assert_eq!(
        refused("[1, [2]]", DataType::U8, &[1, 2]),
        "input 'x': UINT8 data takes integers only; it holds a list ([2])"
    );
}

#[test]
fn strings_read_as_their_utf8_bytes_flat_or_nested() {
    let data = read_json(
        r#"[["a\u00e9", ""], ["\"", "\n"]]"#,
        DataType::Bytes,
        &[2, 2],
    )
    .unwrap();
    assert_eq!(
        data,
        TensorData::Strings(["aé", "", "\"", "\n"].map(Bytes::from).to_vec())
    );
}

#[test]
fn a_count_past_usize_is_named_exactly() {
    let data: &RawValue = serde_json::from_str("[1]").unwrap();
    let shape = [1usize << 63, 4];
    let error = read(data, DataType::F32, &shape, usize::MAX, "input 'x'").unwrap_err();
    assert_eq!(
        error.message(),
        "input 'x': data has 1 elements, shape [9223372036854775808, 4] needs 36893488147419103232"
    );
}

#[test]
fn an_integer_past_64_bits_reads_as_a_float_as_orjson_reads_it() {
    assert_eq!(
        raw("[18446744073709551616]", DataType::F64, &[1]),
        18446744073709551616f64.to_le_bytes()
    );
    assert_eq!(
        refused("[-9223372036854775809]", DataType::I64, &[1]),
        "input 'x': INT64 data takes integers only; it holds a number with a fraction or an \
         exponent (-9.223372036854776e+18)"
    );
}
