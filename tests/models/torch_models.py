"""A tiny BERT and a tiny GPT-2 from `transformers`, with random weights (no download),
exported by `torch.onnx.export` with the dynamic axes transformers' ONNX configurations
give: the models users bring, when torch and transformers are installed (the tests that
use them are marked `transformers` and skip otherwise).

Their sizes are `transformer_models`' defaults (a vocabulary of 1000 for the encoder and
512 for the decoder, hidden 64, 4 heads, 2 layers, 3 labels), so the same inputs
(`encoder_inputs`, `decoder_inputs`) and the same ranges serve both. Ran on 2026-11-27
with torch 2.15.0 (its default exporter, dynamo; onnxscript 0.7.2) and transformers
5.24.0, from a venv of their own beside the project's, which pins neither
(docs/development.md, "The transformers marker").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEXT = ("input_ids", "attention_mask", "token_type_ids")
LAYERS, HEADS, HIDDEN = 2, 4, 64
TOTAL = "past_sequence_length + sequence_length"
# torch's exporter (dynamo, the default since torch 2.9) writes opset 18 and converts
# down to an older one asked for; its conversion to 17 left Split's opset-18
# `num_outputs` attribute in the GPT-2 graph, which ONNX Runtime refuses.
OPSET = 18
SEED = 0  # the random weights, the same on every run


def export_bert(path: Path) -> Path:
    """BertForSequenceClassification: `input_ids`, `attention_mask`, `token_type_ids`
    INT64 [batch_size, sequence_length] in, `logits` [batch_size, 3] out."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=128, num_labels=3,
        # transformers' default (0.02) leaves a random BERT's logits near 0 whatever the
        # input: attending to padding moved them by 1e-4. At 0.2 they span units, and
        # unmasked padding moves them by about 2.6.
        initializer_range=0.2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config).eval()
    example = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in TEXT)
    axes = {name: {0: "batch_size", 1: "sequence_length"} for name in TEXT}
    torch.onnx.export(
        model, example, str(path), input_names=list(TEXT), output_names=["logits"],
        dynamic_axes={**axes, "logits": {0: "batch_size"}}, opset_version=OPSET,
    )  # fmt: skip
    return path


def _with_flat_cache(model: Any) -> Any:
    """GPT2LMHeadModel with its cache as flat inputs and outputs, as exports name them.

    The cache's tensors are named parameters, not `*past`: torch's exporter maps
    `dynamic_axes` onto the forward's parameters, one per input name."""
    import torch
    from transformers.cache_utils import DynamicCache

    class Gpt2WithPast(torch.nn.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(  # type: ignore[no-untyped-def]
            self, input_ids, attention_mask, past_0_key, past_0_value, past_1_key, past_1_value
        ):
            legacy = ((past_0_key, past_0_value), (past_1_key, past_1_value))
            if hasattr(DynamicCache, "from_legacy_cache"):  # transformers 4 (not run here)
                cache = DynamicCache.from_legacy_cache(legacy)
            else:  # transformers 5 takes the pairs directly
                cache = DynamicCache(legacy)
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                use_cache=True,
            )  # fmt: skip
            presents = out.past_key_values
            if hasattr(presents, "to_legacy_cache"):
                pairs = presents.to_legacy_cache()
            else:
                pairs = [(layer.keys, layer.values) for layer in presents.layers]
            return (out.logits, *(t for pair in pairs for t in pair))

    assert LAYERS == 2, "the forward names two layers' cache"
    return Gpt2WithPast().eval()


def export_gpt2(path: Path) -> Path:
    """GPT2LMHeadModel with past key/values: `input_ids` [batch_size, sequence_length],
    `attention_mask` [batch_size, past + sequence], `past_{i}_key/value` in; `logits` and
    `present_{i}_key/value` out."""
    import torch
    import transformers

    torch.manual_seed(SEED)
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
        output_names=["logits", *present_names], dynamic_axes=axes, opset_version=OPSET,
    )  # fmt: skip
    return path
