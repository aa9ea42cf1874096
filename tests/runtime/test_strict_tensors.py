"""Strict tensors and JSON errors everywhere, against a real `kubeinfer serve` process
(the spin model of `onnx_models`: an FP32 and an INT32 input).

Covers: `null`, strings and booleans in numeric tensors, fractional numbers and booleans
in integer tensors, values out of a datatype's range: each a 400 naming the value, where
numpy used to coerce them (NaN, 1.7 -> 1); nested data checked against the shape; shapes
of 65 dimensions and `[2^62, 2^62, 0]` with empty data (both were 500s), and a fuzz over
ranks 0-100 and extreme dimensions in JSON and binary requests: never a 5xx, always a
JSON error; requests the HTTP layer refuses (a garbage request line, a head past the read
buffer, a broken chunked body) answered 400 or 431 and the connection closed, the server
serving on; a request whose client disconnected while it was queued is never executed and
is counted as cancelled (stage `waiting`), not as a 200.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx_models import build_spin_model, expected_y
from serve_process import ServeProcess, head
from waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    model = build_spin_model(tmp_path_factory.mktemp("spin") / "spin.onnx")
    with ServeProcess(
        model, "spin", "--execution-slots", "1", "--intra-op-threads", "1",
        "--max-batch-size", "8",
    ) as running:  # fmt: skip
        yield running
        assert running.stop() == 0
        log = running.output()
        assert " ERROR " not in log and "Traceback" not in log, log


def request(x: list, ids: list, shape: list[int] | None = None, **fields) -> dict:
    rows = shape or [1, 4]
    return {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": rows, "data": x, **fields},
            {"name": "ids", "datatype": "INT32", "shape": [rows[0], 4], "data": ids},
        ]
    }


def test_a_valid_request_flat_and_nested(server: ServeProcess) -> None:
    x = np.array([[0.5, -1.0, 2.0, 3.25], [1.0, 2.0, 3.0, 4.0]], np.float32)
    ids = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    for form in (lambda a: a.ravel().tolist(), lambda a: a.tolist()):
        status, answer = server.infer(request(form(x), form(ids), [2, 4]))
        assert status == 200, answer
        got = np.array(answer["outputs"][0]["data"], np.float32).reshape(2, 4)
        np.testing.assert_array_equal(got, expected_y(x, ids))


@pytest.mark.parametrize(
    ("x", "ids", "message"),
    [
        ([0.5, None, 1.0, 2.0], [1, 2, 3, 4], "holds null"),
        ([0.5, "1.5", 1.0, 2.0], [1, 2, 3, 4], "holds a string ('1.5')"),
        ([0.5, True, 1.0, 2.0], [1, 2, 3, 4], "holds a boolean (True)"),
        ([0.5, 1e39, 1.0, 2.0], [1, 2, 3, 4], "out of FP32's range"),
        ([0.5, [1.0], 1.0, 2.0], [1, 2, 3, 4], "holds a list"),
        ([0.5, 1.0, 1.0, 2.0], [1, 1.7, 3, 4], "INT32 data takes integers only"),
        ([0.5, 1.0, 1.0, 2.0], [1, 2.0, 3, 4], "INT32 data takes integers only"),
        ([0.5, 1.0, 1.0, 2.0], [1, False, 3, 4], "holds a boolean"),
        ([0.5, 1.0, 1.0, 2.0], [1, 2**40, 3, 4], "out of bounds for int32"),
        ([[0.5, 1.0], [1.0, 2.0]], [1, 2, 3, 4], "nested data has 2 rows"),
    ],
)
def test_values_a_datatype_does_not_take_are_400(server: ServeProcess, x, ids, message) -> None:
    status, answer = server.infer(request(x, ids))
    assert status == 400, answer
    assert message in answer["error"]


@pytest.mark.parametrize(
    ("shape", "data"),
    [([1] * 65, [1.0]), ([2**62, 2**62, 0], []), ([2**63 - 1, 0], []), ([0] * 100, [])],
)
def test_shapes_numpy_cannot_hold_are_400_not_500(server: ServeProcess, shape, data) -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": shape}
    status, answer = server.infer({"inputs": [{**tensor, "data": data}]})
    assert status == 400, answer
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": 0}}]}).encode()
    status, headers, payload = server.request(
        "POST", server.infer_path, header, {"Inference-Header-Content-Length": str(len(header))}
    )
    assert status == 400 and headers["Content-Type"].startswith("application/json"), payload


DIMENSIONS = st.one_of(
    st.integers(0, 8),
    st.sampled_from([2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]),
)


class KeepAlive:
    """One reused connection (reopened when the server closes it)."""

    def __init__(self, server: ServeProcess) -> None:
        self.server = server
        self.connection = server.connect(timeout=10)

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        self.connection.request("POST", self.server.infer_path, body, headers)
        response = self.connection.getresponse()
        payload = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self.connection.close()
            self.connection = self.server.connect(timeout=10)
        return response.status, response.getheader("Content-Type", ""), payload


@pytest.fixture(scope="module")
def keep_alive(server: ServeProcess) -> Iterator[KeepAlive]:
    client = KeepAlive(server)
    yield client
    client.connection.close()


@settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    shape=st.lists(DIMENSIONS, max_size=100),
    data=st.lists(st.floats(-1, 1), max_size=6),
    name=st.sampled_from(["x", "ids", "other"]),
    datatype=st.sampled_from(["FP32", "INT32", "FP64", "BOOL"]),
    binary=st.booleans(),
)
def test_no_shape_is_a_500(keep_alive: KeepAlive, shape, data, name, datatype, binary) -> None:
    tensor = {"name": name, "datatype": datatype, "shape": shape}
    headers = {}
    if binary:
        blob = np.asarray(data, np.float32).tobytes()
        tensor["parameters"] = {"binary_data_size": len(blob)}
        header = json.dumps({"inputs": [tensor]}).encode()
        body = header + blob
        headers["Inference-Header-Content-Length"] = str(len(header))
    else:
        body = json.dumps({"inputs": [{**tensor, "data": data}]}).encode()
    status, content_type, payload = keep_alive.post(body, headers)
    assert 400 <= status < 500, (status, payload)
    assert content_type.startswith("application/json")
    assert isinstance(json.loads(payload)["error"], str)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE /\x01 HTTP/1.1\r\n\r\n", 400),
        (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", 431),
        (b"POST /v2/models/spin/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
         b"\r\n\r\nzz\r\n", 400),
    ],
)  # fmt: skip
def test_requests_that_are_not_http_get_a_4xx_and_a_close(
    server: ServeProcess, raw, status
) -> None:
    """Not HTTP, a head past the read buffer, a chunk size that is no number: refused by the
    HTTP layer, and the connection closed (the read below ends), the server serving on."""
    with server.socket(timeout=10) as sock:
        try:
            sock.sendall(raw)
        except BrokenPipeError:  # refused before all of the oversized head was sent
            pass
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_ = data.partition(b"\r\n\r\n")[0]  # the whole answer: then closed
    assert head_.split(b" ", 2)[1] == str(status).encode(), data[:200]
    assert server.request("GET", "/v2/health/live")[0] == 200


def test_a_request_whose_client_left_is_never_executed(server: ServeProcess) -> None:
    before = server.metrics()
    labels = (("model", "spin"), ("version", "1"))

    def delta(name: str, *extra: tuple[str, str]) -> float:
        key = (name, tuple(sorted(labels + extra)))
        return server.metrics().get(key, 0.0) - before.get(key, 0.0)

    spin = np.zeros((5, 4), np.int32)  # 5 rows: a worker thread's batch, not an inline one
    spin[0, 0] = 1_500_000  # about a second on the engine, many on a busy machine
    holder = server.connect(timeout=600)
    holder_request = request([0.0] * 20, spin.ravel().tolist(), [5, 4])
    holder_request["parameters"] = {"timeout": 600_000_000}  # microseconds: never its deadline
    holder.request("POST", server.infer_path, json.dumps(holder_request).encode())
    wait_for(lambda: server.metric("kubeinfer_inflight_batches") >= 1,
             within=60, what="the spinning request running", every=0.01)  # fmt: skip
    body = json.dumps(request([1.0] * 4, [1, 2, 3, 4])).encode()
    with server.socket() as leaving:
        leaving.sendall(head(server.infer_path, server.port, len(body)) + body)
        wait_for(lambda: server.metric("kubeinfer_queue_depth") >= 1,
                 within=60, what="the second request queued", every=0.005)  # fmt: skip
    wait_for(lambda: delta("kubeinfer_requests_cancelled_total", ("stage", "waiting")) >= 1,
             within=60, what="the departure noticed", every=0.005)  # fmt: skip
    assert server.metric("kubeinfer_inflight_batches") == 1  # noticed while still queued
    response = holder.getresponse()
    assert response.status == 200, response.read()
    response.read()
    holder.close()
    assert delta("kubeinfer_batch_size_count") == 1  # the second one never ran
    assert delta("kubeinfer_requests_total", ("code", "200")) == 1
    assert server.metric("kubeinfer_requests_in_progress") == 0


def test_everything_still_works_afterwards(server: ServeProcess) -> None:
    status, answer = server.infer(request([1.0, 2.0, 3.0, 4.0], [0, 0, 0, 1]))
    assert status == 200 and answer["outputs"][0]["data"] == [1.0, 2.0, 3.0, 5.0]


def test_http_client_sees_json_for_a_wrong_method(server: ServeProcess) -> None:
    status, headers, payload = server.request("DELETE", server.infer_path)
    assert status == 405 and headers["Content-Type"].startswith("application/json"), payload
    assert isinstance(json.loads(payload)["error"], str)
    assert isinstance(http.client.responses[status], str)


def test_model_file_is_real(tmp_path: Path) -> None:
    """The spin model runs as a model, not a stub: ONNX Runtime gives x + ids."""
    import onnxruntime as ort

    model = build_spin_model(tmp_path / "spin.onnx")
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = np.ones((2, 4), np.float32)
    ids = np.arange(8, dtype=np.int32).reshape(2, 4)
    np.testing.assert_array_equal(session.run(None, {"x": x, "ids": ids})[0], expected_y(x, ids))
