"""The BERT-style encoder and the GPT-2-style decoder (`models.transformer_models`) served
by real `kubeinfer serve` processes and asked through `tritonclient`, over HTTP and gRPC,
each answer judged against ONNX Runtime run directly on that request.

Covers: concurrent requests of lengths drawn from 1 to 128 tokens under both batching
strategies, each answered as ONNX Runtime answers it alone (the padded ones cut back to
their own length); a decoder generating token by token with its presents sent back as
its past, under both strategies; a request past the range a 400 (INVALID_ARGUMENT) naming
it; the buffers' memory in the log and /metrics as the engine allocates it, and a
decoder with a real vocabulary's buffers reserved but not resident until batches use
them (the process starts without writing its worst case); the request
body limit derived from the model (413 and RESOURCE_EXHAUSTED naming maxRequestBytes and
how to raise it); a model with a variable axis and no range, and padding that cannot be
done, refused at start with what to change.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from kubeinfer.contract.runtime_config import request_bytes_limit
from models.transformer_models import (
    DecoderConfig,
    build_decoder,
    build_encoder,
    decoder_inputs,
    encoder_inputs,
)
from ports import free_port
from serve_process import ServeProcess
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

TEXT = ("input_ids", "attention_mask", "token_type_ids")
ENCODER_FLAGS = [f"--input-shape={n}=1:32:128:0" for n in TEXT]
CONFIG = DecoderConfig()
KV = f"{CONFIG.heads}x{{}}x{CONFIG.head_size}"


def decoder_flags(pad: bool) -> list[str]:
    """The decoder's ranges; with `pad`, its new tokens and mask pad with 0 (never its past,
    which no mask hides)."""
    zero = ":0" if pad else ""
    return [
        f"--input-shape=input_ids=1:8:64{zero}",
        f"--input-shape=attention_mask=1:24:128{zero}",
        *(
            f"--input-shape=past_{i}_{part}={KV.format(0)}:{KV.format(16)}:{KV.format(64)}"
            for i in range(CONFIG.layers)
            for part in ("key", "value")
        ),
    ]


STRATEGIES = ("EqualShapes", "PadToBuckets")


class Served:
    """One serve process with HTTP and gRPC, and a client of each."""

    def __init__(self, process: ServeProcess, grpc_port: int) -> None:
        self.process = process
        self.http = triton_http.InferenceServerClient(f"127.0.0.1:{process.port}", concurrency=8)
        self.grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        self.grpc_port = grpc_port


def serving(model: Path, name: str, *flags: str) -> Iterator[Served]:
    grpc_port = free_port()
    with ServeProcess(
        model, name, "--grpc-port", str(grpc_port), "--intra-op-threads", "1",
        "--max-batch-size", "16", "--max-queue-delay-microseconds", "2000", *flags,
    ) as process:  # fmt: skip
        served = Served(process, grpc_port)
        yield served
        served.grpc.close()
        assert process.stop() == 0, process.output()
        assert "Traceback" not in process.output()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("transformers")
    return {
        "encoder": build_encoder(folder / "encoder.onnx"),
        "decoder": build_decoder(folder / "decoder.onnx"),
    }


@pytest.fixture(scope="module", params=STRATEGIES)
def bert(request: pytest.FixtureRequest, models: dict[str, Path]) -> Iterator[Served]:
    yield from serving(
        models["encoder"], "bert", *ENCODER_FLAGS, f"--shape-batching={request.param}",
        "--shape-buckets=16,32,64,128",
    )  # fmt: skip


@pytest.fixture(scope="module", params=STRATEGIES)
def gpt(request: pytest.FixtureRequest, models: dict[str, Path]) -> Iterator[Served]:
    flags = decoder_flags(pad=request.param == "PadToBuckets")
    yield from serving(models["decoder"], "gpt", *flags, f"--shape-batching={request.param}")


def direct(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def tensors(module, feed: dict[str, np.ndarray]) -> list:
    found = []
    for name, array in feed.items():
        tensor = module.InferInput(
            name, list(array.shape), "INT64" if array.dtype == np.int64 else "FP32"
        )
        tensor.set_data_from_numpy(array)
        found.append(tensor)
    return found


def ask(served: Served, transport: str, model: str, feed: dict[str, np.ndarray]):
    if transport == "http":
        return served.http.infer(model, tensors(triton_http, feed))
    return served.grpc.infer(model, tensors(triton_grpc, feed))


def ask_all(served: Served, transport: str, model: str, feeds: list[dict[str, np.ndarray]]):
    """The requests all in flight at once: HTTP's client sends them concurrently itself
    (it is not for threads), gRPC's from a thread each."""
    if transport == "http":
        pending = [served.http.async_infer(model, tensors(triton_http, f)) for f in feeds]
        return [request.get_result() for request in pending]
    with ThreadPoolExecutor(len(feeds)) as pool:
        return list(pool.map(lambda feed: ask(served, transport, model, feed), feeds))


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_concurrent_lengths_from_1_to_128_each_get_their_own_answer(
    bert: Served, models: dict[str, Path], transport: str
) -> None:
    rng = np.random.default_rng(7)
    requests = [
        encoder_inputs(rng, int(rng.integers(1, 3)), int(n)) for n in rng.integers(1, 129, 32)
    ]
    answers = ask_all(bert, transport, "bert", requests)
    for feed, answer in zip(requests, answers, strict=True):
        want = direct(models["encoder"], feed)
        for name, expected in want.items():
            got = answer.as_numpy(name)
            assert got.shape == expected.shape, name
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_decoder_generates_with_its_presents_sent_back_as_its_past(
    gpt: Served, models: dict[str, Path], transport: str
) -> None:
    """Greedy decoding of three tokens after four prompts of several lengths, the four
    sequences' steps sent together: every step's logits and presents are ONNX Runtime's
    own for that request."""
    rng = np.random.default_rng(11)
    feeds = [decoder_inputs(rng, 1, int(n), 0) for n in rng.integers(2, 12, 4)]
    for _ in range(3):
        answers = ask_all(gpt, transport, "gpt", feeds)
        following = []
        for feed, answer in zip(feeds, answers, strict=True):
            want = direct(models["decoder"], feed)
            for name, expected in want.items():
                np.testing.assert_allclose(answer.as_numpy(name), expected, rtol=1e-4, atol=1e-4)
            token = answer.as_numpy("logits")[:, -1:].argmax(axis=-1).astype(np.int64)
            past = feed["attention_mask"].shape[1]
            step = {"input_ids": token, "attention_mask": np.ones((1, past + 1), np.int64)}
            step |= {
                name.replace("present", "past"): answer.as_numpy(name)
                for name in want
                if name.startswith("present")
            }
            following.append(step)
        feeds = following


