"""No request is ever answered with another request's rows: real `kubeinfer serve --onnx`
processes driven with tritonclient over HTTP and gRPC, concurrent clients, each answer
compared with ONNX Runtime running that request alone (`models.tokenizer_models`).

Covers, as a user sees it (nothing here knows which data path serves):
- text classifiers with their tokenizer in the graph, served with maxBatchSize 8: a
  `BertTokenizer` one (one text per run: two texts are a sentence pair) and an
  `HfJsonTokenizer` one whose classifier attends to the padding (a text's answer depends
  on the texts beside it) are found not to batch at start and served one request per run,
  every concurrent request answered exactly as alone; an `HfJsonTokenizer` one that masks
  its padding batches, and is served batched, every answer as alone too;
- the start log, `/v2/batching`, the model's metadata and Triton model configuration say
  one request per run, why, and the maxBatchSize set aside; a request of two texts to such
  a model is refused with a clear 400 (INVALID_ARGUMENT);
- a text classifier whose logits stop following the batch past two rows (the masked one,
  cut to two rows) passes the probe, and a batch of three texts fails loudly: 500
  (INTERNAL) naming the model, the output and both counts, never a 200 with rows that are
  not the request's; counted in `/v2/batching`, the metrics and the log; concurrent
  one-text requests get their own answer or that error, and the server serves on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from models.tokenizer_models import (
    BERT_WORDS,
    build_bert_tokenizer_classifier,
    build_hf_json_classifier,
    classify_alone,
)
from ports import free_port
from serve_process import ServeProcess
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow
pytest.importorskip("onnxruntime_extensions")

CONFIGURED_MAX_BATCH_SIZE = 8
CONCURRENT_REQUESTS = 32


@dataclass
class Served:
    model: Path
    input_name: str
    process: ServeProcess
    grpc_port: int

    @property
    def name(self) -> str:
        return self.process.name

    def http(self) -> triton_http.InferenceServerClient:
        return triton_http.InferenceServerClient(self.process.address)

    def grpc(self) -> triton_grpc.InferenceServerClient:
        return triton_grpc.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")

    def batching(self) -> dict:
        status, _, body = self.process.request("GET", "/v2/batching")
        assert status == 200
        return json.loads(body)


def _serve(model: Path, name: str, input_name: str) -> Served:
    grpc_port = free_port()
    process = ServeProcess(
        model, name, "--grpc-port", str(grpc_port),
        "--max-batch-size", str(CONFIGURED_MAX_BATCH_SIZE),
        # Long enough for concurrent requests to share batches where the model batches.
        "--max-queue-delay-microseconds", "20000",
    )  # fmt: skip
    return Served(model, input_name, process, grpc_port)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    root = tmp_path_factory.mktemp("unbatchable")
    models = {
        "bert": (build_bert_tokenizer_classifier(root / "bert" / "model.onnx"), "text"),
        "unmasked": (build_hf_json_classifier(root / "unmasked" / "model.onnx", False), "str"),
        "masked": (build_hf_json_classifier(root / "masked" / "model.onnx", True), "str"),
        "capped": (build_hf_json_classifier(root / "capped" / "model.onnx", True, 2), "str"),
    }
    running: dict[str, Served] = {}
    try:
        for name, (path, input_name) in models.items():
            running[name] = _serve(path, name, input_name)
        yield running
    finally:
        for serving in running.values():
            serving.process.__exit__(None, None, None)


def _texts(count: int, seed: int) -> list[str]:
    """Sentences of 1 to 9 words of the BERT vocabulary, different lengths."""
    rng = np.random.default_rng(seed)
    words = [w for w in BERT_WORDS if not w.startswith(("[", "#"))]
    return [" ".join(rng.choice(words, size=1 + i % 9)) for i in range(count)]


def _text_tensor(module: type, name: str, texts: list[str]) -> object:
    tensor = module.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    return tensor


def _infer_text(served: Served, text: str, over_grpc: bool) -> np.ndarray:
    module = triton_grpc if over_grpc else triton_http
    client = served.grpc() if over_grpc else served.http()
    return client.infer(served.name, [_text_tensor(module, served.input_name, [text])]).as_numpy(
        "logits"
    )


@pytest.mark.parametrize("name", ["bert", "unmasked", "masked"])
def test_concurrent_text_requests_are_each_answered_as_onnx_runtime_answers_them_alone(
    served: dict[str, Served], name: str
) -> None:
    serving = served[name]
    texts = _texts(CONCURRENT_REQUESTS, seed=len(name))

    def one(index: int) -> tuple[str, np.ndarray]:
        return texts[index], _infer_text(serving, texts[index], over_grpc=index % 2 == 1)

    with ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        answers = list(pool.map(one, range(CONCURRENT_REQUESTS)))
    for text, logits in answers:
        alone = classify_alone(serving.model, {serving.input_name: np.array([text], object)})
        np.testing.assert_allclose(logits, alone["logits"], rtol=1e-5, atol=1e-5, err_msg=text)
    assert serving.process.metric("kubeinfer_requests_total", code="200") >= CONCURRENT_REQUESTS


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("bert", "output 'logits' has 1 rows for a run of 2 different rows"),
        ("unmasked", "output 'logits' of 2 different rows run together is not their outputs"),
    ],
)
def test_a_model_that_does_not_batch_is_served_one_request_per_run_and_says_why(
    served: dict[str, Served], name: str, why: str
) -> None:
    serving = served[name]
    log = serving.process.output()
    [line] = [line for line in log.splitlines() if "Serving one request per run" in line]
    assert why in line and f"maxBatchSize {CONFIGURED_MAX_BATCH_SIZE} set aside" in line
    status = serving.batching()
    assert status["modelBatches"] is False and why in status["modelBatchesReason"]
    assert status["maxBatchSize"] == 1
    assert status["configuredMaxBatchSize"] == CONFIGURED_MAX_BATCH_SIZE
    assert serving.http().get_model_config(name)["max_batch_size"] == 1
    assert serving.http().get_model_metadata(name)["parameters"]["max_batch_size"] == 1


def test_a_model_that_batches_is_served_batched(served: dict[str, Served]) -> None:
    status = served["masked"].batching()
    assert status["modelBatches"] is True and status["modelBatchesReason"] == ""
    assert status["maxBatchSize"] == status["configuredMaxBatchSize"] == CONFIGURED_MAX_BATCH_SIZE
    assert "Serving one request per run" not in served["masked"].process.output()


def test_two_texts_in_one_request_to_a_model_served_one_per_run_are_refused(
    served: dict[str, Served],
) -> None:
    serving = served["bert"]
    texts = _texts(2, seed=9)
    with pytest.raises(InferenceServerException) as over_http:
        serving.http().infer("bert", [_text_tensor(triton_http, "text", texts)])
    assert over_http.value.status() == "400"
    assert "this model takes at most 1" in over_http.value.message()
    with pytest.raises(InferenceServerException) as over_grpc:
        serving.grpc().infer("bert", [_text_tensor(triton_grpc, "text", texts)])
    assert over_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "at most 1" in over_grpc.value.message(), over_grpc.value.message()


MISMATCH = "model 'capped' gave output 'logits' 2 rows for a batch of 3 rows"


def test_a_batch_whose_outputs_do_not_hold_its_rows_fails_loudly_over_both_transports(
    served: dict[str, Served],
) -> None:
    serving = served["capped"]
    assert serving.batching()["modelBatches"] is True  # one and two texts line up
    before = serving.batching()["outputRowMismatches"]
    texts = _texts(3, seed=4)
    with pytest.raises(InferenceServerException) as over_http:
        serving.http().infer("capped", [_text_tensor(triton_http, "str", texts)])
    assert over_http.value.status() == "500" and MISMATCH in over_http.value.message()
    with pytest.raises(InferenceServerException) as over_grpc:
        serving.grpc().infer("capped", [_text_tensor(triton_grpc, "str", texts)])
    assert over_grpc.value.status() == "StatusCode.INTERNAL"
    assert MISMATCH in over_grpc.value.message()
    assert serving.batching()["outputRowMismatches"] == before + 2
    assert serving.process.metric("kubeinfer_batch_output_row_mismatches_total") >= 2
    assert "Failed a batch whose outputs do not hold its rows: " + MISMATCH in (
        serving.process.output()
    )
    alone = classify_alone(serving.model, {"str": np.array(texts[:1], object)})["logits"]
    np.testing.assert_allclose(_infer_text(serving, texts[0], over_grpc=False), alone, 1e-5, 1e-5)


def test_concurrent_requests_get_their_own_rows_or_the_batchs_error(
    served: dict[str, Served],
) -> None:
    serving = served["capped"]
    texts = _texts(CONCURRENT_REQUESTS, seed=5)

    def one(index: int) -> np.ndarray | InferenceServerException:
        try:
            return _infer_text(serving, texts[index], over_grpc=index % 2 == 1)
        except InferenceServerException as error:
            return error

    with ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        answers = list(pool.map(one, range(CONCURRENT_REQUESTS)))
    for text, answer in zip(texts, answers, strict=True):
        if isinstance(answer, InferenceServerException):  # its batch had three rows or more
            assert answer.status() in ("500", "StatusCode.INTERNAL"), answer
            assert "gave output 'logits' 2 rows for a batch of" in answer.message()
        else:
            alone = classify_alone(serving.model, {"str": np.array([text], object)})["logits"]
            np.testing.assert_allclose(answer, alone, rtol=1e-5, atol=1e-5, err_msg=text)
