//! The JSON body: the bound on its values, requests decoded (each refusal word for word),
//! answers encoded, and both read back through each other.

use super::*;

#[test]
fn values_are_counted_from_commas_and_brackets() {
    assert_eq!(json_value_count(b"1"), 1);
    assert_eq!(json_value_count(b"[1,2,[3]]"), 5);
    assert_eq!(json_value_count(b"{\"a\":[],\"b\":{}}"), 5);
}

#[test]
fn the_model_bound_holds_every_element_and_list_of_a_full_batch() {
    // 8 rows of 4: 32 elements, the top list and 8 row lists, plus the header's room.
    assert_eq!(
        model_json_value_limit(&[Some(vec![4])], 8),
        Some(4096 + 32 + 9)
    );
    assert_eq!(model_json_value_limit(&[Some(vec![4]), None], 8), None);
    assert_eq!(
        model_json_value_limit(&[Some(vec![usize::MAX, usize::MAX])], 8),
        Some(usize::MAX)
    );
}

#[test]
fn a_valid_nested_request_never_holds_more_values_than_the_bound() {
    let rows: Vec<Vec<f32>> = vec![vec![0.0; 4]; 8];
    let body = serde_json::json!({"id": "r", "inputs": [{"name": "x", "datatype": "FP32",
        "shape": [8, 4], "data": rows, "parameters": {"a": 1}}], "outputs": [{"name": "y"}]});
    let text = serde_json::to_vec(&body).unwrap();
    assert!(json_value_count(&text) <= model_json_value_limit(&[Some(vec![4])], 8).unwrap());
}

// ---- decoding ----

use serde_json::{Value, json};

use crate::request::{DecodedInput, ResponseOutput, SharedMemoryRef};
use crate::tensor::{DataType, Tensor, TensorData};

fn decode_json(body: &Value) -> Result<InferRequest, ApiError> {
    decode_request(
        &Bytes::from(serde_json::to_vec(body).unwrap()),
        None,
        &DecodeLimits::default(),
    )
}

fn refusal(body: &Value) -> ApiError {
    decode_json(body).expect_err("the request is refused")
}

fn only_input(request: &InferRequest) -> &DecodedInput {
    assert_eq!(request.inputs.len(), 1);
    &request.inputs[0]
}

fn raw(request: &InferRequest) -> Vec<u8> {
    match &only_input(request).source {
        InputSource::Data(TensorData::Raw(raw)) => raw.to_vec(),
        other => panic!("not raw data: {other:?}"),
    }
}

fn le<T: Copy, const N: usize>(values: &[T], to_le: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to_le(v)).collect()
}

/// A body with the binary extension: the JSON header, then `parts` in order.
fn binary_body(header: &Value, parts: &[&[u8]]) -> (Bytes, usize) {
    let mut body = serde_json::to_vec(header).unwrap();
    let length = body.len();
    for part in parts {
        body.extend_from_slice(part);
    }
    (Bytes::from(body), length)
}

fn input(datatype: &str, shape: Value, data: Value) -> Value {
    json!({"name": "x", "datatype": datatype, "shape": shape, "data": data})
}

#[test]
fn a_json_request_decodes_its_id_and_inputs_to_little_endian_tensors() {
    let request = decode_json(&json!({"id": "r1", "inputs": [
        input("FP32", json!([1, 2]), json!([1.5, -2])),
    ]}))
    .unwrap();
    assert_eq!(request.id.as_deref(), Some("r1"));
    let decoded = only_input(&request);
    assert_eq!(
        (
            decoded.name.as_str(),
            decoded.datatype,
            decoded.shape.as_slice()
        ),
        ("x", DataType::F32, &[1, 2][..])
    );
    assert_eq!(raw(&request), le(&[1.5f32, -2.0], f32::to_le_bytes));
    assert_eq!(request.outputs, None);
    assert_eq!(request.timeout_microseconds, None);
    assert_eq!(request.priority, 0);
    assert!(!request.binary_data_output);
}

#[test]
fn nested_data_reads_as_its_flat_row_major_form() {
    let flat = decode_json(
        &json!({"inputs": [input("INT16", json!([2, 3]), json!([1, 2, 3, 4, 5, -6]))]}),
    );
    let nested = decode_json(
        &json!({"inputs": [input("INT16", json!([2, 3]), json!([[1, 2, 3], [4, 5, -6]]))]}),
    );
    let expected = le(&[1i16, 2, 3, 4, 5, -6], i16::to_le_bytes);
    assert_eq!(raw(&flat.unwrap()), expected);
    assert_eq!(raw(&nested.unwrap()), expected);
}

#[test]
fn every_integer_datatype_takes_its_whole_range_and_bool_takes_booleans() {
    let cases: [(&str, Value, Vec<u8>); 9] = [
        ("UINT8", json!([0, 255]), vec![0, 255]),
        (
            "UINT16",
            json!([0, 65535]),
            le(&[0u16, u16::MAX], u16::to_le_bytes),
        ),
        (
            "UINT32",
            json!([0, u32::MAX]),
            le(&[0u32, u32::MAX], u32::to_le_bytes),
        ),
        (
            "UINT64",
            json!([0, u64::MAX]),
            le(&[0u64, u64::MAX], u64::to_le_bytes),
        ),
        ("INT8", json!([-128, 127]), vec![0x80, 0x7f]),
        (
            "INT16",
            json!([i16::MIN, i16::MAX]),
            le(&[i16::MIN, i16::MAX], i16::to_le_bytes),
        ),
        (
            "INT32",
            json!([i32::MIN, i32::MAX]),
            le(&[i32::MIN, i32::MAX], i32::to_le_bytes),
        ),
        (
            "INT64",
            json!([i64::MIN, i64::MAX]),
            le(&[i64::MIN, i64::MAX], i64::to_le_bytes),
        ),
        ("BOOL", json!([true, false]), vec![1, 0]),
    ];
    for (datatype, data, expected) in cases {
        let request = decode_json(&json!({"inputs": [input(datatype, json!([2]), data)]}));
        assert_eq!(raw(&request.unwrap()), expected, "{datatype}");
    }
}

