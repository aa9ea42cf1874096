"""`kubeinfer serve`: the model served by the Rust data plane (the extension
`kubeinfer_dataplane`, which `make test` builds into the venv), as a real process driven
with `tritonclient.http`.

Covers: the options the RuntimeConfig renders into (`rust_dataplane.server_options`: the
batching resolved against the engine); infer answers over JSON and the binary
tensor extension equal ONNX Runtime's own on the same inputs, for one row and several;
health, readiness and metadata; concurrent requests, batched together, each answered with
its own rows; an unknown model's 404; SIGTERM drains and exits 0. The model is the digits
MLP scikit-learn trains and skl2onnx exports (tests/models/sklearn_models.py). An engine
built by `kubeinfer build` answers its known answers in Python first: a sound one is made
ready, one whose slot errs (`--testing-faults perturb-batches=1`) stays live and never
ready, refusing inference with 503 saying which check failed; `/v2/known-answers`, which Python
answers for the server, runs the set again on demand.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.engines.base import TensorSpec
from kubeinfer.runtime.rust_dataplane import server_options
from models.sklearn_models import build_digits_mlp, digits
from serve_process import ServeProcess
from tritonclient.utils import InferenceServerException

NAME = "digits"


@pytest.fixture(scope="module")
def digits_mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = build_digits_mlp(tmp_path_factory.mktemp("rust-dataplane") / "digits.onnx")
    return path


@pytest.fixture(scope="module")
def server(digits_mlp: Path) -> Iterator[ServeProcess]:
    try:
        import kubeinfer_dataplane  # noqa: F401
    except ImportError as error:  # never a skip: `make test` builds it
        pytest.fail(f"the extension kubeinfer_dataplane is not built ({error}): make dataplane")
    flags = ("--max-batch-size", "8", "--max-queue-delay-microseconds", "5000",
             "--intra-op-threads", "1")  # fmt: skip
    with ServeProcess(digits_mlp, NAME, *flags) as running:
        yield running
        assert running.stop() == 0, running.output()


@pytest.fixture(scope="module")
def reference(digits_mlp: Path):
    session = ort.InferenceSession(str(digits_mlp), providers=["CPUExecutionProvider"])
    return lambda x: dict(zip(["label", "probabilities"], session.run(None, {"X": x}), strict=True))


def rows_of_digits(start: int, count: int) -> np.ndarray:
    return digits().validation_x[start : start + count]


def infer(server: ServeProcess, x: np.ndarray, binary: bool = False) -> dict[str, np.ndarray]:
    client = triton.InferenceServerClient(server.address, network_timeout=30)
    try:
        given = triton.InferInput("X", list(x.shape), "FP32")
        given.set_data_from_numpy(x, binary_data=binary)
        wanted = [triton.InferRequestedOutput(n, binary_data=binary)
                  for n in ("label", "probabilities")]  # fmt: skip
        result = client.infer(NAME, [given], outputs=wanted)
        return {n: result.as_numpy(n) for n in ("label", "probabilities")}
    finally:
        client.close()


def assert_same_answers(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    np.testing.assert_array_equal(got["label"], expected["label"])
    assert got["probabilities"].dtype == np.float32
    # Batched with others, the matrix products may round differently in the last bits.
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], rtol=1e-5,
                               atol=1e-6)  # fmt: skip


def test_the_runtime_config_renders_into_the_servers_options() -> None:
    config = RuntimeConfig.model_validate({
        "modelName": "m", "engine": {"onnxPath": "m.onnx"}, "httpPort": 9000,
        "batching": {"maxBatchSize": 16, "preferredBatchSizes": [4, 16]},
        "inputShapes": [{"name": "ids", "minShape": [1], "optShape": [8], "maxShape": [64],
                         "padValue": 0}],
        "maxRequestBytes": 4096, "drainGracePeriodSeconds": 5,
    })  # fmt: skip
    engine = SimpleNamespace(
        max_batch_size=8, default_execution_slots=2,
        inputs=(TensorSpec("ids", "INT64", (-1, -1), ("sequence",), (1,), (64,)),),
    )  # fmt: skip
    options = server_options(config, engine)  # type: ignore[arg-type]
    batching = options["batching"]
    assert batching["maxBatchSize"] == 8, "bounded by the engine's"
    assert batching["preferredBatchSizes"] == [4], "none above the largest batch"
    assert batching["executionSlots"] == 2, "the engine's default where the policy sets none"
    assert (batching["policy"], batching["shapeBatching"]) == ("Static", "EqualShapes")
    assert (batching["priorityLevels"], batching["defaultPriorityLevel"]) == (3, 1)
    assert options["padValues"] == {"ids": 0}
    assert (options["httpPort"], options["maxRequestBytes"]) == (9000, 4096)
    assert options["startReady"] is False, "ready only once the known answers allow it"
    assert options["configuredMaxBatchSize"] == 16 and "batchingProbe" not in options
    found = SimpleNamespace(batches=False, reason="its output has one row")
    probed = server_options(config, engine, found, 16)  # type: ignore[arg-type]
    assert probed["batchingProbe"] == {"batches": False, "reason": "its output has one row"}
    assert json.loads(json.dumps(options)) == options


@pytest.mark.slow
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_answers_what_onnxruntime_answers(
    server: ServeProcess, reference, rows: int, binary: bool
) -> None:
    x = rows_of_digits(3 * rows, rows)
    got = infer(server, x, binary)
    assert got["label"].shape == (rows,) and got["probabilities"].shape == (rows, 10)
    assert_same_answers(got, reference(x))


@pytest.mark.slow
def test_health_readiness_and_metadata_answer(server: ServeProcess) -> None:
    client = triton.InferenceServerClient(server.address)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(NAME)
        metadata = client.get_model_metadata(NAME)
        assert metadata["name"] == NAME
        assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 64]}]
        assert [o["name"] for o in metadata["outputs"]] == ["label", "probabilities"]
        with pytest.raises(InferenceServerException) as unknown:
            client.get_model_metadata("no-such-model")
        assert unknown.value.status() == "404"
    finally:
        client.close()


@pytest.mark.slow
def test_concurrent_requests_are_each_answered_with_their_own_rows(
    server: ServeProcess, reference
) -> None:
    requests = [(start, 1 + start % 3) for start in range(0, 96, 2)]

    def one(request: tuple[int, int]) -> tuple[int, int, dict[str, np.ndarray]]:
        start, count = request
        return start, count, infer(server, rows_of_digits(start, count), binary=start % 4 == 0)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, requests))
    assert len(answers) == len(requests)
    for start, count, got in answers:
        assert_same_answers(got, reference(rows_of_digits(start, count)))


@pytest.fixture(scope="module")
def built_engine(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The tiny MLP's int8 engine, built by `kubeinfer build` into a cache: its digest and
    the cache (its known-answer set recorded)."""
    root = tmp_path_factory.mktemp("rust-known-answers")
    model = build_tiny_mlp(root / "tiny.onnx")
    calibration = write_demo_samples(model, root / "calibration.npz", count=64)
    done = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", "build", "--model", str(model), "--precision",
         "int8", "--calibration", str(calibration), "--max-batch-size", "16", "--cache",
         str(root / "cache"), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["digest"], root / "cache"


