//! The system shared-memory extension over gRPC, on real HTTP/2 with the tonic client and
//! real `/dev/shm` objects: the three RPCs and their codes, and infer requests whose inputs
//! and outputs are in regions; and the codec's reading of the places, in memory.

use std::collections::HashMap;
use std::time::Duration;

use tonic::Code;

use dataplane_core::codec::DecodeLimits;
use dataplane_core::request::{InputSource, SharedMemoryRef};

use crate::grpc::codec::from_model_infer_request;
use crate::grpc::inference::infer_parameter::ParameterChoice;
use crate::grpc::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::grpc::inference::system_shared_memory_status_response::RegionStatus;
use crate::grpc::inference::{
    InferParameter, ModelInferRequest, SystemSharedMemoryRegisterRequest,
    SystemSharedMemoryStatusRequest, SystemSharedMemoryUnregisterRequest,
};
use crate::grpc::tests::{connect, floats, raw_output, read_floats, runtime, serve};
use crate::shm::tests::ShmObject;

fn text(value: &str) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::StringParam(value.into())),
    }
}

fn int(value: i64) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(value)),
    }
}

/// A tensor's parameters naming a place, as tritonclient's `set_shared_memory` sends them
/// (no offset when it is 0).
fn place(region: &str, byte_size: i64, offset: i64) -> HashMap<String, InferParameter> {
    let mut parameters = HashMap::from([
        ("shared_memory_region".to_string(), text(region)),
        ("shared_memory_byte_size".to_string(), int(byte_size)),
    ]);
    if offset != 0 {
        parameters.insert("shared_memory_offset".into(), int(offset));
    }
    parameters
}

fn register(
    name: &str,
    key: &str,
    offset: u64,
    byte_size: u64,
) -> SystemSharedMemoryRegisterRequest {
    SystemSharedMemoryRegisterRequest {
        name: name.into(),
        key: key.into(),
        offset,
        byte_size,
    }
}

/// `double`'s request of `rows` rows in region `input`, `y` asked into `output` and `rows`
/// answered in the message.
fn shm_request(rows: i64, input: (&str, i64, i64), output: (&str, i64, i64)) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "double".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![rows, 2],
            parameters: place(input.0, input.1, input.2),
            ..InferInputTensor::default()
        }],
        outputs: vec![
            InferRequestedOutputTensor {
                name: "y".into(),
                parameters: place(output.0, output.1, output.2),
            },
            InferRequestedOutputTensor {
                name: "rows".into(),
                ..InferRequestedOutputTensor::default()
            },
        ],
        ..ModelInferRequest::default()
    }
}

#[test]
fn regions_are_registered_listed_and_unregistered_with_tritons_codes() {
    let (server, _) = serve(Duration::ZERO, 1000);
    let object = ShmObject::with(&[0u8; 64]);
    let key = object.key.clone();
    runtime().block_on(async {
        let mut client = connect(&server).await;
        client
            .system_shared_memory_register(register("a", &key, 16, 32))
            .await
            .unwrap();
        client
            .system_shared_memory_register(register("b", &key, 0, 64))
            .await
            .unwrap();
        let all = SystemSharedMemoryStatusRequest::default();
        let listed = client
            .system_shared_memory_status(all)
            .await
            .unwrap()
            .into_inner();
        let status = |name: &str, offset, byte_size| RegionStatus {
            name: name.into(),
            key: key.clone(),
            offset,
            byte_size,
        };
        let expected = HashMap::from([
            ("a".to_string(), status("a", 16, 32)),
            ("b".to_string(), status("b", 0, 64)),
        ]);
        assert_eq!(listed.regions, expected);
        let one = SystemSharedMemoryStatusRequest { name: "a".into() };
        let listed = client
            .system_shared_memory_status(one)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.regions.keys().collect::<Vec<_>>(), vec!["a"]);

        let again = client
            .system_shared_memory_register(register("a", &key, 0, 8))
            .await;
        let refused = again.expect_err("a name registered twice");
        assert_eq!(refused.code(), Code::AlreadyExists);
        assert_eq!(
            refused.message(),
            "shared memory region 'a' already in manager"
        );
        let past = client
            .system_shared_memory_register(register("c", &key, 32, 64))
            .await;
        let refused = past.expect_err("past the object's end");
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(
            refused.message().contains("invalid args"),
            "{}",
            refused.message()
        );
        let none = register("d", "/kubeinfer-test-no-such-object", 0, 8);
        let refused = client
            .system_shared_memory_register(none)
            .await
            .expect_err("no object");
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(
            refused
                .message()
                .starts_with("Unable to open shared memory region")
        );
        let unnamed = client
            .system_shared_memory_register(register("", &key, 0, 8))
            .await;
        assert_eq!(unnamed.expect_err("no name").code(), Code::InvalidArgument);

        let a = SystemSharedMemoryUnregisterRequest { name: "a".into() };
        client
            .system_shared_memory_unregister(a.clone())
            .await
            .unwrap();
        client
            .system_shared_memory_unregister(a)
            .await
            .expect("unknown: no error, as Triton");
        let gone = SystemSharedMemoryStatusRequest { name: "a".into() };
        let refused = client
            .system_shared_memory_status(gone)
            .await
            .expect_err("unregistered");
        assert_eq!(refused.code(), Code::NotFound);
        assert_eq!(
            refused.message(),
            "Unable to find system shared memory region: 'a'"
        );
        let all = SystemSharedMemoryUnregisterRequest::default();
        client.system_shared_memory_unregister(all).await.unwrap();
        let all = SystemSharedMemoryStatusRequest::default();
        let listed = client
            .system_shared_memory_status(all)
            .await
            .unwrap()
            .into_inner();
        assert!(listed.regions.is_empty());
    });
    server.shutdown();
}