#[test]
fn a_binary_request_takes_each_input_from_the_body_in_input_order() {
    let x = le(&[1.0f32, 2.0], f32::to_le_bytes);
    let ids = le(&[7i64], i64::to_le_bytes);
    let header = json!({"id": "b", "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
        {"name": "ids", "datatype": "INT64", "shape": [1, 1], "parameters": {"binary_data_size": 8}},
    ]});
    let (body, length) = binary_body(&header, &[&x, &ids]);
    let request = decode_request(&body, Some(length), &DecodeLimits::default()).unwrap();
    let sources: Vec<&InputSource> = request.inputs.iter().map(|i| &i.source).collect();
    assert_eq!(
        sources,
        [
            &InputSource::Data(TensorData::Raw(Bytes::from(x))),
            &InputSource::Data(TensorData::Raw(Bytes::from(ids)))
        ]
    );
}

#[test]
fn a_json_input_and_a_binary_one_mix_in_one_request() {
    let header = json!({"inputs": [
        input("INT8", json!([1]), json!([5])),
        {"name": "y", "datatype": "UINT8", "shape": [2], "parameters": {"binary_data_size": 2}},
    ]});
    let (body, length) = binary_body(&header, &[&[9, 10]]);
    let request = decode_request(&body, Some(length), &DecodeLimits::default()).unwrap();
    assert_eq!(
        request.inputs[0].source,
        InputSource::Data(TensorData::Raw(Bytes::from_static(&[5])))
    );
    assert_eq!(
        request.inputs[1].source,
        InputSource::Data(TensorData::Raw(Bytes::from_static(&[9, 10])))
    );
}

fn strings(request: &InferRequest) -> Vec<Bytes> {
    match &only_input(request).source {
        InputSource::Data(TensorData::Strings(elements)) => elements.clone(),
        other => panic!("not strings: {other:?}"),
    }
}

#[test]
fn bytes_inputs_come_as_json_strings_flat_or_nested_or_as_length_prefixed_binary() {
    let flat = decode_json(&json!({"inputs": [input("BYTES", json!([2, 1]), json!(["a", "é"]))]}));
    let nested =
        decode_json(&json!({"inputs": [input("BYTES", json!([2, 1]), json!([["a"], ["é"]]))]}));
    let expected = vec![Bytes::from("a"), Bytes::from("é")];
    assert_eq!(strings(&flat.unwrap()), expected);
    assert_eq!(strings(&nested.unwrap()), expected);
    let serialized = crate::codec::bytes::serialize(&expected);
    let header = json!({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [2],
        "parameters": {"binary_data_size": serialized.len()}}]});
    let (body, length) = binary_body(&header, &[&serialized]);
    let request = decode_request(&body, Some(length), &DecodeLimits::default()).unwrap();
    assert_eq!(strings(&request), expected);
}

#[test]
fn binary_string_inputs_must_be_utf8_text() {
    let serialized =
        crate::codec::bytes::serialize(&[Bytes::from("ok"), Bytes::from_static(b"\xffbad")]);
    let header = json!({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 2],
        "parameters": {"binary_data_size": serialized.len()}}]});
    let (body, length) = binary_body(&header, &[&serialized]);
    let error = decode_request(&body, Some(length), &DecodeLimits::default()).unwrap_err();
    assert_eq!(
        error.message(),
        "input 'text': BYTES element 1 is not UTF-8 text (invalid start byte at byte 0); string \
         inputs are UTF-8"
    );
}

#[test]
fn request_parameters_and_requested_outputs_are_read() {
    let request = decode_json(&json!({
        "inputs": [input("FP64", json!([1]), json!([1]))],
        "parameters": {"timeout": 2500, "priority": 1, "binary_data_output": true, "other": [1]},
        "outputs": [
            {"name": "y", "parameters": {"binary_data": false}},
            {"name": "z"},
            {"name": "w", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 16,
                "shared_memory_offset": 4}},
        ],
    }))
    .unwrap();
    assert_eq!(request.timeout_microseconds, Some(2500));
    assert_eq!(request.priority, 1);
    assert!(request.binary_data_output);
    let outputs = request.outputs.unwrap();
    assert_eq!(
        outputs[0],
        RequestedOutput {
            name: "y".into(),
            binary: Some(false),
            shared_memory: None
        }
    );
    assert_eq!(
        outputs[1],
        RequestedOutput {
            name: "z".into(),
            binary: None,
            shared_memory: None
        }
    );
    assert_eq!(
        outputs[2].shared_memory,
        Some(SharedMemoryRef {
            region: "out".into(),
            offset: 4,
            byte_size: 16
        })
    );
}

#[test]
fn null_parameters_read_as_absent_except_binary_data_output() {
    let request = decode_json(&json!({
        "id": null,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1],
            "parameters": {"binary_data_size": null}}],
        "parameters": {"timeout": null, "priority": null},
        "outputs": null,
    }))
    .unwrap();
    assert_eq!(
        (request.id, request.timeout_microseconds, request.outputs),
        (None, None, None)
    );
    let error = refusal(&json!({"inputs": [input("FP32", json!([1]), json!([1]))],
        "parameters": {"binary_data_output": null}}));
    assert_eq!(
        error.message(),
        "parameters.binary_data_output must be a boolean"
    );
}

#[test]
fn a_shared_memory_input_decodes_to_its_region() {
    let request = decode_json(
        &json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2],
        "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 16}}]}),
    )
    .unwrap();
    assert_eq!(
        only_input(&request).source,
        InputSource::SharedMemory(SharedMemoryRef {
            region: "in".into(),
            offset: 0,
            byte_size: 16
        })
    );
}

