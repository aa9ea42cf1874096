"""`kubeinfer activator` as a real process on loopback ports (issue 44, scale to zero), in
front of a real `kubeinfer serve` of the tiny demo MLP that is started only once the
activator holds requests for it; driven with tritonclient's asyncio clients (HTTP and gRPC)
and plain HTTP.

Covers:
- 100 concurrent HTTP requests (half sent to the route's Service name, half routed by the
  model their path names) and 4 gRPC calls (routed by the model their message names) held
  while the route has no backend, /v2/activator and /metrics showing them held; the
  model's process then started on the route's ports: every one answered, each with what
  ONNX Runtime computes for its own input, all counted forwarded;
- with --max-held-requests 2, a third request refused at once with 503, Retry-After and a
  JSON error before its body was sent, while the two held are answered once the model
  serves;
- a request held past --hold-timeout-seconds: 503 with Retry-After; a request for a model
  no route lists: 404 with a JSON error;
- what a client whose request is held sees when the activator is stopped: on SIGTERM, a 503
  with Retry-After and `Connection: close` once --drain-grace-period-seconds has passed,
  the process exiting 0 and its port then refusing connections; on SIGKILL, its
  connection closed with no answer at all (http.client's RemoteDisconnected: the
  request may or may not have been forwarded, so only an idempotent one can be retried);
- an invalid flag: exit 2, naming the flag and its variable.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc.aio as triton_grpc
import tritonclient.http.aio as triton_http
from ports import free_port
from processes import stop, wait_ready
from prometheus_client.parser import text_string_to_metric_families
from serve_process import LoopbackHttp, ServeProcess, head, read_response
from waiting import eventually, wait_for

pytestmark = pytest.mark.slow

HELD_FOR_LONG = "600"
"""A hold timeout no test reaches: what is held is answered by the backend, or the test's
own stop."""


class ActivatorProcess(LoopbackHttp):
    """One `kubeinfer activator --routes-file FILE FLAGS...` process on loopback, started
    and ready (its table read); with `grpc`, listening for gRPC too."""

    def __init__(self, routes: Path, *flags: str, grpc: bool = False) -> None:
        self.port = free_port()
        self.grpc_port = free_port() if grpc else None
        self._log = tempfile.TemporaryFile()
        grpc_flags = ["--grpc-port", str(self.grpc_port)] if grpc else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kubeinfer.cli", "activator", "--routes-file", str(routes),
             "--host", "127.0.0.1", "--port", str(self.port), *grpc_flags, *flags],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_ready(
            lambda: self.request("GET", "/v2/health/ready", timeout=2)[0] == 200,
            self.process, f"kubeinfer activator on port {self.port}", 60, self.output,
        )  # fmt: skip

    def status(self) -> dict[str, Any]:
        """`GET /v2/activator`: each route's held requests and its backend's readiness."""
        _, _, body = self.request("GET", "/v2/activator")
        return json.loads(body)

    def held(self) -> int:
        return sum(route["held"] for route in self.status()["routes"])

    def metric(self, name: str, **labels: str) -> float | None:
        """The route's sample `name` at `labels` in a scrape (None: absent)."""
        _, _, body = self.request("GET", "/metrics")
        wanted = {"namespace": "demo", "service": "tiny", **labels}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == name and sample.labels == wanted:
                    return float(sample.value)
        return None

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def __enter__(self) -> ActivatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self.process)
        self._log.close()


class Backend:
    """The ports the model's process will listen on, reserved before it starts, and the
    route table naming them."""

    def __init__(self, folder: Path) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.routes = folder / "routes.json"
        route = {"namespace": "demo", "service": "tiny", "models": ["tiny"],
                 "backendHost": "127.0.0.1", "httpPort": self.http_port,
                 "grpcPort": self.grpc_port}  # fmt: skip
        self.routes.write_text(json.dumps({"routes": [route]}))

    def serve(self, model: Path) -> ServeProcess:
        """The model served on the reserved ports (blocks until it is ready)."""
        return ServeProcess(model, "tiny", "--grpc-port", str(self.grpc_port), port=self.http_port)


