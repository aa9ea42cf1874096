"""Text in, labels out, end to end: real `kubeinfer serve` processes of scikit-learn models
exported by skl2onnx, driven with tritonclient over HTTP and gRPC as a user would.

The served model is one graph: onnxruntime-extensions operators lower-case the raw text
and strip its punctuation, then a TF-IDF + logistic regression classifier answers the
topic as a string (`label`, BYTES) beside its `probabilities`. It mirrors every request
to a shadow candidate, the same pipeline trained on fewer sentences.

Covers: the metadata says BYTES; strings in and labels out through tritonclient HTTP
(binary and JSON, both ways) and gRPC (raw contents, and typed `bytes_contents` in and
out), each answer equal to scikit-learn's own pipeline on the normalised text; requests
of several rows from concurrent clients batched together, every row answered with its
own label; a string input that is not UTF-8 gets a 400 (INVALID_ARGUMENT over gRPC)
naming the element, and the server serves on; the shadow compares the labels by
equality, its top-1 rows and agreements exactly what the two pipelines' predictions
imply, tallied by topic name in /metrics; the digits MLP (no ZipMap) answers
scikit-learn's labels over both transports.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from models.sklearn_models import build_digits_mlp, build_text_classifier, digits, mixed_sentences
from ports import free_port
from serve_process import ServeProcess
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException
from waiting import wait_for

pytestmark = pytest.mark.slow
pytest.importorskip("onnxruntime_extensions")


def normalised(text: str) -> str:
    """What the graph's extensions operators make of a text."""
    return re.sub(r"[^a-z ]", "", text.lower())


class Served:
    def __init__(self, serving: ServeProcess, grpc_port: int, pipelines: dict[str, Any]):
        self.serving, self.pipelines = serving, pipelines
        self.http = triton_http.InferenceServerClient(f"127.0.0.1:{serving.port}")
        self.grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def expected(self, texts: list[str], which: str = "serving") -> list[str]:
        return list(self.pipelines[which].predict([normalised(t) for t in texts]))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("text-e2e")
    model, pipeline = build_text_classifier(root / "topics.onnx", extensions=True)
    small, small_pipeline = build_text_classifier(root / "small.onnx", extensions=True,
                                                  per_topic=3)  # fmt: skip
    with ServeProcess(small, "topics") as candidate:
        mirror = root / "mirror.json"
        mirror.write_text(json.dumps({"target": {
            "url": f"http://127.0.0.1:{candidate.port}", "modelName": "topics",
            "candidateVersion": "2", "trafficPercent": 100,
        }}))  # fmt: skip
        grpc_port = free_port()
        with ServeProcess(
            model, "topics", "--grpc-port", str(grpc_port), "--mirror-target-file", str(mirror),
            "--mirror-poll-interval-milliseconds", "50",
        ) as serving:  # fmt: skip
            running = Served(serving, grpc_port, {"serving": pipeline, "candidate": small_pipeline})
            yield running
            running.channel.close()
            assert serving.stop() == 0
            log = serving.output()
            assert " ERROR " not in log and "Traceback" not in log, log


def _texts(count: int, seed: int) -> list[str]:
    """Mixed-topic sentences, shouted and punctuated (the graph normalises them)."""
    return [f"{s.upper()}!?" if i % 2 else f"{s.capitalize()}." for i, s in
            enumerate(mixed_sentences(count, seed))]  # fmt: skip


def _column(texts: list[str]) -> np.ndarray:
    array = np.empty((len(texts), 1), dtype=object)
    array[:, 0] = [t.encode() for t in texts]
    return array


def _decoded(labels: np.ndarray) -> list[str]:
    return [e.decode() if isinstance(e, bytes) else str(e) for e in labels.ravel()]


def test_the_metadata_says_bytes(served: Served) -> None:
    metadata = served.http.get_model_metadata("topics")
    assert metadata["inputs"] == [{"name": "raw_text", "datatype": "BYTES", "shape": [-1, 1]}]
    assert {o["name"]: o["datatype"] for o in metadata["outputs"]} == {
        "label": "BYTES", "probabilities": "FP32"
    }  # fmt: skip


@pytest.mark.parametrize("binary", [True, False])
def test_strings_in_and_labels_out_over_http(served: Served, binary: bool) -> None:
    texts = _texts(5, seed=1)
    tensor = triton_http.InferInput("raw_text", [5, 1], "BYTES")
    tensor.set_data_from_numpy(_column(texts), binary_data=binary)
    outputs = [triton_http.InferRequestedOutput("label", binary_data=binary),
               triton_http.InferRequestedOutput("probabilities", binary_data=binary)]  # fmt: skip
    result = served.http.infer("topics", [tensor], outputs=outputs)
    assert _decoded(result.as_numpy("label")) == served.expected(texts)
    probabilities = served.pipelines["serving"].predict_proba([normalised(t) for t in texts])
    np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, atol=1e-5)


def test_strings_in_and_labels_out_over_grpc_raw_and_typed(served: Served) -> None:
    texts = _texts(4, seed=2)
    tensor = triton_grpc.InferInput("raw_text", [4, 1], "BYTES")
    tensor.set_data_from_numpy(_column(texts))
    result = served.grpc.infer("topics", [tensor])
    assert _decoded(result.as_numpy("label")) == served.expected(texts)
    request = pb.ModelInferRequest(model_name="topics")
    typed = request.inputs.add(name="raw_text", datatype="BYTES", shape=[4, 1])
    typed.contents.bytes_contents.extend(t.encode() for t in texts)
    request.parameters["binary_data_output"].bool_param = False
    response = served.stub.ModelInfer(request, timeout=30)
    assert not response.raw_output_contents
    [label] = [o for o in response.outputs if o.name == "label"]
    assert [e.decode() for e in label.contents.bytes_contents] == served.expected(texts)