#[test]
fn a_key_given_twice_keeps_its_last_value_as_the_python_parser_does() {
    let body = br#"{"id": 1, "inputs": [], "id": "r", "inputs": [{"name": "x", "datatype": "UINT8",
        "shape": [1], "data": [1], "data": [2]}]}"#;
    let request =
        decode_request(&Bytes::from_static(body), None, &DecodeLimits::default()).unwrap();
    assert_eq!(request.id.as_deref(), Some("r"));
    assert_eq!(raw(&request), vec![2]);
}

/// Each malformed request and its refusal, word for word (the messages the black-box tests
/// read).
#[test]
fn each_malformed_request_is_refused_with_its_message() {
    let good = || input("FP32", json!([1, 2]), json!([1.0, 2.0]));
    let with = |field: &str, value: Value| {
        let mut input = good();
        input[field] = value;
        json!({"inputs": [input]})
    };
    let datatypes = "BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, \
                     FP64, BYTES";
    let cases: Vec<(Value, String)> = vec![
        (json!([]), "the request must be a JSON object".into()),
        (json!("inputs"), "the request must be a JSON object".into()),
        (
            json!({"inputs": []}),
            "inputs must be a non-empty list".into(),
        ),
        (json!({"id": "r"}), "inputs must be a non-empty list".into()),
        (
            json!({"inputs": {"name": "x"}}),
            "inputs must be a non-empty list".into(),
        ),
        (json!({"inputs": [3]}), "inputs[0] must be an object".into()),
        (
            json!({"inputs": [good(), []]}),
            "inputs[1] must be an object".into(),
        ),
        (
            with("name", json!("")),
            "inputs[0].name must be a non-empty string".into(),
        ),
        (
            with("name", json!(5)),
            "inputs[0].name must be a non-empty string".into(),
        ),
        (
            with("datatype", json!("BF16")),
            format!("input 'x': datatype 'BF16' is not supported (one of {datatypes})"),
        ),
        (
            with("datatype", Value::Null),
            format!("input 'x': datatype None is not supported (one of {datatypes})"),
        ),
        (
            with("shape", json!([1, -2])),
            "input 'x'.shape must be a list of non-negative integers".into(),
        ),
        (
            with("shape", json!([true, 2])),
            "input 'x'.shape must be a list of non-negative integers".into(),
        ),
        (
            with("shape", json!([1.0, 2])),
            "input 'x'.shape must be a list of non-negative integers".into(),
        ),
        (
            with("shape", json!(2)),
            "input 'x'.shape must be a list of non-negative integers".into(),
        ),
        (
            with("shape", json!(vec![1; 65])),
            "input 'x'.shape has 65 dimensions; at most 64".into(),
        ),
        (
            with("data", json!([1.0])),
            "input 'x': data has 1 elements, shape [1, 2] needs 2".into(),
        ),
        (
            with("data", json!([[1.0], [2.0, 3.0]])),
            "input 'x': nested data has 2 rows, shape [1, 2] needs 1".into(),
        ),
        (
            with("data", json!("ab")),
            "input 'x': 'data' must be a list (or use binary_data_size)".into(),
        ),
        (
            with("data", json!({"a": 1})),
            "input 'x': 'data' must be a list (or use binary_data_size)".into(),
        ),
        (
            with("parameters", json!(1)),
            "input 'x'.parameters must be an object".into(),
        ),
        (
            with("parameters", json!({"binary_data_size": -1})),
            "input 'x': binary_data_size must be an integer >= 0".into(),
        ),
        (
            with("parameters", json!({"binary_data_size": true})),
            "input 'x': binary_data_size must be an integer >= 0".into(),
        ),
        (
            json!({"inputs": [good()], "id": 3}),
            "id must be a string".into(),
        ),
        (
            json!({"inputs": [good()], "parameters": []}),
            "request.parameters must be an object".into(),
        ),
        (
            json!({"inputs": [good()], "parameters": null}),
            "request.parameters must be an object".into(),
        ),
        (
            json!({"inputs": [good()], "parameters": {"timeout": -1}}),
            "parameters.timeout must be an integer (microseconds) >= 0".into(),
        ),
        (
            json!({"inputs": [good()], "parameters": {"timeout": 1.5}}),
            "parameters.timeout must be an integer (microseconds) >= 0".into(),
        ),
        (
            json!({"inputs": [good()], "parameters": {"priority": "high"}}),
            "parameters.priority must be an integer >= 0".into(),
        ),
        (
            json!({"inputs": [good()], "parameters": {"binary_data_output": 1}}),
            "parameters.binary_data_output must be a boolean".into(),
        ),
        (
            json!({"inputs": [good()], "outputs": {"name": "y"}}),
            "outputs must be a list".into(),
        ),
        (
            json!({"inputs": [good()], "outputs": [{"x": 1}]}),
            "outputs[0] must be an object with a string name".into(),
        ),
        (
            json!({"inputs": [good()], "outputs": ["y"]}),
            "outputs[0] must be an object with a string name".into(),
        ),
        (
            json!({"inputs": [good()], "outputs": [{"name": "y", "parameters": 1}]}),
            "outputs[0].parameters must be an object".into(),
        ),
        (
            json!({"inputs": [good()], "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]}),
            "outputs[0].parameters.binary_data must be a boolean".into(),
        ),
        (
            json!({"inputs": [good()], "outputs": [{"name": "y", "parameters": {"shared_memory_region": "o"}}]}),
            "outputs[0].parameters.shared_memory_byte_size must be an integer >= 0".into(),
        ),
    ];
    for (body, message) in cases {
        let error = refusal(&body);
        assert_eq!(error.status(), 400, "{body}");
        assert_eq!(error.message(), message, "{body}");
    }
}

#[test]
fn data_of_the_wrong_kind_or_range_is_refused_naming_the_first_offending_value() {
    let cases: [(&str, Value, &str); 11] = [
        (
            "FP32",
            json!([1.0, null]),
            "input 'x': FP32 data takes numbers only; it holds null (None)",
        ),
        (
            "FP32",
            json!([1.0, "2"]),
            "input 'x': FP32 data takes numbers only; it holds a string ('2')",
        ),
        (
            "FP32",
            json!([1.0, false]),
            "input 'x': FP32 data takes numbers only; it holds a boolean (False)",
        ),
        (
            "FP16",
            json!([1.0, 1e6]),
            "input 'x': data holds a value out of FP16's range",
        ),
        (
            "FP32",
            json!([1.0, 1e39]),
            "input 'x': data holds a value out of FP32's range",
        ),
        (
            "INT64",
            json!([1, 2.5]),
            "input 'x': INT64 data takes integers only; it holds a number with a fraction or an exponent (2.5)",
        ),
        (
            "UINT8",
            json!([1, -1]),
            "input 'x': data is not a valid UINT8 tensor: Python integer -1 out of bounds for uint8",
        ),
        (
            "INT8",
            json!([1, 300]),
            "input 'x': data is not a valid INT8 tensor: Python integer 300 out of bounds for int8",
        ),
        (
            "BOOL",
            json!([true, 1]),
            "input 'x': BOOL data takes booleans only; it holds an integer (1)",
        ),
        (
            "INT8",
            json!([1, {"a": 1}]),
            "input 'x': INT8 data takes integers only; it holds an object ({'a': 1})",
        ),
        (
            "BYTES",
            json!(["a", null]),
            "input 'x': BYTES data takes strings only; it holds None",
        ),
    ];
    for (datatype, data, message) in cases {
        let error = refusal(&json!({"inputs": [input(datatype, json!([2]), data)]}));
        assert_eq!(error.message(), message, "{datatype}");
    }
}

#[test]
fn a_body_that_is_not_json_is_malformed() {
    let no_limits = DecodeLimits::default();
    for body in [
        &b"{"[..],
        b"\xff\xfe",
        br#"{"inputs": [NaN]}"#,
        br#"{"a": 1} x"#,
        b"{\"inputs\": [{\"data\": [\"\xff\"]}]}",
        // Numbers in data are only read by the data's own pass.
        br#"{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [1e400]}]}"#,
    ] {
        let error = decode_request(&Bytes::copy_from_slice(body), None, &no_limits).unwrap_err();
        assert!(
            error.message().starts_with("malformed JSON request: "),
            "{error}"
        );
        assert_eq!(error.status(), 400);
    }
}

#[test]
fn binary_data_without_the_header_length_is_malformed_json() {
    let header = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
        "parameters": {"binary_data_size": 8}}]});
    let (body, _) = binary_body(&header, &[b"12345678"]);
    let error = decode_request(&body, None, &DecodeLimits::default()).unwrap_err();
    assert!(
        error
            .message()
            .starts_with("malformed JSON request: trailing characters"),
        "{error}"
    );
}