@pytest.fixture
def backend(tmp_path: Path) -> Backend:
    return Backend(tmp_path)


@pytest.fixture
def served_later() -> Iterator[list[ServeProcess]]:
    """Where a test puts the model's process once it starts it; each is stopped at the end,
    whatever happened."""
    started: list[ServeProcess] = []
    yield started
    for process in started:
        process.__exit__()


@pytest.fixture(scope="module")
def reference(tiny_model: Path):
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x})[0]


def features(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 16)).astype(np.float32)


def infer_body(seed: int) -> bytes:
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 16],
              "data": features(seed).ravel().tolist()}  # fmt: skip
    return json.dumps({"inputs": [tensor]}).encode()


async def serve_later(model: Path, backend: Backend, started: list[ServeProcess]) -> None:
    """Starts the model's process on a thread (the event loop, and the requests it holds,
    go on meanwhile)."""
    started.append(await asyncio.to_thread(backend.serve, model))


def http_call(client: triton_http.InferenceServerClient, seed: int, host: str | None) -> Any:
    tensor = triton_http.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(features(seed), binary_data=seed % 3 == 0)
    return client.infer("tiny", [tensor], headers={"Host": host} if host else None)


def grpc_call(client: triton_grpc.InferenceServerClient, seed: int) -> Any:
    tensor = triton_grpc.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(features(seed))
    return client.infer("tiny", [tensor], client_timeout=120)


async def test_requests_held_until_the_model_serves_are_all_answered_as_the_model_answers(
    tiny_model: Path, backend: Backend, served_later: list[ServeProcess], reference
) -> None:
    flags = ("--hold-timeout-seconds", HELD_FOR_LONG)
    with ActivatorProcess(backend.routes, *flags, grpc=True) as activator:
        # Past the model's start on a busy machine (aiohttp's total for a request).
        patience = {"conn_limit": 200, "conn_timeout": 300.0}
        rest = triton_http.InferenceServerClient(activator.address, **patience)
        grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{activator.grpc_port}")
        try:
            calls = [
                asyncio.create_task(http_call(rest, seed, "tiny.demo" if seed % 2 else None))
                for seed in range(100)
            ]
            calls += [asyncio.create_task(grpc_call(grpc, seed)) for seed in range(100, 104)]
            await eventually(lambda: activator.held() == 104, what=lambda: str(activator.status()))
            (route,) = activator.status()["routes"]
            assert (route["backendReady"], route["oldestHeldSeconds"] > 0) == (False, True)
            assert activator.metric("kubeinfer_activator_held_requests") == 104
            await serve_later(tiny_model, backend, served_later)
            answers = await asyncio.gather(*calls)
        finally:
            await rest.close()
            await grpc.close()
        for seed, answer in enumerate(answers):
            np.testing.assert_allclose(
                answer.as_numpy("logits"), reference(features(seed)), rtol=1e-5, atol=1e-6
            )
        assert activator.held() == 0
        assert activator.metric("kubeinfer_activator_requests_total", outcome="forwarded") == 104
        assert activator.metric("kubeinfer_activator_hold_seconds_count") == 104


async def test_past_the_bound_a_request_is_refused_at_once_while_the_held_are_answered_later(
    tiny_model: Path, backend: Backend, served_later: list[ServeProcess]
) -> None:
    flags = ("--max-held-requests", "2", "--hold-timeout-seconds", HELD_FOR_LONG)
    with ActivatorProcess(backend.routes, *flags) as activator:
        held = [
            asyncio.create_task(asyncio.to_thread(
                activator.request, "POST", "/v2/models/tiny/infer", infer_body(seed), timeout=120
            ))
            for seed in range(2)
        ]  # fmt: skip
        await eventually(lambda: activator.held() == 2, what="2 requests held")
        with activator.socket(timeout=30) as sock:
            sock.sendall(head("/v2/models/tiny/infer", activator.port, 40_000))  # no body yet
            status, headers, body = read_response(sock)
        assert status == 503, body
        assert headers["retry-after"] == "1"
        assert headers["content-type"] == "application/json"
        assert "holds 2 requests for demo/tiny already" in json.loads(body)["error"]
        assert activator.metric("kubeinfer_activator_requests_total", outcome="refused_full") == 1
        await serve_later(tiny_model, backend, served_later)
        for answered in await asyncio.gather(*held):
            assert answered[0] == 200, answered


