"""The Open Inference Protocol over gRPC, against a real `kubeinfer serve --grpc-port`
process on the tiny demo model (as the REST tests), driven with `tritonclient.grpc` and,
where tritonclient cannot say it (typed contents, typed outputs, malformed messages), with
its own `service_pb2` messages on a plain grpc channel.

Covers: liveness, readiness and metadata equal to REST's (the engine's platform too); FP32
inference with raw input and output contents equal to ONNX Runtime run in-process and to
REST's answer; typed input contents, and typed output contents when the request asks; bad
input (an unknown model or version, a wrong shape, a wrong datatype, raw contents of the
wrong size, a value out of its datatype's range, typed values in another datatype's field,
a mix of raw and typed) answered with the right status code and a message, while
concurrent good requests are all answered correctly; gRPC answers counted in the same
`kubeinfer_requests_total` and duration series as REST's, by the same status; and answered
gRPC requests offered to the mirrors like REST's (a shadow candidate and a quality watch's
reference, both a real `kubeinfer serve`), with the slice read from the request's
metadata.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
import tritonclient.http as triton_http
from ports import free_port
from serve_process import ServeProcess
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException
from waiting import wait_for

pytestmark = pytest.mark.slow

SLICE_HEADER = "x-tenant"


class GrpcServing:
    """The serving process, its gRPC address and the candidate it mirrors to."""

    def __init__(self, serving: ServeProcess, grpc_port: int, candidate: ServeProcess) -> None:
        self.serving, self.candidate = serving, candidate
        self.address = f"127.0.0.1:{grpc_port}"
        self.client = triton.InferenceServerClient(self.address)
        self.channel = grpc.insecure_channel(self.address)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServing]:
    mirror_file = tmp_path_factory.mktemp("grpc-mirror") / "target.yaml"
    with ServeProcess(tiny_model, "tiny") as candidate:
        url = f"http://127.0.0.1:{candidate.port}"
        mirror_file.write_text(json.dumps({
            "target": {"url": url, "modelName": "tiny", "candidateVersion": "2",
                       "trafficPercent": 100},
            "qualityWatch": {
                "reference": {"url": url, "modelName": "tiny", "candidateVersion": "1-fp32",
                              "trafficPercent": 100},
                "sliceHeader": SLICE_HEADER,
            },
        }))  # fmt: skip
        grpc_port = free_port()
        with ServeProcess(
            tiny_model, "tiny", "--grpc-port", str(grpc_port),
            "--mirror-target-file", str(mirror_file),
            "--mirror-poll-interval-milliseconds", "50", "--max-request-bytes", "65536",
        ) as serving:  # fmt: skip
            running = GrpcServing(serving, grpc_port, candidate)
            yield running
            running.channel.close()
            assert serving.stop() == 0, serving.output()


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> Callable[[np.ndarray], np.ndarray]:
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x})[0]


def inputs(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 16)).astype(np.float32)


def raw_input(x: np.ndarray, datatype: str = "FP32") -> triton.InferInput:
    tensor = triton.InferInput("input", list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    return tensor


def typed_request(x: np.ndarray, **fields: object) -> pb.ModelInferRequest:
    """A ModelInferRequest with its input as typed `fp32_contents`."""
    request = pb.ModelInferRequest(**{"model_name": "tiny", **fields})
    tensor = request.inputs.add(name="input", datatype="FP32", shape=x.shape)
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request


def test_liveness_readiness_and_metadata_are_rests(served: GrpcServing) -> None:
    client = served.client
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
    rest = triton_http.InferenceServerClient(f"127.0.0.1:{served.serving.port}")
    server = client.get_server_metadata(as_json=True)
    assert server == {k: v for k, v in rest.get_server_metadata().items()}
    model = client.get_model_metadata("tiny", as_json=True)
    rest_model = rest.get_model_metadata("tiny")
    # JSON of a protobuf message writes int64 as strings
    for tensors in ("inputs", "outputs"):
        for tensor in model[tensors]:
            tensor["shape"] = [int(d) for d in tensor["shape"]]
    assert {k: model[k] for k in ("name", "versions", "inputs", "outputs")} == {
        k: rest_model[k] for k in ("name", "versions", "inputs", "outputs")
    }
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
    for call in (
        lambda: client.is_model_ready("tiny", "2"),
        lambda: client.get_model_metadata("other"),
    ):
        with pytest.raises(InferenceServerException) as refused:
            call()
        assert refused.value.status() == "StatusCode.NOT_FOUND"
        assert "not served" in refused.value.message() or "no version" in refused.value.message()


def test_the_model_metadata_names_the_engines_platform_as_rest_does(served: GrpcServing) -> None:
    model = served.client.get_model_metadata("tiny", as_json=True)
    rest = triton_http.InferenceServerClient(f"127.0.0.1:{served.serving.port}")
    assert model.get("platform") == rest.get_model_metadata("tiny")["platform"]
    assert model.get("platform") == "OnnxRuntimeEngine"


@pytest.mark.parametrize("rows", [1, 4])
def test_fp32_with_raw_contents_equals_onnxruntime_and_rest(
    served: GrpcServing, reference: Callable[[np.ndarray], np.ndarray], rows: int
) -> None:
    x = inputs(rows, seed=rows)
    result = served.client.infer("tiny", [raw_input(x)], request_id=f"grpc-{rows}")
    response = result.get_response()
    assert response.id == f"grpc-{rows}" and response.model_name == "tiny"
    assert len(response.raw_output_contents) == 1  # raw by default, as Triton answers
    got = result.as_numpy("logits")
    assert got.shape == (rows, 10)
    np.testing.assert_allclose(got, reference(x), rtol=1e-5, atol=1e-6)
    rest = triton_http.InferenceServerClient(f"127.0.0.1:{served.serving.port}")
    tensor = triton_http.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(got, rest.infer("tiny", [tensor]).as_numpy("logits"))


def test_typed_input_contents_and_typed_outputs_when_asked(
    served: GrpcServing, reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    x = inputs(3, seed=30)
    answer = served.stub.ModelInfer(typed_request(x, id="typed"), timeout=10)
    assert answer.id == "typed" and len(answer.raw_output_contents) == 1
    raw = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(3, 10)
    np.testing.assert_allclose(raw, reference(x), rtol=1e-5, atol=1e-6)

    asked = typed_request(x)
    asked.parameters["binary_data_output"].bool_param = False
    typed = served.stub.ModelInfer(asked, timeout=10)
    assert not typed.raw_output_contents
    [output] = typed.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("logits", "FP32", [3, 10])
    np.testing.assert_array_equal(np.array(output.contents.fp32_contents, np.float32), raw.ravel())

    per_output = typed_request(x)
    per_output.outputs.add(name="logits").parameters["binary_data"].bool_param = False
    assert not served.stub.ModelInfer(per_output, timeout=10).raw_output_contents


def bad_requests() -> list[tuple[str, pb.ModelInferRequest, grpc.StatusCode, str]]:
    x = inputs(2, seed=1)
    cases = []

    def case(name: str, code: grpc.StatusCode, message: str, **fields: object):
        request = typed_request(x, **fields)
        cases.append((name, request, code, message))
        return request

    case("unknown model", grpc.StatusCode.NOT_FOUND, "not served", model_name="other")
    case("unknown version", grpc.StatusCode.NOT_FOUND, "no version", model_version="7")
    shape = case("wrong shape", grpc.StatusCode.INVALID_ARGUMENT, "the model expects")
    del shape.inputs[0].shape[:]
    shape.inputs[0].shape.extend([4, 8])
    dtype = case("wrong datatype", grpc.StatusCode.INVALID_ARGUMENT, "expects FP32")
    dtype.inputs[0].datatype = "FP64"
    dtype.inputs[0].contents.ClearField("fp32_contents")
    dtype.inputs[0].contents.fp64_contents.extend(x.ravel().tolist())
    field = case("typed in another field", grpc.StatusCode.INVALID_ARGUMENT, "fp32_contents")
    field.inputs[0].contents.int_contents.extend([1] * 32)
    count = case("too few values", grpc.StatusCode.INVALID_ARGUMENT, "holds 31 values")
    del count.inputs[0].contents.fp32_contents[-1]
    raw = case("raw of the wrong size", grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents")
    raw.inputs[0].ClearField("contents")
    raw.raw_input_contents.append(x.tobytes()[:-4])
    both = case("raw and typed", grpc.StatusCode.INVALID_ARGUMENT, "beside raw_input_contents")
    both.raw_input_contents.append(x.tobytes())
    ranged = case("INT8 out of range", grpc.StatusCode.INVALID_ARGUMENT, "out of the range")
    ranged.inputs[0].datatype = "INT8"
    ranged.inputs[0].contents.ClearField("fp32_contents")
    ranged.inputs[0].contents.int_contents.extend([300] * 32)
    timeout = case("timeout of another type", grpc.StatusCode.INVALID_ARGUMENT, "timeout")
    timeout.parameters["timeout"].string_param = "soon"
    large = typed_request(x)  # over the serving's 64 KiB limit, under gRPC's own (twice it)
    large.inputs[0].ClearField("contents")
    large.raw_input_contents.append(b"\0" * 70_000)
    cases.append((
        "over the request limit", large, grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"the request message ({large.ByteSize()} bytes) is over the limit of 65536 bytes",
    ))  # fmt: skip
    mixed = case("raw and typed outputs", grpc.StatusCode.INVALID_ARGUMENT, "at once")
    mixed.outputs.add(name="logits").parameters["binary_data"].bool_param = True
    mixed.outputs.add(name="logits").parameters["binary_data"].bool_param = False
    return cases


def test_bad_input_gets_its_status_and_a_message_and_spares_concurrent_requests(
    served: GrpcServing, reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    cases = bad_requests()
    good_per_thread = 40

    def good(seed: int) -> int:
        client = triton.InferenceServerClient(served.address)
        for i in range(good_per_thread):
            x = inputs(1 + i % 3, seed * 1000 + i)
            got = client.infer("tiny", [raw_input(x)]).as_numpy("logits")
            np.testing.assert_allclose(got, reference(x), rtol=1e-5, atol=1e-6)
        return good_per_thread

    with ThreadPoolExecutor(4) as pool:
        answered = [pool.submit(good, seed) for seed in range(3)]
        for _ in range(3):
            for name, request, code, message in cases:
                with pytest.raises(grpc.RpcError) as refused:
                    served.stub.ModelInfer(request, timeout=10)
                assert refused.value.code() == code, name
                assert message in refused.value.details(), (name, refused.value.details())
        assert sum(f.result(timeout=60) for f in answered) == 3 * good_per_thread


def test_grpc_answers_count_in_the_same_series_as_rests(served: GrpcServing) -> None:
    serving = served.serving
    before = {c: serving.metric("kubeinfer_requests_total", code=c) for c in ("200", "400", "404")}
    durations = serving.metric("kubeinfer_request_duration_seconds_count")
    x = inputs(2, seed=5)
    for _ in range(5):
        served.client.infer("tiny", [raw_input(x)])
    for bad in (raw_input(x[:, :8].copy()),):
        with pytest.raises(InferenceServerException):
            served.client.infer("tiny", [bad])
    with pytest.raises(InferenceServerException):
        served.client.infer("other", [raw_input(x)])
    status, _, _ = serving.request(
        "POST", serving.infer_path, json.dumps({"inputs": [{
            "name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}).encode()
    )  # fmt: skip
    assert status == 200
    after = {c: serving.metric("kubeinfer_requests_total", code=c) for c in ("200", "400", "404")}
    assert after["200"] - before["200"] == 5 + 1
    assert after["400"] - before["400"] == 1
    assert after["404"] - before["404"] == 1
    # every answer the data plane gave (a 404 refused at admission too) has its duration
    assert serving.metric("kubeinfer_request_duration_seconds_count") - durations == 5 + 1 + 1 + 1


def mirrored(serving: ServeProcess, role: str, outcome: str = "compared") -> float:
    return sum(
        value
        for (name, labels), value in serving.metrics().items()
        if name == "kubeinfer_shadow_requests_total"
        and dict(labels).get("role") == role
        and dict(labels).get("outcome") == outcome
    )


def mirrors_settled(serving: ServeProcess) -> bool:
    """Both mirrors have an outcome (compared, dropped, failed, timed out) for every
    answered request they took: nothing of theirs is still in flight."""
    quality = json.loads(serving.request("GET", "/v2/quality")[2])
    shadow = json.loads(serving.request("GET", "/v2/shadow")[2])
    taken = quality["answered"]
    return sum(quality["requests"].values()) == sum(shadow["requests"].values()) == taken


def slice_rows(serving: ServeProcess, value: str) -> float:
    return sum(
        v
        for (name, labels), v in serving.metrics().items()
        if name == "kubeinfer_shadow_slice_top1_rows_total" and dict(labels).get("slice") == value
    )


def test_answered_grpc_requests_are_offered_to_the_mirrors(served: GrpcServing) -> None:
    serving, candidate = served.serving, served.candidate

    def mirroring() -> bool:
        served.client.infer("tiny", [raw_input(inputs(1, seed=0))])  # the target read
        return bool(mirrored(serving, "shadow") and mirrored(serving, "quality"))

    wait_for(mirroring, what="both mirrors comparing")
    wait_for(lambda: mirrors_settled(serving), what="an outcome for every mirrored request")
    shadow = mirrored(serving, "shadow")
    sliced, at_candidate = (
        slice_rows(serving, "acme"),
        candidate.metric("kubeinfer_requests_total", code="200"),
    )
    count = 12
    for i in range(count):
        served.client.infer(
            "tiny", [raw_input(inputs(2, seed=100 + i))], headers={SLICE_HEADER: "acme"}
        )
    with pytest.raises(InferenceServerException):  # refused: never mirrored
        served.client.infer("tiny", [raw_input(inputs(2, seed=1)[:, :8].copy())])
    wait_for(
        lambda: (
            mirrored(serving, "shadow") - shadow >= count
            and slice_rows(serving, "acme") - sliced >= 2 * count
        ),
        what=f"{count} requests compared by both mirrors",
    )
    assert mirrored(serving, "shadow") - shadow == count
    # the quality watch's own tallies: only these requests carry the slice (two rows each);
    # its request counter may still be taking earlier tests' samples, so it is not compared
    assert slice_rows(serving, "acme") - sliced == 2 * count  # two rows per request
    # both mirrors sent them to the candidate (the quality watch gathers rows into fewer
    # requests): at least the shadow's one request each
    assert candidate.metric("kubeinfer_requests_total", code="200") - at_candidate >= count