#[test]
fn binary_sizes_are_checked_against_the_body_and_the_shape() {
    let header = |size: usize| {
        json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
        "parameters": {"binary_data_size": size}}]})
    };
    let refused = |header: &Value, parts: &[&[u8]]| {
        let (body, length) = binary_body(header, parts);
        decode_request(&body, Some(length), &DecodeLimits::default())
            .unwrap_err()
            .message()
            .to_owned()
    };
    assert_eq!(
        refused(&header(8), &[b"1234"]),
        "input 'x': binary_data_size 8 runs past the end of the body (4 binary bytes left)"
    );
    assert_eq!(
        refused(&header(8), &[b"12345678extra"]),
        "5 bytes of binary data follow the header that no input claims"
    );
    assert_eq!(
        refused(&header(4), &[b"1234"]),
        "input 'x': binary_data_size 4 does not match shape [1, 2] of FP32 (8 bytes)"
    );
    let short = decode_request(
        &Bytes::from_static(b"{\"inputs\": []}"),
        Some(99),
        &DecodeLimits::default(),
    );
    assert_eq!(
        short.unwrap_err().message(),
        "Inference-Header-Content-Length 99 is outside the body of 14 bytes"
    );
}

#[test]
fn a_shared_memory_input_is_checked_against_its_shape_and_carries_no_data() {
    let with = |parameters: Value, data: Option<Value>| {
        let mut input =
            json!({"name": "x", "datatype": "FP32", "shape": [2], "parameters": parameters});
        if let Some(data) = data {
            input["data"] = data;
        }
        refusal(&json!({"inputs": [input]})).message().to_owned()
    };
    assert_eq!(
        with(json!({"shared_memory_region": 3}), None),
        "input 'x': shared_memory_region must be a string"
    );
    assert_eq!(
        with(json!({"shared_memory_region": "in"}), None),
        "input 'x': shared_memory_byte_size must be an integer >= 0"
    );
    assert_eq!(
        with(
            json!({"shared_memory_region": "in", "shared_memory_byte_size": 8, "shared_memory_offset": -4}),
            None
        ),
        "input 'x': shared_memory_offset must be an integer >= 0"
    );
    assert_eq!(
        with(
            json!({"shared_memory_region": "in", "shared_memory_byte_size": 4}),
            None
        ),
        "input 'x': shared_memory_byte_size 4 does not match shape [2] of FP32 (8 bytes)"
    );
    assert_eq!(
        with(
            json!({"shared_memory_region": "in", "shared_memory_byte_size": 8}),
            Some(json!([1, 2]))
        ),
        "input 'x': shared_memory_region cannot be combined with binary_data_size or data"
    );
}