#[test]
fn an_input_in_a_region_is_answered_into_another_as_over_http() {
    let (server, runs) = serve(Duration::ZERO, 1000);
    // The input 8 bytes into its region, the region 8 bytes into its object.
    let mut contents = vec![0u8; 16];
    contents.extend_from_slice(&floats(&[1.0, 2.5, -3.0, 0.5]));
    let input = ShmObject::with(&contents);
    let output = ShmObject::with(&[0u8; 24]);
    let answer = runtime().block_on(async {
        let mut client = connect(&server).await;
        let into = register("in", &input.key, 8, 24);
        client.system_shared_memory_register(into).await.unwrap();
        let out = register("out", &output.key, 0, 24);
        client.system_shared_memory_register(out).await.unwrap();
        let request = shm_request(2, ("in", 16, 8), ("out", 16, 4));
        client.model_infer(request).await.unwrap().into_inner()
    });
    let names: Vec<&str> = answer.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["y", "rows"]);
    let y = &answer.outputs[0];
    assert_eq!(y.shape, vec![2, 2]);
    assert!(y.contents.is_none());
    assert_eq!(y.parameters["shared_memory_region"], text("out"));
    assert_eq!(y.parameters["shared_memory_byte_size"], int(16));
    assert_eq!(y.parameters["shared_memory_offset"], int(4));
    // One raw entry per output, as Triton answers: y's is empty, rows' its data.
    assert_eq!(answer.raw_output_contents.len(), 2);
    assert!(raw_output(&answer, "y").is_empty());
    assert_eq!(
        raw_output(&answer, "rows"),
        [2i32.to_le_bytes(), 2i32.to_le_bytes()].concat()
    );
    assert_eq!(
        read_floats(&output.contents()[4..20]),
        vec![2.0, 5.0, -6.0, 1.0]
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    server.shutdown();
}

#[test]
fn a_wrong_place_is_invalid_argument_naming_it_and_never_runs() {
    let (server, runs) = serve(Duration::ZERO, 1000);
    let object = ShmObject::with(&[0u8; 64]);
    let cases = [
        (
            ("none", 16, 0),
            ("r", 16, 32),
            "Unable to find shared memory region: 'none'",
        ),
        (
            ("r", 12, 0),
            ("r", 16, 32),
            "shared_memory_byte_size 12 does not match shape",
        ),
        (("r", 16, 56), ("r", 16, 32), "Invalid offset + byte size"),
        (("r", 16, 0), ("r", 12, 32), "should be at least 16 bytes"),
        (("r", 16, 0), ("r", 16, 56), "Invalid offset + byte size"),
    ];
    runtime().block_on(async {
        let mut client = connect(&server).await;
        let r = register("r", &object.key, 0, 64);
        client.system_shared_memory_register(r).await.unwrap();
        for (input, output, message) in cases {
            let refused = client
                .model_infer(shm_request(2, input, output))
                .await
                .expect_err(message);
            assert_eq!(
                refused.code(),
                Code::InvalidArgument,
                "{}",
                refused.message()
            );
            assert!(refused.message().contains(message), "{}", refused.message());
        }
        let mut request = shm_request(2, ("r", 16, 0), ("r", 16, 32));
        request.inputs[0]
            .parameters
            .insert("shared_memory_region".into(), int(3));
        let refused = client
            .model_infer(request)
            .await
            .expect_err("a region named by a number");
        assert_eq!(
            refused.message(),
            "input 'x': parameters.shared_memory_region must be given as string_param"
        );
    });
    // The output too small is found when it is written, after the run; the others before.
    assert!(runs.load(std::sync::atomic::Ordering::SeqCst) <= 1);
    server.shutdown();
}

#[test]
fn raw_contents_are_the_inputs_not_in_shared_memory_in_order() {
    let tensor = |name: &str, parameters| InferInputTensor {
        name: name.into(),
        datatype: "FP32".into(),
        shape: vec![1, 2],
        parameters,
        ..InferInputTensor::default()
    };
    let mut message = ModelInferRequest {
        inputs: vec![
            tensor("a", place("r", 8, 4)),
            tensor("b", HashMap::new()),
            tensor("c", place("r", 8, 0)),
        ],
        raw_input_contents: vec![floats(&[1.0, 2.0])],
        ..ModelInferRequest::default()
    };
    let limits = DecodeLimits::default();
    let decoded = from_model_infer_request(&message, &limits).unwrap();
    let at = |region: &str, offset| {
        InputSource::SharedMemory(SharedMemoryRef {
            region: region.into(),
            offset,
            byte_size: 8,
        })
    };
    assert_eq!(decoded.inputs[0].source, at("r", 4));
    assert!(matches!(decoded.inputs[1].source, InputSource::Data(_)));
    assert_eq!(decoded.inputs[2].source, at("r", 0));
    message.raw_input_contents.push(floats(&[3.0, 4.0]));
    let refused = from_model_infer_request(&message, &limits).unwrap_err();
    assert_eq!(
        refused.message(),
        "raw_input_contents has 2 entries for 1 inputs not in shared memory; give one per \
         input not in shared memory, in the order of inputs"
    );
}