def tiny_request(server: ServeProcess) -> int:
    x = np.random.default_rng(2).standard_normal((1, 16)).astype(np.float32)
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                        "data": x.ravel().tolist()}]}  # fmt: skip
    return server.request("POST", "/v2/models/tiny/infer", json.dumps(body).encode())[0]


@pytest.mark.slow
def test_readiness_follows_the_known_answer_check(built_engine: tuple[str, Path]) -> None:
    digest, cache = built_engine
    source = ("--engine", digest, "--cache", str(cache), "--max-batch-size", "16")
    with ServeProcess(None, "tiny", *source) as sound:
        assert sound.request("GET", "/v2/health/ready")[0] == 200
        assert tiny_request(sound) == 200
        assert "Known-answer check passed at start" in sound.output()
        status, _, body = sound.request("POST", "/v2/known-answers")
        verdicts = json.loads(body)
        assert status == 200 and verdicts["servingAllowed"] is True
        assert verdicts["latest"]["result"] == "passed", "run again once the server was idle"
        assert "Known-answer check passed on demand" in sound.output()
        assert sound.stop() == 0
    faulty = ("--testing-faults", "perturb-batches=1")
    with ServeProcess(None, "tiny", *source, *faulty, ready_path="/v2/health/live") as held:
        assert held.request("GET", "/v2/health/ready")[0] == 503
        assert held.request("GET", "/v2/models/tiny/ready")[0] == 503
        assert tiny_request(held) == 503
        _, _, refused = held.request("POST", "/v2/models/tiny/infer", b"{}")
        reason = json.loads(refused)["error"]
        assert reason.startswith("the engine failed its known-answer check: "), reason
        _, _, body = held.request("GET", "/v2/known-answers")
        assert json.loads(body)["servingAllowed"] is False
        assert held.process.poll() is None, "live: the evidence stays readable"
        assert "Known-answer check failed at start" in held.output()
        assert held.stop() == 0