// ---- limits ----

fn limits(max_elements: usize, max_json_values: usize) -> DecodeLimits {
    DecodeLimits {
        max_elements: Some(max_elements),
        max_json_values: Some(max_json_values),
    }
}

#[test]
fn a_shape_over_the_largest_input_is_refused_before_its_data_is_read() {
    let body = json!({"inputs": [input("FP32", json!([9, 4]), json!("not read"))]});
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
    let error = decode_request(&bytes, None, &limits(32, 10_000)).unwrap_err();
    assert_eq!(error.status(), 400);
    assert_eq!(
        error.message(),
        "input 'x': shape [9, 4] declares 36 elements; this model takes at most 32 per input"
    );
    let huge = json!({"inputs": [input("FP32", json!([1u64 << 63, 1u64 << 63, 4]), json!([]))]});
    let bytes = Bytes::from(serde_json::to_vec(&huge).unwrap());
    let error = decode_request(&bytes, None, &limits(32, 10_000)).unwrap_err();
    assert_eq!(
        error.message(),
        "input 'x': shape [9223372036854775808, 9223372036854775808, 4] declares \
         340282366920938463463374607431768211456 elements; this model takes at most 32 per input"
    );
}

#[test]
fn a_large_body_over_the_models_value_bound_is_refused_with_413_unparsed() {
    let lists = COUNT_VALUES_FROM_BYTES / 3 + 1;
    let mut body =
        br#"{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": ["#.to_vec();
    body.extend(b"[],".repeat(lists));
    body.extend(b"[]]}]}");
    let limits = limits(32, 4096 + 32 + 9);
    let error = decode_request(&Bytes::from(body.clone()), None, &limits).unwrap_err();
    assert_eq!(error.status(), 413);
    assert_eq!(
        error.message(),
        format!(
            "the JSON request holds up to {} values (counted by its commas and brackets), more \
             than this model's inputs can take (4137); it was not parsed",
            json_value_count(&body)
        )
    );
    // Under COUNT_VALUES_FROM_BYTES it is parsed: bounded by its size.
    let mut small =
        br#"{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": ["#.to_vec();
    small.extend(b"[],".repeat(5000));
    small.extend(b"[]]}]}");
    let error = decode_request(&Bytes::from(small), None, &limits).unwrap_err();
    assert_eq!(
        error.message(),
        "input 'x': nested data has 5001 rows, shape [1, 4] needs 1"
    );
}

#[test]
fn only_the_json_header_of_a_binary_body_is_counted() {
    let header = json!({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [COUNT_VALUES_FROM_BYTES],
        "parameters": {"binary_data_size": COUNT_VALUES_FROM_BYTES}}]});
    let commas = vec![b','; COUNT_VALUES_FROM_BYTES];
    let (body, length) = binary_body(&header, &[&commas]);
    let request =
        decode_request(&body, Some(length), &limits(COUNT_VALUES_FROM_BYTES, 4096)).unwrap();
    assert_eq!(raw(&request), commas);
}

#[test]
fn a_count_past_usize_is_named_exactly_when_the_data_cannot_match_it() {
    let shape = json!([1u64 << 63, 4]);
    let error = refusal(&json!({"inputs": [input("FP32", shape.clone(), json!([1.0]))]}));
    assert_eq!(
        error.message(),
        "input 'x': data has 1 elements, shape [9223372036854775808, 4] needs 36893488147419103232"
    );
    let header = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape,
        "parameters": {"binary_data_size": 4}}]});
    let (body, length) = binary_body(&header, &[b"1234"]);
    let error = decode_request(&body, Some(length), &DecodeLimits::default()).unwrap_err();
    assert_eq!(
        error.message(),
        "input 'x': binary_data_size 4 does not match shape [9223372036854775808, 4] of FP32 \
         (147573952589676412928 bytes)"
    );
}

#[test]
fn an_empty_tensor_whose_other_dimensions_overflow_is_refused_as_numpy_refuses_it() {
    let error =
        refusal(&json!({"inputs": [input("FP32", json!([0, 1u64 << 62, 1u64 << 62]), json!([]))]}));
    assert_eq!(
        error.message(),
        "input 'x': shape [0, 4611686018427387904, 4611686018427387904] cannot be used: array is \
         too big; `arr.size * arr.dtype.itemsize` is larger than the maximum possible size."
    );
    let fine = decode_json(&json!({"inputs": [input("FP32", json!([0, 1 << 20]), json!([]))]}));
    assert_eq!(raw(&fine.unwrap()), Vec::<u8>::new());
}

// ---- encoding ----

fn tensor(name: &str, datatype: DataType, shape: Vec<usize>, data: TensorData) -> Tensor {
    Tensor {
        name: name.into(),
        datatype,
        shape,
        data,
    }
}

fn json_output(tensor: Tensor) -> ResponseOutput {
    ResponseOutput {
        tensor,
        binary: false,
        shared_memory: None,
    }
}

fn response(outputs: Vec<ResponseOutput>, id: Option<&str>) -> InferResponse {
    InferResponse {
        model_name: "m".into(),
        model_version: "1".into(),
        id: id.map(str::to_owned),
        outputs,
    }
}

fn raw_data(bytes: Vec<u8>) -> TensorData {
    TensorData::Raw(Bytes::from(bytes))
}

