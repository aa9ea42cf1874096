//! The gRPC codec's decisions on messages built in memory: raw and typed inputs, the
//! refusals word for word (the messages the black-box tests read), raw or typed answers.

use bytes::Bytes;

use dataplane_core::codec::DecodeLimits;
use dataplane_core::error::ApiError;
use dataplane_core::request::{InferResponse, InputSource, ResponseOutput};
use dataplane_core::tensor::{DataType, Tensor, TensorData};

use super::super::inference::infer_parameter::ParameterChoice;
use super::super::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use super::super::inference::{InferParameter, InferTensorContents, ModelInferRequest};
use super::{from_model_infer_request, to_model_infer_response, typed_elements};

fn input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        ..InferInputTensor::default()
    }
}

fn raw_request(inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "m".into(),
        inputs,
        raw_input_contents: raw.into_iter().map(Bytes::from).collect(),
        ..ModelInferRequest::default()
    }
}

fn typed(
    name: &str,
    datatype: &str,
    shape: &[i64],
    contents: InferTensorContents,
) -> InferInputTensor {
    InferInputTensor {
        contents: Some(contents),
        ..input(name, datatype, shape)
    }
}

fn refusal(message: &ModelInferRequest) -> String {
    match from_model_infer_request(message, &DecodeLimits::default()) {
        Err(ApiError::InvalidRequest(message)) => message,
        other => panic!("expected a 400, got {other:?}"),
    }
}

fn parameter(choice: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(choice),
    }
}

#[test]
fn raw_contents_are_taken_as_the_tensors_bytes() {
    let bytes: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let message = raw_request(vec![input("x", "FP32", &[1, 2])], vec![bytes.clone()]);
    let decoded = from_model_infer_request(&message, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.inputs[0].shape, vec![1, 2]);
    assert_eq!(
        decoded.inputs[0].source,
        InputSource::Data(TensorData::Raw(Bytes::from(bytes)))
    );
    assert!(decoded.binary_data_output, "answers are raw by default");
    assert_eq!(decoded.outputs, None);
}

#[test]
fn typed_contents_become_little_endian_bytes_of_the_datatype() {
    let contents = InferTensorContents {
        int_contents: vec![-3, 7],
        ..InferTensorContents::default()
    };
    let message = raw_request(vec![typed("x", "INT16", &[2], contents)], vec![]);
    let decoded = from_model_infer_request(&message, &DecodeLimits::default()).unwrap();
    let expected: Vec<u8> = [-3i16, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        decoded.inputs[0].source,
        InputSource::Data(TensorData::Raw(Bytes::from(expected)))
    );
}

#[test]
fn a_typed_value_out_of_its_datatypes_range_is_refused_not_wrapped() {
    let contents = InferTensorContents {
        int_contents: vec![1, 300, -200],
        ..InferTensorContents::default()
    };
    let message = raw_request(vec![typed("x", "INT8", &[3], contents)], vec![]);
    assert_eq!(
        refusal(&message),
        "input 'x': -200 is out of the range of INT8"
    );
    let contents = InferTensorContents {
        uint_contents: vec![1, 70000],
        ..InferTensorContents::default()
    };
    let message = raw_request(vec![typed("x", "UINT16", &[2], contents)], vec![]);
    assert_eq!(
        refusal(&message),
        "input 'x': 70000 is out of the range of UINT16"
    );
}

#[test]
fn malformed_messages_are_refused_in_the_python_runtimes_words() {
    let empty = raw_request(vec![], vec![]);
    assert_eq!(refusal(&empty), "inputs must not be empty");
    let short = raw_request(vec![input("x", "FP32", &[1, 2])], vec![vec![0; 4]]);
    assert_eq!(
        refusal(&short),
        "input 'x': raw_input_contents holds 4 bytes; shape [1, 2] of FP32 takes 8"
    );
    let counted = raw_request(
        vec![input("x", "FP32", &[1]), input("y", "FP32", &[1])],
        vec![vec![0; 4]],
    );
    assert_eq!(
        refusal(&counted),
        "raw_input_contents has 1 entries for 2 inputs; give one per input, in the order of inputs"
    );
    let negative = raw_request(vec![input("x", "FP32", &[-1, 2])], vec![vec![]]);
    assert_eq!(
        refusal(&negative),
        "input 'x': shape [-1, 2] has a negative dimension"
    );
    let odd_type = raw_request(vec![input("x", "FP8", &[1])], vec![vec![0]]);
    assert_eq!(
        refusal(&odd_type),
        "input 'x': datatype 'FP8' is not supported (one of BOOL, UINT8, UINT16, UINT32, \
         UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES)"
    );
    let wrong_field = InferTensorContents {
        int_contents: vec![1],
        ..InferTensorContents::default()
    };
    let message = raw_request(vec![typed("x", "FP32", &[1], wrong_field)], vec![]);
    assert_eq!(
        refusal(&message),
        "input 'x' is FP32: its data goes in contents.fp32_contents, not contents.int_contents"
    );
    let half = raw_request(vec![input("x", "FP16", &[1])], vec![]);
    assert_eq!(
        refusal(&half),
        "input 'x': FP16 has no typed contents; send it in raw_input_contents"
    );
}

#[test]
fn a_shape_past_the_models_largest_input_is_refused_before_its_data() {
    let limits = DecodeLimits {
        max_elements: Some(16),
        max_json_values: None,
    };
    let message = raw_request(vec![input("x", "FP32", &[5, 4])], vec![vec![0; 80]]);
    let refused = from_model_infer_request(&message, &limits).unwrap_err();
    assert_eq!(
        refused.message(),
        "input 'x': shape [5, 4] declares 20 elements; this model takes at most 16 per input"
    );
}

