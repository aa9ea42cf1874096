"""`kubeinfer serve` as a real process on a loopback port, driven with `tritonclient.http`.

Covers: outputs over the JSON and the binary tensor paths (each direction) equal ONNX
Runtime run in-process on the same inputs, for requests of 1 and of several rows; health,
readiness and metadata routes (also under /versions/{v}); unknown model 404, bad inputs
400 and an oversized body 413 (also when it only inflates past the limit), each with a
JSON error; gzip and deflate request bodies; /metrics after concurrent load
shows batches of more than one request and counts every answer by code. (SIGTERM with
requests queued: test_sigterm_drain.py, where a gate rather than the clock holds them.)
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from serve_process import ServeProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[ServeProcess]:
    with ServeProcess(tiny_model, "tiny", "--max-request-bytes", "65536") as running:
        yield running
        assert running.stop() == 0


@pytest.fixture(scope="module")
def reference(tiny_model: Path):
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x})[0]


def inputs(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("binary_in", [False, True], ids=["json-in", "binary-in"])
@pytest.mark.parametrize("binary_out", [False, True], ids=["json-out", "binary-out"])
def test_outputs_equal_onnxruntime(server, reference, rows, binary_in, binary_out) -> None:
    client = triton.InferenceServerClient(server.address)
    x = inputs(rows, seed=rows * 10 + binary_in * 2 + binary_out)
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary_in)
    result = client.infer(
        "tiny",
        [tensor],
        outputs=[triton.InferRequestedOutput("logits", binary_data=binary_out)],
        request_id="req-1",
    )
    assert result.get_response()["id"] == "req-1"
    np.testing.assert_allclose(result.as_numpy("logits"), reference(x), rtol=1e-5, atol=1e-6)


def test_without_requested_outputs_all_come_back_binary(server, reference) -> None:
    client = triton.InferenceServerClient(server.address)
    x = inputs(3, seed=7)
    tensor = triton.InferInput("input", [3, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("tiny", [tensor], model_version="1")
    assert result.get_output("logits")["parameters"]["binary_data_size"] == 3 * 10 * 4
    np.testing.assert_allclose(result.as_numpy("logits"), reference(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_responses(server, reference, algorithm) -> None:
    client = triton.InferenceServerClient(server.address)
    x = inputs(2, seed=11)
    tensor = triton.InferInput("input", [2, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("tiny", [tensor], request_compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy("logits"), reference(x), rtol=1e-5, atol=1e-6)


def test_a_gzip_bomb_is_refused_with_413(server) -> None:
    bomb = gzip.compress(b" " * 1_000_000)  # 1 MB of JSON whitespace in ~1 KB
    status, _, payload = server.request(
        "POST", "/v2/models/tiny/infer", bomb, {"Content-Encoding": "gzip"}
    )
    assert status == 413 and "inflates past the limit" in json.loads(payload)["error"]


def test_health_and_metadata(server) -> None:
    client = triton.InferenceServerClient(server.address)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
    metadata = client.get_model_metadata("tiny")
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
    assert metadata["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    extensions = client.get_server_metadata()["extensions"]
    assert extensions == ["binary_tensor_data", "system_shared_memory"]
    assert not client.is_model_ready("other")
    status, _, body = server.request("GET", "/v2/models/tiny/versions/9")
    assert status == 404 and "version" in json.loads(body)["error"]


def _infer_body(**input_fields) -> bytes:
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}
    return json.dumps({"inputs": [{**tensor, **input_fields}]}).encode()


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v2/models/other/infer", _infer_body(), 404, "not served"),
        ("/v2/models/tiny/versions/2/infer", _infer_body(), 404, "no version"),
        ("/v2/models/tiny/infer", _infer_body(name="x"), 400, "unknown input"),
        ("/v2/models/tiny/infer", _infer_body(shape=[1, 15], data=[0.5] * 15), 400, "shape"),
        ("/v2/models/tiny/infer", _infer_body(datatype="FP64"), 400, "datatype"),
        ("/v2/models/tiny/infer", _infer_body(data=[0.5] * 15), 400, "elements"),
        ("/v2/models/tiny/infer", b'{"inputs": [', 400, "malformed JSON"),
        ("/v2/models/tiny/infer", b"x" * 70_000, 413, "limit"),
    ],
)
def test_bad_requests_get_a_json_error(server, path, body, status, message) -> None:
    got, headers, payload = server.request("POST", path, body)
    assert got == status
    assert headers["Content-Type"].startswith("application/json")
    assert message in json.loads(payload)["error"]


def test_a_bad_binary_header_is_a_400(server) -> None:
    got, _, payload = server.request(
        "POST", "/v2/models/tiny/infer", _infer_body(), {"Inference-Header-Content-Length": "x"}
    )
    assert got == 400 and "Inference-Header-Content-Length" in json.loads(payload)["error"]


def test_concurrent_load_is_batched_and_counted(server, reference) -> None:
    labels = (("model", "tiny"), ("version", "1"))
    before = server.metrics()
    clients = 32
    per_client = 15

    def client_loop(seed: int) -> int:
        client = triton.InferenceServerClient(server.address)
        for i in range(per_client):
            x = inputs(1 + (i % 2), seed * 100 + i)
            tensor = triton.InferInput("input", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer("tiny", [tensor])
            got = result.as_numpy("logits")
            np.testing.assert_allclose(got, reference(x), rtol=1e-5, atol=1e-6)
        return per_client

    with ThreadPoolExecutor(clients) as pool:
        sent = sum(pool.map(client_loop, range(clients)))
    after = server.metrics()

    def delta(name: str, extra: tuple[tuple[str, str], ...] = ()) -> float:
        key = (name, tuple(sorted(labels + extra)))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("kubeinfer_requests_total", (("code", "200"),)) == sent
    batches = delta("kubeinfer_batch_size_count")
    rows = delta("kubeinfer_batch_size_sum")
    assert rows == sum(1 + (i % 2) for i in range(per_client)) * clients
    assert batches < sent  # requests shared batches
    assert rows / batches > 1.5, f"mean batch {rows / batches:.2f} rows"
    # More than one request per batch shows in the histogram's buckets, too.
    assert delta("kubeinfer_batch_size_bucket", (("le", "2.0"),)) < batches
    assert delta("kubeinfer_queue_duration_seconds_count") == sent
    assert delta("kubeinfer_compute_duration_seconds_count") == batches
    assert delta("kubeinfer_request_duration_seconds_count") == sent
    assert ("kubeinfer_queue_depth", labels) in after
    assert after[("kubeinfer_inflight_batches", labels)] == 0


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_an_invalid_configuration_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "runtime.yaml"
    config.write_text(
        "modelName: Bad_Name\nengine: {onnxPath: /nope.onnx}\nbatching: {maxBatchSize: 0}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", "serve", "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "modelName" in done.stderr and "batching.maxBatchSize" in done.stderr
