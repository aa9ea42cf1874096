"""A tiny BERT and a tiny GPT-2 from `transformers`, with random weights (no download),
exported by `torch.onnx.export` with the dynamic axes transformers' ONNX configurations
give: the models users bring, when torch and transformers are installed (the tests that
use them are marked `transformers` and skip otherwise).

Their sizes are `transformer_models`' defaults (a vocabulary of 1000 for the encoder and
512 for the decoder, hidden 64, 4 heads, 2 layers, 3 labels), so the same inputs
(`encoder_inputs`, `decoder_inputs`) and the same ranges serve both. Unverified: the
project's machines have neither torch nor transformers, so this module has never run
there; it is kept to the export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEXT = ("input_ids", "attention_mask", "token_type_ids")
LAYERS, HEADS, HIDDEN = 2, 4, 64
TOTAL = "past_sequence_length + sequence_length"


def export_bert(path: Path) -> Path:
    """BertForSequenceClassification: `input_ids`, `attention_mask`, `token_type_ids`
    INT64 [batch_size, sequence_length] in, `logits` [batch_size, 3] out."""
    import torch
    import transformers

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


def _with_flat_cache(model: Any) -> Any:
    """GPT2LMHeadModel with its cache as flat inputs and outputs, as exports name them."""
    import torch

    class Gpt2WithPast(torch.nn.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
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

    return Gpt2WithPast()


def export_gpt2(path: Path) -> Path:
    """GPT2LMHeadModel with past key/values: `input_ids` [batch_size, sequence_length],
    `attention_mask` [batch_size, past + sequence], `past_{i}_key/value` in; `logits` and
    `present_{i}_key/value` out."""
    import torch
    import transformers

    config = transformers.GPT2Config(
        vocab_size=512, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=256
    )
    model = _with_flat_cache(transformers.GPT2LMHeadModel(config).eval())
    kv = (1, HEADS, 3, HIDDEN // HEADS)
    past_names = [f"past_{i}_{p}" for i in range(LAYERS) for p in ("key", "value")]
    present_names = [n.replace("past", "present") for n in past_names]
    example = (
        torch.ones((1, 2), dtype=torch.int64),
        torch.ones((1, 5), dtype=torch.int64),
        *(torch.zeros(kv) for _ in past_names),
    )
    axes = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: TOTAL},
        "logits": {0: "batch_size", 1: "sequence_length"},
        **{n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names},
        **{n: {0: "batch_size", 2: TOTAL} for n in present_names},
    }
    torch.onnx.export(
        model, example, str(path), input_names=["input_ids", "attention_mask", *past_names],
        output_names=["logits", *present_names], dynamic_axes=axes, opset_version=17,
    )  # fmt: skip
    return path
