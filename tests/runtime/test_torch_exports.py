"""The same served checks on models exported by torch and transformers, when both are
installed (marker `transformers`; skipped otherwise: the project's venv pins neither).
All four passed on 2026-11-27 with torch 2.15.0 and transformers 5.24.0, from a venv of
their own beside the project's (docs/development.md, "The transformers marker").

A tiny BertForSequenceClassification and a tiny GPT2LMHeadModel with random weights (no
download), exported with `torch.onnx.export` and the dynamic axes transformers' ONNX
configurations give, served by `kubeinfer serve` with their sequence length's range and
asked through tritonclient over HTTP and gRPC; each answer is ONNX Runtime's on the
exported file, for the request alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from models.torch_models import HEADS, HIDDEN, LAYERS, TEXT, export_bert, export_gpt2
from serve_process import ServeProcess, free_port

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.transformers, pytest.mark.slow]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("torch")
    return {"bert": export_bert(folder / "bert.onnx"), "gpt2": export_gpt2(folder / "gpt2.onnx")}


def flags(model: str) -> list[str]:
    if model == "bert":
        return [f"--input-shape={n}=1:32:128:0" for n in TEXT] + ["--shape-batching=PadToBuckets"]
    kv = f"{HEADS}x{{}}x{HIDDEN // HEADS}"
    return [
        "--input-shape=input_ids=1:8:64",
        "--input-shape=attention_mask=1:24:128",
        *(
            f"--input-shape=past_{i}_{p}={kv.format(0)}:{kv.format(16)}:{kv.format(64)}"
            for i in range(LAYERS)
            for p in ("key", "value")
        ),
    ]


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def served(request: pytest.FixtureRequest, exported: dict[str, Path]) -> Iterator[tuple]:
    grpc_port = free_port()
    name = request.param
    with ServeProcess(exported[name], name, "--grpc-port", str(grpc_port), *flags(name)) as p:
        yield name, exported[name], p, grpc_port
        assert p.stop() == 0, p.output()


def feeds(name: str, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    if name == "bert":
        return [
            {n: rng.integers(0 if n != "input_ids" else 1, 2, (1, length)) for n in TEXT}
            for length in (3, 17, 64)
        ]
    kv = lambda past: rng.standard_normal((1, HEADS, past, HIDDEN // HEADS)).astype(np.float32)  # noqa: E731
    found = []
    for length, past in ((5, 0), (1, 9)):
        feed = {
            "input_ids": rng.integers(0, 512, (1, length)),
            "attention_mask": np.ones((1, past + length), np.int64),
        }
        feed |= {f"past_{i}_{p}": kv(past) for i in range(LAYERS) for p in ("key", "value")}
        found.append(feed)
    return found


@pytest.mark.parametrize("module", [triton_http, triton_grpc])
def test_a_torch_export_serves_as_onnx_runtime_answers_it(served, module) -> None:
    name, path, process, grpc_port = served
    port = process.port if module is triton_http else grpc_port
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    for feed in feeds(name, np.random.default_rng(0)):
        inputs = []
        for key, array in feed.items():
            tensor = module.InferInput(
                key, list(array.shape), "INT64" if array.dtype == np.int64 else "FP32"
            )
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        answer = client.infer(name, inputs)
        for key, expected in zip(outputs, session.run(outputs, feed), strict=True):
            np.testing.assert_allclose(answer.as_numpy(key), expected, rtol=1e-4, atol=1e-4)