#[test]
fn a_json_answer_has_the_python_runtimes_keys_in_its_order() {
    let labels = tensor(
        "l",
        DataType::I64,
        vec![3, 1],
        raw_data(le(&[1i64, 2, -3], i64::to_le_bytes)),
    );
    let body = encode_response(&response(vec![json_output(labels)], Some("r"))).unwrap();
    assert_eq!(body.header_length, None);
    assert_eq!(body.parts.len(), 1);
    assert_eq!(
        body.parts[0],
        Bytes::from_static(
            br#"{"model_name":"m","model_version":"1","outputs":[{"name":"l","datatype":"INT64","shape":[3,1],"data":[1,2,-3]}],"id":"r"}"#
        )
    );
    let flags = tensor("f", DataType::Bool, vec![2], raw_data(vec![1, 0]));
    let body = encode_response(&response(vec![json_output(flags)], None)).unwrap();
    assert_eq!(
        body.parts[0],
        Bytes::from_static(
            br#"{"model_name":"m","model_version":"1","outputs":[{"name":"f","datatype":"BOOL","shape":[2],"data":[true,false]}]}"#
        )
    );
}

fn data_of(body: &EncodedBody) -> Vec<Value> {
    let header: Value = serde_json::from_slice(&body.parts[0]).unwrap();
    header["outputs"][0]["data"].as_array().unwrap().clone()
}

#[test]
fn floats_are_written_shortest_and_read_back_bit_exact() {
    let f32s = [
        0.1f32,
        1.0 / 7.0,
        -0.0,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        3.0,
    ];
    let out = tensor(
        "y",
        DataType::F32,
        vec![f32s.len()],
        raw_data(le(&f32s, f32::to_le_bytes)),
    );
    let body = encode_response(&response(vec![json_output(out)], None)).unwrap();
    let text = std::str::from_utf8(&body.parts[0]).unwrap();
    assert!(
        text.contains("[0.1,0.14285715,-0.0,3.4028235e+38,1.1754944e-38,1e-45,3.0]"),
        "{text}"
    );
    let back: Vec<f32> = data_of(&body)
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(le(&back, f32::to_le_bytes), le(&f32s, f32::to_le_bytes));

    let f64s = [0.1f64, 1.0 / 3.0, 5e-324, f64::MAX, -2.5];
    let out = tensor(
        "y",
        DataType::F64,
        vec![f64s.len()],
        raw_data(le(&f64s, f64::to_le_bytes)),
    );
    let body = encode_response(&response(vec![json_output(out)], None)).unwrap();
    let back: Vec<f64> = data_of(&body).iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(back, f64s);

    let f16s: Vec<half::f16> = [0.1f32, 65504.0, -6e-8, 1.0 / 3.0]
        .map(half::f16::from_f32)
        .to_vec();
    let out = tensor(
        "y",
        DataType::F16,
        vec![f16s.len()],
        raw_data(le(&f16s, half::f16::to_le_bytes)),
    );
    let body = encode_response(&response(vec![json_output(out)], None)).unwrap();
    let back: Vec<half::f16> = data_of(&body)
        .iter()
        .map(|v| half::f16::from_f64(v.as_f64().unwrap()))
        .collect();
    assert_eq!(back, f16s);
}

#[test]
fn nan_and_infinities_are_written_as_null() {
    let values = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0];
    let out = tensor(
        "y",
        DataType::F32,
        vec![4],
        raw_data(le(&values, f32::to_le_bytes)),
    );
    let body = encode_response(&response(vec![json_output(out)], None)).unwrap();
    assert_eq!(
        data_of(&body),
        vec![Value::Null, Value::Null, Value::Null, json!(1.0)]
    );
}

#[test]
fn every_datatype_answered_as_json_decodes_back_as_a_request_to_the_same_tensor() {
    let cases: Vec<(DataType, TensorData)> = vec![
        (DataType::Bool, raw_data(vec![1, 0, 1, 1])),
        (DataType::U8, raw_data(vec![0, 1, 254, 255])),
        (
            DataType::U16,
            raw_data(le(&[0u16, 1, 60000, u16::MAX], u16::to_le_bytes)),
        ),
        (
            DataType::U32,
            raw_data(le(&[0u32, 1, 7, u32::MAX], u32::to_le_bytes)),
        ),
        (
            DataType::U64,
            raw_data(le(&[0u64, 1, 1 << 60, u64::MAX], u64::to_le_bytes)),
        ),
        (
            DataType::I8,
            raw_data(le(&[i8::MIN, -1, 0, i8::MAX], i8::to_le_bytes)),
        ),
        (
            DataType::I16,
            raw_data(le(&[i16::MIN, -1, 0, i16::MAX], i16::to_le_bytes)),
        ),
        (
            DataType::I32,
            raw_data(le(&[i32::MIN, -1, 0, i32::MAX], i32::to_le_bytes)),
        ),
        (
            DataType::I64,
            raw_data(le(&[i64::MIN, -1, 0, i64::MAX], i64::to_le_bytes)),
        ),
        (
            DataType::F16,
            raw_data(le(
                &[0.5f32, -1e-5, 1000.0, 3.25].map(half::f16::from_f32),
                half::f16::to_le_bytes,
            )),
        ),
        (
            DataType::F32,
            raw_data(le(&[0.3f32, -1e-30, 1e30, 2.0f32.sqrt()], f32::to_le_bytes)),
        ),
        (
            DataType::F64,
            raw_data(le(
                &[0.3f64, -1e-300, 1e300, 2.0f64.sqrt()],
                f64::to_le_bytes,
            )),
        ),
        (
            DataType::Bytes,
            TensorData::Strings(["a", "", "é", "\"q\"\n"].map(Bytes::from).to_vec()),
        ),
    ];
    for (datatype, data) in cases {
        let answer = encode_response(&response(
            vec![json_output(tensor("x", datatype, vec![2, 2], data.clone()))],
            None,
        ))
        .unwrap();
        let header: Value = serde_json::from_slice(&answer.parts[0]).unwrap();
        let request = decode_json(&json!({"inputs": [header["outputs"][0].clone()]})).unwrap();
        assert_eq!(
            only_input(&request).source,
            InputSource::Data(data),
            "{datatype:?}"
        );
        assert_eq!(only_input(&request).shape, vec![2, 2]);
    }
}

