"""Thousands of malformed requests against an in-process server, then a valid one.

The Rust data plane (`rust_served`, the real ONNX Runtime engine on the tiny MLP) serves
on a loopback port from its own threads; hypothesis sends random bytes, random JSON,
valid requests with one field mutated, binary-extension bodies with lying sizes and
header lengths, bodies that claim a Content-Encoding they do not have, odd model paths.
Every answer must be a JSON `{"error": ...}` with a 4xx status (or a 200 when a mutation
happens to be valid), never a 5xx; afterwards a valid request must still succeed with
the right output.
"""

from __future__ import annotations

import http.client
import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubeinfer.contract.runtime_config import EngineSource, RuntimeConfig
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from rust_served import rust_served


class KeptConnection:
    """One keep-alive connection to the server, opened again when the server closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def reconnect(self) -> None:
        self.connection.close()
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        try:
            self.connection.request("POST", path, body, headers)
            response = self.connection.getresponse()
            payload = response.read()
        except (http.client.HTTPException, OSError, UnicodeError):
            self.reconnect()  # the server closed a connection it could not parse
            raise
        if response.getheader("Connection", "").lower() == "close":
            self.reconnect()
        return response.status, payload


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[KeptConnection]:
    config = RuntimeConfig(
        model_name="tiny",
        engine=EngineSource(onnx_path=str(tiny_model)),
        host="127.0.0.1",
        max_request_bytes=32 * 1024,
    )
    engine = OnnxRuntimeEngine(tiny_model, config.batching.max_batch_size, intra_op_threads=1)
    with rust_served(config, engine) as served:
        kept = KeptConnection(served.port)
        yield kept
        kept.connection.close()
    engine.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

VALID_INPUT = {"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.25] * 16}
FIELDS = ["name", "datatype", "shape", "data", "parameters"]


@st.composite
def mutated_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A valid request with one field somewhere replaced by an arbitrary JSON value."""
    tensor = dict(VALID_INPUT)
    request: dict = {"inputs": [tensor]}
    where = draw(st.sampled_from(["input", "request", "outputs", "drop"]))
    if where == "input":
        tensor[draw(st.sampled_from(FIELDS))] = draw(json_values)
    elif where == "request":
        request[draw(st.sampled_from(["inputs", "id", "parameters", "outputs"]))] = draw(
            json_values
        )
    elif where == "outputs":
        request["outputs"] = [{"name": draw(json_values), "parameters": draw(json_values)}]
    else:
        del tensor[draw(st.sampled_from(FIELDS[:4]))]
    return json.dumps(request).encode(), {}


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """The binary extension with a declared size, a trailing blob and a header length
    that may all disagree."""
    size = draw(st.one_of(st.integers(-5, 200), json_values))
    shape = draw(st.one_of(st.just([1, 16]), st.lists(st.integers(0, 20), max_size=3)))
    tensor = {"name": "input", "datatype": "FP32", "shape": shape}
    tensor["parameters"] = {"binary_data_size": size}
    header = json.dumps({"inputs": [tensor]}).encode()
    blob = draw(st.binary(max_size=200))
    length = draw(
        st.one_of(
            st.just(str(len(header))),
            st.integers(-10, len(header) + 300).map(str),
            st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=5),
        )
    )
    return header + blob, {"Inference-Header-Content-Length": length}


random_bodies = st.binary(max_size=300).map(lambda b: (b, {}))
encoded_bodies = st.tuples(
    st.binary(max_size=100), st.sampled_from(["gzip", "deflate", "br", "x-unknown"])
).map(lambda pair: (pair[0], {"Content-Encoding": pair[1]}))
random_json = json_values.map(lambda v: (json.dumps(v).encode(), {}))
oversized = st.integers(33 * 1024, 40 * 1024).map(lambda n: (b"{" * n, {}))
paths = st.one_of(
    st.just("/v2/models/tiny/infer"),
    st.just("/v2/models/tiny/versions/1/infer"),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12).map(
        lambda name: f"/v2/models/{name}/infer"
    ),
)


def _check(server: KeptConnection, path: str, body: bytes, headers: dict[str, str]) -> None:
    status, payload = server.post(path, body, headers)
    assert status < 500, (status, payload)
    if status != 200:
        assert status in (400, 404, 413), (status, payload)
        assert isinstance(json.loads(payload)["error"], str)


def _variants(body: bytes, rng: random.Random, count: int = 8) -> Iterator[bytes]:
    """Cheap relatives of a generated body: truncations and single-byte corruptions (a
    hypothesis draw costs ~10 ms on a busy 2-core machine; a request ~1 ms)."""
    for _ in range(count // 2):
        yield body[: rng.randrange(len(body) + 1)]
    for _ in range(count - count // 2):
        if not body:
            break
        position = rng.randrange(len(body))
        yield body[:position] + bytes([rng.randrange(256)]) + body[position + 1 :]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(
    path=paths,
    request=st.one_of(
        random_bodies, random_json, mutated_requests(), binary_requests(), encoded_bodies
    ),
    rng=st.randoms(use_true_random=False),
)
def test_malformed_requests_get_a_json_4xx(server, path, request, rng) -> None:
    """300 generated requests and 8 corrupted variants of each: 2,700 requests."""
    body, headers = request
    _check(server, path, body, headers)
    for variant in _variants(body, rng):
        _check(server, path, variant, headers)


@settings(max_examples=20, deadline=None, database=None)
@given(request=oversized)
def test_oversized_bodies_get_413(server, request) -> None:
    body, headers = request
    status, payload = server.post("/v2/models/tiny/infer", body, headers)
    assert status == 413 and "limit" in json.loads(payload)["error"]


def test_a_valid_request_succeeds_afterwards(server, tiny_model: Path) -> None:
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    body = json.dumps(
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [2, 16], "data": x.ravel().tolist()}
            ]
        }
    ).encode()
    status, payload = server.post("/v2/models/tiny/infer", body, {})
    assert status == 200, payload
    [output] = json.loads(payload)["outputs"]
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": x})[0]
    np.testing.assert_allclose(
        np.array(output["data"], np.float32).reshape(2, 10), expected, rtol=1e-5, atol=1e-6
    )
