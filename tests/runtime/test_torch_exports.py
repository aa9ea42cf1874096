"""The same served checks on models exported by torch and transformers, when both are
installed (marker `transformers`; skipped otherwise, as on the project's machines, which
have neither: this module has never run here, so it is kept to the export and the
checks, and named unverified).

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
from serve_process import ServeProcess, free_port

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.transformers, pytest.mark.slow]

TEXT = ("input_ids", "attention_mask", "token_type_ids")
LAYERS, HEADS, HIDDEN = 2, 4, 64


def export_bert(path: Path) -> Path:
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=128, num_labels=3,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config).eval()
    example = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in TEXT)
    axes = {name: {0: "batch_size", 1: "sequence_length"} for name in TEXT}
    torch.onnx.export(
        model, example, str(path), input_names=list(TEXT), output_names=["logits"],
        dynamic_axes={**axes, "logits": {0: "batch_size"}}, opset_version=17,
    )  # fmt: skip
    return path


class Gpt2WithPast(torch.nn.Module):
    """GPT2LMHeadModel with its cache as flat inputs and outputs, as exports name them."""

    def __init__(self, model: object) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, *past):  # type: ignore[no-untyped-def]
        legacy = tuple((past[2 * i], past[2 * i + 1]) for i in range(LAYERS))
        try:
            from transformers.cache_utils import DynamicCache

            cache = DynamicCache.from_legacy_cache(legacy)
        except ImportError:
            cache = legacy
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
            use_cache=True,
        )  # fmt: skip
        presents = out.past_key_values
        if hasattr(presents, "to_legacy_cache"):
            presents = presents.to_legacy_cache()
        return (out.logits, *(t for layer in presents for t in layer))


def export_gpt2(path: Path) -> Path:
    config = transformers.GPT2Config(
        vocab_size=512, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=256
    )
    model = Gpt2WithPast(transformers.GPT2LMHeadModel(config).eval())
    kv = (1, HEADS, 3, HIDDEN // HEADS)
    past_names = [f"past_{i}_{p}" for i in range(LAYERS) for p in ("key", "value")]
    present_names = [n.replace("past", "present") for n in past_names]
    example = (
        torch.ones((1, 2), dtype=torch.int64),
        torch.ones((1, 5), dtype=torch.int64),
        *(torch.zeros(kv) for _ in past_names),
    )
    total = "past_sequence_length + sequence_length"
    axes = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: total},
        "logits": {0: "batch_size", 1: "sequence_length"},
        **{n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names},
        **{n: {0: "batch_size", 2: total} for n in present_names},
    }
    torch.onnx.export(
        model, example, str(path), input_names=["input_ids", "attention_mask", *past_names],
        output_names=["logits", *present_names], dynamic_axes=axes, opset_version=17,
    )  # fmt: skip
    return path


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