def test_a_request_held_past_its_hold_timeout_gets_503_and_one_for_no_route_404(
    backend: Backend,
) -> None:
    with ActivatorProcess(backend.routes, "--hold-timeout-seconds", "1") as activator:
        started = time.monotonic()
        status, headers, body = activator.request("POST", "/v2/models/tiny/infer", infer_body(0))
        assert time.monotonic() - started >= 1
        assert (status, headers["Retry-After"]) == (503, "1"), body
        assert "within the activator's hold timeout (1 s)" in json.loads(body)["error"]
        outcome = "refused_hold_timeout"
        assert activator.metric("kubeinfer_activator_requests_total", outcome=outcome) == 1
        status, headers, body = activator.request("POST", "/v2/models/resnet/infer", b"{}")
        assert (status, headers["Content-Type"]) == (404, "application/json")
        assert json.loads(body) == {
            "error": f'the activator has no route for host "127.0.0.1:{activator.port}" '
            'or model "resnet"'
        }


def holding(activator: ActivatorProcess, count: int) -> list[http.client.HTTPConnection]:
    """`count` infer requests sent on connections of their own, once all are held."""
    connections = [activator.connect(timeout=60) for _ in range(count)]
    for seed, connection in enumerate(connections):
        connection.request("POST", "/v2/models/tiny/infer", infer_body(seed))
    wait_for(lambda: activator.held() == count, what=f"{count} requests held")
    return connections


def test_a_sigterm_answers_what_it_holds_503_once_its_grace_passed(backend: Backend) -> None:
    flags = ("--hold-timeout-seconds", HELD_FOR_LONG, "--drain-grace-period-seconds", "1")
    with ActivatorProcess(backend.routes, *flags) as activator:
        connections = holding(activator, 3)
        activator.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        for connection in connections:
            response = connection.getresponse()
            assert time.monotonic() - signalled >= 1, "held until the grace passed"
            assert response.status == 503
            assert response.getheader("Retry-After") == "1"
            assert response.getheader("Connection") == "close"
            error = json.loads(response.read())["error"]
            assert "the activator stopped before a pod of demo/tiny was ready" in error
        assert activator.process.wait(30) == 0, activator.output()
        with pytest.raises(ConnectionRefusedError):
            activator.socket(timeout=5)


def test_a_sigkill_closes_what_it_holds_without_an_answer(backend: Backend) -> None:
    with ActivatorProcess(backend.routes, "--hold-timeout-seconds", HELD_FOR_LONG) as activator:
        connections = holding(activator, 3)
        activator.process.kill()
        for connection in connections:
            # The kernel closes the killed process's sockets: the client reads the end of
            # the connection where its answer should be (reset, had it sent more).
            with pytest.raises(http.client.RemoteDisconnected):
                connection.getresponse()
        assert activator.process.wait(30) == -signal.SIGKILL


def test_an_invalid_flag_exits_2_naming_it_and_its_variable(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", "activator", "--routes-file",
         str(tmp_path / "routes.json"), "--wake-url", "https://example.invalid/wake",
         "--max-held-requests", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--wake-url (KUBEINFER_ACTIVATOR_WAKE_URL)" in done.stderr
    assert "must be an http:// URL" in done.stderr
    assert "--max-held-requests (KUBEINFER_ACTIVATOR_MAX_HELD_REQUESTS)" in done.stderr