def test_a_request_past_its_range_is_refused_naming_the_range(bert: Served) -> None:
    feed = encoder_inputs(np.random.default_rng(0), 1, 129)
    with pytest.raises(InferenceServerException) as http_error:
        bert.http.infer("bert", tensors(triton_http, feed))
    assert http_error.value.status() == "400"
    assert (
        "accepts [batch, 1..128] (its inputShapes' minShape..maxShape)"
        in http_error.value.message()
    )
    with pytest.raises(InferenceServerException) as grpc_error:
        bert.grpc.infer("bert", tensors(triton_grpc, feed))
    assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "accepts [batch, 1..128]" in grpc_error.value.message()


def test_the_buffers_memory_is_reported_when_ready(bert: Served) -> None:
    # One slot: 16 rows of 3 INT64 inputs at 128 tokens, logits (3 FP32) and the hidden
    # state (128 x 64 FP32).
    expected = 16 * (3 * 128 * 8 + 3 * 4 + 128 * 64 * 4)
    assert bert.process.metric("kubeinfer_engine_buffer_bytes") == expected
    assert f"Allocated engine buffers slots=1 bytes={expected}" in bert.process.output()


def test_the_request_limit_follows_the_model_and_says_how_to_raise_it(bert: Served) -> None:
    limit = request_bytes_limit(3 * 128 * 8, 16)  # 16 rows of the longest request, as JSON
    status, _, body = bert.process.request(
        "POST", "/v2/models/bert/infer", b"{" + b" " * limit + b"}"
    )
    assert status == 413
    message = json.loads(body)["error"]
    assert f"over the limit of {limit} bytes" in message
    assert "maxRequestBytes, kubeinfer serve --max-request-bytes" in message
    inside = encoder_inputs(np.random.default_rng(1), 16, 128)  # the largest request fits
    assert bert.http.infer("bert", tensors(triton_http, inside)).as_numpy("logits").shape == (16, 3)
    too_large = np.zeros((1, limit // 8 + 1), np.int64)
    request = triton_grpc.InferInput("input_ids", list(too_large.shape), "INT64")
    request.set_data_from_numpy(too_large)
    with pytest.raises(InferenceServerException) as grpc_error:
        bert.grpc.infer("bert", [request])
    assert grpc_error.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "maxRequestBytes, kubeinfer serve --max-request-bytes" in grpc_error.value.message()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "input 'input_ids' has variable axes besides the batch (['sequence_length']); "
             "state its range in inputShapes"),
        ([*ENCODER_FLAGS[:2], "--input-shape=token_type_ids=1:32:128", "--shape-batching",
          "PadToBuckets"], "input 'attention_mask' has a padValue, but none of its variable"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_refused_at_start(
    models: dict[str, Path], flags: list[str], message: str
) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", "serve", "--onnx", str(models["encoder"]),
         "--model-name", "bert", "--port", str(free_port()), *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 1, started.stderr
    assert message in started.stderr


def test_a_real_vocabularys_buffers_are_reserved_not_written_at_start(tmp_path: Path) -> None:
    """GPT-2's 50257-token vocabulary at 256 tokens and 32 rows: 1.5 GiB of logits buffer
    reported, far less resident (the pages are mapped as batches reach them)."""
    path = build_decoder(tmp_path / "gpt.onnx", DecoderConfig(vocab=50257))
    kv = f"{CONFIG.heads}x0x{CONFIG.head_size}"
    past = [
        f"--input-shape=past_{i}_{p}={kv}:{kv}:{kv}" for i in range(2) for p in ("key", "value")
    ]
    with ServeProcess(
        path, "gpt", "--input-shape=input_ids=1:64:256", "--input-shape=attention_mask=1:64:256",
        *past, "--max-batch-size", "32",
    ) as process:  # fmt: skip
        reported = process.metric("kubeinfer_engine_buffer_bytes")
        assert reported >= 32 * 256 * 50257 * 4
        resident = process.memory_kib("VmRSS") * 1024
        assert resident < reported / 2, (resident, reported)
        assert process.stop() == 0