def test_concurrent_clients_are_batched_and_each_row_gets_its_own_label(served: Served) -> None:
    def one(seed: int) -> tuple[list[str], list[str]]:
        texts = _texts(1 + seed % 3, seed=100 + seed)
        if seed % 2:
            tensor = triton_grpc.InferInput("raw_text", [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(_column(texts))
            labels = served.grpc.infer("topics", [tensor]).as_numpy("label")
        else:
            client = triton_http.InferenceServerClient(f"127.0.0.1:{served.serving.port}")
            tensor = triton_http.InferInput("raw_text", [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(_column(texts), binary_data=seed % 4 == 0)
            labels = client.infer("topics", [tensor]).as_numpy("label")
        return texts, _decoded(labels)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(48)))
    for texts, labels in answers:
        assert labels == served.expected(texts)


def test_a_string_that_is_not_utf8_is_refused_and_serving_goes_on(served: Served) -> None:
    element = b"caf\xe9"  # latin-1, not UTF-8
    raw = struct.pack("<I", len(element)) + element
    header = json.dumps({"inputs": [{
        "name": "raw_text", "datatype": "BYTES", "shape": [1, 1],
        "parameters": {"binary_data_size": len(raw)},
    }]}).encode()  # fmt: skip
    status, _, body = served.serving.request(
        "POST", served.serving.infer_path, header + raw,
        {"Inference-Header-Content-Length": str(len(header))},
    )  # fmt: skip
    assert status == 400 and "element 0 is not UTF-8 text" in json.loads(body)["error"]
    tensor = triton_grpc.InferInput("raw_text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[element]], dtype=object))
    with pytest.raises(InferenceServerException) as refused:
        served.grpc.infer("topics", [tensor])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "not UTF-8 text" in refused.value.message()
    texts = _texts(2, seed=3)
    tensor.set_data_from_numpy(_column(texts)[:1])
    assert _decoded(served.grpc.infer("topics", [tensor]).as_numpy("label")) == (
        served.expected(texts[:1])
    )


def test_the_shadow_compares_labels_by_equality(served: Served) -> None:
    before = _settled_shadow(served)
    texts = _texts(40, seed=7)
    for start in range(0, 40, 4):
        tensor = triton_http.InferInput("raw_text", [4, 1], "BYTES")
        tensor.set_data_from_numpy(_column(texts[start : start + 4]))
        served.http.infer("topics", [tensor])
    after = _wait_compared(served, before["requests"]["compared"] + 10)
    assert after["mismatches"] == before["mismatches"] == 0
    full, small = served.expected(texts), served.expected(texts, "candidate")
    agreeing = sum(a == b for a, b in zip(full, small, strict=True))
    assert 0 < agreeing < 40  # the candidate really differs on some sentences
    # the label and the probabilities' argmax: two top-1 positions per row
    assert after["top1"]["rows"] - before["top1"]["rows"] == 80
    assert after["top1"]["agreements"] - before["top1"]["agreements"] == 2 * agreeing
    by_topic = {
        s.labels["reference_class"]: s.value
        for s in _samples(served) if s.name == "kubeinfer_shadow_class_top1_rows_total"
    }  # fmt: skip
    assert {"sport", "weather", "cooking"} <= set(by_topic)


def _shadow(served: Served) -> dict:
    status, _, body = served.serving.request("GET", "/v2/shadow")
    assert status == 200
    return json.loads(body)


def _samples(served: Served) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    _, _, body = served.serving.request("GET", "/metrics")
    return [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]


def _settled_shadow(served: Served) -> dict:
    """/v2/shadow once every request answered so far has had its mirror outcome."""
    seen: list[tuple[float, dict]] = []

    def settled() -> dict | None:
        answered = sum(
            s.value for s in _samples(served)
            if s.name == "kubeinfer_requests_total" and s.labels.get("code") == "200"
        )  # fmt: skip
        status = _shadow(served)
        seen.append((answered, status))
        return status if sum(status["requests"].values()) >= answered else None

    return wait_for(settled, what=lambda: f"a mirror outcome per answer; saw {seen[-1]}")


def _wait_compared(served: Served, count: int) -> dict:
    seen: list[dict] = []

    def compared() -> dict | None:
        seen.append(status := _shadow(served))
        return status if status["requests"]["compared"] >= count else None

    return wait_for(compared, what=lambda: f"{count} compared; saw {seen[-1]}")


def test_the_digits_mlp_answers_scikit_learns_labels_over_both_transports(
    tmp_path: Path,
) -> None:
    path, classifier = build_digits_mlp(tmp_path / "digits.onnx")
    x = digits().validation_x[:24]
    expected = classifier.predict(x).tolist()
    grpc_port = free_port()
    with ServeProcess(path, "digits", "--grpc-port", str(grpc_port)) as serving:
        http_client = triton_http.InferenceServerClient(f"127.0.0.1:{serving.port}")
        tensor = triton_http.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=False)
        labels = http_client.infer("digits", [tensor]).as_numpy("label")
        assert labels.tolist() == expected
        grpc_client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        tensor = triton_grpc.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        assert grpc_client.infer("digits", [tensor]).as_numpy("label").tolist() == expected
        assert serving.stop() == 0