#[test]
fn binary_outputs_follow_the_header_in_output_order_with_their_sizes() {
    let logits = le(&[0.5f32, 1.0 / 7.0], f32::to_le_bytes);
    let labels = vec![Bytes::from("cat"), Bytes::from_static(b"\xff")];
    let outputs = vec![
        ResponseOutput {
            binary: true,
            ..json_output(tensor(
                "logits",
                DataType::F32,
                vec![1, 2],
                raw_data(logits.clone()),
            ))
        },
        json_output(tensor(
            "l",
            DataType::I32,
            vec![1],
            raw_data(le(&[4i32], i32::to_le_bytes)),
        )),
        ResponseOutput {
            binary: true,
            ..json_output(tensor(
                "label",
                DataType::Bytes,
                vec![2],
                TensorData::Strings(labels.clone()),
            ))
        },
    ];
    let body = encode_response(&response(outputs, Some("r"))).unwrap();
    let serialized = crate::codec::bytes::serialize(&labels);
    assert_eq!(body.header_length, Some(body.parts[0].len()));
    assert_eq!(
        body.parts[1..],
        [Bytes::from(logits.clone()), Bytes::from(serialized.clone())]
    );
    assert_eq!(
        body.len(),
        body.parts[0].len() + logits.len() + serialized.len()
    );
    let header: Value = serde_json::from_slice(&body.parts[0]).unwrap();
    assert_eq!(
        header["outputs"],
        json!([
            {"name": "logits", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
            {"name": "l", "datatype": "INT32", "shape": [1], "data": [4]},
            {"name": "label", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": serialized.len()}},
        ])
    );
}

#[test]
fn a_shared_memory_output_carries_only_its_parameters() {
    let memory = SharedMemoryRef {
        region: "out".into(),
        offset: 0,
        byte_size: 8,
    };
    let out = ResponseOutput {
        shared_memory: Some(memory),
        ..json_output(tensor("y", DataType::F32, vec![2], raw_data(vec![0; 8])))
    };
    let body = encode_response(&response(vec![out], None)).unwrap();
    assert_eq!((body.parts.len(), body.header_length), (1, None));
    let header: Value = serde_json::from_slice(&body.parts[0]).unwrap();
    assert_eq!(
        header["outputs"][0],
        json!({"name": "y", "datatype": "FP32", "shape": [2],
            "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 8,
                "binary_data_size": 0}})
    );
}

/// What Triton's C++ HTTP client does with an answer: every output with parameters must
/// name its `binary_data_size`, and those sizes, summed in output order, must cover the
/// bytes after the JSON exactly.
fn binary_sizes_as_the_cpp_client_reads_them(body: &EncodedBody) -> Result<Vec<u64>, String> {
    let header: Value = serde_json::from_slice(&body.parts[0]).unwrap();
    let mut sizes = Vec::new();
    for output in header["outputs"].as_array().unwrap() {
        if let Some(parameters) = output.get("parameters") {
            let size = parameters["binary_data_size"].as_u64().ok_or_else(|| {
                format!(
                    "attempt to access non-existing object member 'binary_data_size' in {output}"
                )
            })?;
            sizes.push(size);
        }
    }
    let tail: usize = body.parts[1..].iter().map(Bytes::len).sum();
    assert_eq!(sizes.iter().sum::<u64>(), tail as u64);
    Ok(sizes)
}

#[test]
fn a_shared_memory_output_among_binary_ones_is_read_by_tritons_cpp_client() {
    let memory = SharedMemoryRef {
        region: "out".into(),
        offset: 16,
        byte_size: 8,
    };
    let in_memory = ResponseOutput {
        shared_memory: Some(memory),
        ..json_output(tensor("y", DataType::F32, vec![2], raw_data(vec![0; 8])))
    };
    let binary = ResponseOutput {
        binary: true,
        ..json_output(tensor(
            "z",
            DataType::I32,
            vec![1],
            raw_data(vec![7, 0, 0, 0]),
        ))
    };
    let body = encode_response(&response(vec![in_memory, binary], None)).unwrap();
    assert_eq!(
        binary_sizes_as_the_cpp_client_reads_them(&body),
        Ok(vec![0, 4])
    );
}

#[test]
fn a_non_utf8_string_output_is_refused_as_json_with_the_remedy() {
    let out = tensor(
        "label",
        DataType::Bytes,
        vec![1],
        TensorData::Strings(vec![Bytes::from_static(b"\xff")]),
    );
    let error = encode_response(&response(vec![json_output(out)], None)).unwrap_err();
    assert_eq!(error.status(), 400);
    assert_eq!(
        error.message(),
        "output 'label' holds bytes that are not UTF-8 text, which JSON cannot carry; ask for it \
         in binary (the output's binary_data parameter)"
    );
}

#[test]
fn an_output_whose_data_does_not_fill_its_shape_is_an_internal_error() {
    let short = tensor("y", DataType::F32, vec![2], raw_data(vec![0; 4]));
    let strings_as_floats = tensor(
        "y",
        DataType::F32,
        vec![1],
        TensorData::Strings(vec![Bytes::new()]),
    );
    for out in [short, strings_as_floats] {
        let error = encode_response(&response(vec![json_output(out)], None)).unwrap_err();
        assert_eq!(error, ApiError::Internal);
    }
}

#[test]
fn a_lone_surrogate_is_refused_in_the_header_and_in_string_data() {
    let cases = [
        (&br#"{"id": "\ud800", "inputs": [1]}"#[..], "malformed JSON request: "),
        (
            br#"{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["\ud800"]}]}"#,
            "malformed JSON request: input 'x': ",
        ),
    ];
    for (body, prefix) in cases {
        let error = decode_request(
            &Bytes::copy_from_slice(body),
            None,
            &DecodeLimits::default(),
        )
        .unwrap_err();
        assert_eq!(error.status(), 400);
        assert!(error.message().starts_with(prefix), "{error}");
    }
}

/// A small deterministic generator of bit patterns (xorshift64*).
fn bit_patterns(seed: u64) -> impl Iterator<Item = u64> {
    let mut state = seed;
    std::iter::repeat_with(move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

/// `raw` answered as a JSON output, then sent back as a request's input: its bytes.
fn through_json(datatype: DataType, count: usize, raw: Vec<u8>) -> Vec<u8> {
    let out = tensor("x", datatype, vec![count], raw_data(raw));
    let answer = encode_response(&response(vec![json_output(out)], None)).unwrap();
    let header: Value = serde_json::from_slice(&answer.parts[0]).unwrap();
    let request = decode_json(&json!({"inputs": [header["outputs"][0].clone()]})).unwrap();
    self::raw(&request)
}

#[test]
fn every_finite_fp16_and_random_fp32_and_fp64_values_read_back_bit_exact() {
    let f16s: Vec<u8> = (0..=u16::MAX)
        .map(half::f16::from_bits)
        .filter(|v| v.is_finite())
        .flat_map(half::f16::to_le_bytes)
        .collect();
    assert_eq!(
        through_json(DataType::F16, f16s.len() / 2, f16s.clone()),
        f16s
    );
    let f32s: Vec<u8> = bit_patterns(7)
        .map(|bits| f32::from_bits(bits as u32))
        .filter(|v| v.is_finite())
        .take(20_000)
        .flat_map(f32::to_le_bytes)
        .collect();
    assert_eq!(
        through_json(DataType::F32, f32s.len() / 4, f32s.clone()),
        f32s
    );
    let f64s: Vec<u8> = bit_patterns(11)
        .map(f64::from_bits)
        .filter(|v| v.is_finite())
        .take(20_000)
        .flat_map(f64::to_le_bytes)
        .collect();
    assert_eq!(
        through_json(DataType::F64, f64s.len() / 8, f64s.clone()),
        f64s
    );
}

#[test]
fn floats_as_pythons_json_writes_them_read_exactly() {
    // json.dumps(np.float32(0.1).item()) and Python's exponent forms.
    let body = br#"{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3],
        "data": [0.10000000149011612, 1e-07, 1.5e+16]}]}"#;
    let request =
        decode_request(&Bytes::from_static(body), None, &DecodeLimits::default()).unwrap();
    assert_eq!(raw(&request), le(&[0.1f32, 1e-7, 1.5e16], f32::to_le_bytes));
}

#[test]
fn shapes_numpy_cannot_hold_are_400_in_json_and_binary() {
    for shape in [
        json!([1u64 << 62, 1u64 << 62, 0]),
        json!([(1u64 << 63) - 1, 0]),
        json!(vec![0; 100]),
    ] {
        let error = refusal(&json!({"inputs": [input("FP32", shape.clone(), json!([]))]}));
        assert_eq!(error.status(), 400, "{shape}");
        let header = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape,
            "parameters": {"binary_data_size": 0}}]});
        let (body, length) = binary_body(&header, &[]);
        let error = decode_request(&body, Some(length), &limits(32, 4137)).unwrap_err();
        assert_eq!(error.status(), 400, "{header}");
    }
}