#[test]
fn parameters_of_the_wrong_kind_are_named() {
    let mut message = raw_request(vec![input("x", "FP32", &[1])], vec![vec![0; 4]]);
    message.parameters.insert(
        "timeout".into(),
        parameter(ParameterChoice::StringParam("5".into())),
    );
    assert_eq!(
        refusal(&message),
        "parameters.timeout must be given as int64_param, not string_param"
    );
    message
        .parameters
        .insert("timeout".into(), parameter(ParameterChoice::Int64Param(-1)));
    assert_eq!(
        refusal(&message),
        "parameters.timeout must be >= 0 (microseconds)"
    );
}

#[test]
fn the_timeout_and_priority_parameters_are_read() {
    let mut message = raw_request(vec![input("x", "FP32", &[1])], vec![vec![0; 4]]);
    message.parameters.insert(
        "timeout".into(),
        parameter(ParameterChoice::Int64Param(2500)),
    );
    message.parameters.insert(
        "priority".into(),
        parameter(ParameterChoice::Uint64Param(2)),
    );
    let decoded = from_model_infer_request(&message, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.timeout_microseconds, Some(2500));
    assert_eq!(decoded.priority, 2);
}

#[test]
fn outputs_asking_raw_and_typed_at_once_are_refused() {
    let mut message = raw_request(vec![input("x", "FP32", &[1])], vec![vec![0; 4]]);
    let typed_output = InferRequestedOutputTensor {
        name: "a".into(),
        parameters: [(
            "binary_data".to_string(),
            parameter(ParameterChoice::BoolParam(false)),
        )]
        .into(),
    };
    let raw_output = InferRequestedOutputTensor {
        name: "b".into(),
        ..InferRequestedOutputTensor::default()
    };
    message.outputs = vec![typed_output, raw_output];
    assert!(refusal(&message).starts_with("outputs ask for raw and for typed contents at once"));
}

#[test]
fn bytes_inputs_come_length_prefixed_raw_or_typed_and_must_be_text() {
    let mut raw = Vec::new();
    for element in [&b"ab"[..], b""] {
        raw.extend_from_slice(&(element.len() as u32).to_le_bytes());
        raw.extend_from_slice(element);
    }
    let message = raw_request(vec![input("s", "BYTES", &[2])], vec![raw]);
    let decoded = from_model_infer_request(&message, &DecodeLimits::default()).unwrap();
    let elements = vec![Bytes::from_static(b"ab"), Bytes::new()];
    let expected = InputSource::Data(TensorData::Strings(elements.clone()));
    assert_eq!(decoded.inputs[0].source, expected);
    let contents = InferTensorContents {
        bytes_contents: elements,
        ..InferTensorContents::default()
    };
    let message = raw_request(vec![typed("s", "BYTES", &[2], contents)], vec![]);
    let decoded = from_model_infer_request(&message, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.inputs[0].source, expected);
    let contents = InferTensorContents {
        bytes_contents: vec![Bytes::from_static(b"\xff")],
        ..InferTensorContents::default()
    };
    let message = raw_request(vec![typed("s", "BYTES", &[1], contents)], vec![]);
    assert_eq!(
        refusal(&message),
        "input 's': contents.bytes_contents: BYTES element 0 is not UTF-8 text (invalid start \
         byte at byte 0); string inputs are UTF-8"
    );
    let short = raw_request(vec![input("s", "BYTES", &[1])], vec![vec![9, 0, 0, 0, 1]]);
    assert_eq!(
        refusal(&short),
        "input 's': raw_input_contents: BYTES element 0 declares 9 bytes; only 1 are left"
    );
}

fn answer(binary: bool, tensor: Tensor) -> InferResponse {
    InferResponse {
        model_name: "m".into(),
        model_version: "1".into(),
        id: Some("r1".into()),
        outputs: vec![ResponseOutput {
            tensor,
            binary,
            shared_memory: None,
        }],
    }
}

#[test]
fn answers_are_raw_unless_typed_contents_were_asked_for() {
    let bytes: Vec<u8> = [1i32, -2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensor = Tensor {
        name: "y".into(),
        datatype: DataType::I32,
        shape: vec![1, 2],
        data: TensorData::Raw(Bytes::from(bytes.clone())),
    };
    let raw = to_model_infer_response(answer(true, tensor.clone()));
    assert_eq!(raw.id, "r1");
    assert_eq!(raw.outputs[0].shape, vec![1, 2]);
    assert_eq!(raw.raw_output_contents, vec![Bytes::from(bytes)]);
    assert!(raw.outputs[0].contents.is_none());
    let typed = to_model_infer_response(answer(false, tensor));
    assert!(typed.raw_output_contents.is_empty());
    assert_eq!(
        typed.outputs[0].contents.as_ref().unwrap().int_contents,
        vec![1, -2]
    );
}

#[test]
fn typed_elements_count_only_typed_contents() {
    let contents = InferTensorContents {
        fp32_contents: vec![0.0; 6],
        ..InferTensorContents::default()
    };
    let message = raw_request(vec![typed("x", "FP32", &[2, 3], contents)], vec![]);
    assert_eq!(typed_elements(&message), 6);
    let raw = raw_request(vec![input("x", "FP32", &[1])], vec![vec![0; 4]]);
    assert_eq!(typed_elements(&raw), 0);
}