/// A fuzz of shapes: any rank up to 100, extreme dimensions,
/// JSON or binary data: a decoded request or a 400, never a panic or another status.
#[test]
fn no_shape_makes_the_decoder_fail_other_than_with_a_400() {
    let extremes = [
        1u64 << 31,
        (1 << 31) - 1,
        1 << 32,
        1 << 62,
        (1 << 63) - 1,
        1 << 63,
        u64::MAX,
    ];
    let mut draws = bit_patterns(3);
    let mut next = move |below: u64| draws.next().unwrap() % below;
    for case in 0..2000 {
        let rank = next(101) as usize;
        let shape: Vec<u64> = (0..rank)
            .map(|_| {
                if next(4) == 0 {
                    extremes[next(7) as usize]
                } else {
                    next(9)
                }
            })
            .collect();
        let data: Vec<f32> = (0..next(7)).map(|i| i as f32 / 4.0).collect();
        let datatype = ["FP32", "INT32", "FP64", "BOOL", "BYTES"][next(5) as usize];
        let mut tensor = json!({"name": "x", "datatype": datatype, "shape": shape});
        let limits = if case % 2 == 0 {
            limits(32, 4137)
        } else {
            DecodeLimits::default()
        };
        let result = if next(2) == 0 {
            tensor["data"] = json!(data);
            let body = Bytes::from(serde_json::to_vec(&json!({"inputs": [tensor]})).unwrap());
            decode_request(&body, None, &limits)
        } else {
            let blob = le(&data, f32::to_le_bytes);
            tensor["parameters"] = json!({"binary_data_size": blob.len()});
            let (body, length) = binary_body(&json!({"inputs": [tensor]}), &[&blob]);
            decode_request(&body, Some(length), &limits)
        };
        if let Err(error) = result {
            assert_eq!(error.status(), 400, "{shape:?} {datatype}: {error}");
        }
    }
}

#[test]
fn binary_strings_for_a_count_past_usize_name_the_count_exactly() {
    let header = json!({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1u64 << 63, 4],
        "parameters": {"binary_data_size": 5}}]});
    let (body, length) = binary_body(&header, &[b"\x01\x00\x00\x00a"]);
    let error = decode_request(&body, Some(length), &DecodeLimits::default()).unwrap_err();
    assert_eq!(
        error.message(),
        "input 't': BYTES data ends after 1 of 36893488147419103232 elements (each element is a \
         4-byte little-endian length and that many bytes)"
    );
}
