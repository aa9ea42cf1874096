"""Text classifiers with their tokenizer in the graph, as users build them to move
pre-processing server-side: an onnxruntime-extensions tokenizer merged
(`onnx.compose.merge_models`) in front of a BERT-style classifier
(`models.transformer_models.build_encoder`, two labels), through a small adapter graph that
turns the tokenizer's outputs into the classifier's `[batch, sequence]` inputs.

- `build_bert_tokenizer_classifier`: `BertTokenizer` (made by `gen_processing_models` from
  a WordPiece vocabulary file). In: `text` BYTES `[None]`; out: `logits` FP32
  `[batch_size, 2]`. The tokenizer reads one text per run: two texts are one sentence pair
  (one row of logits), three or more its error. It does not batch.
- `build_hf_json_classifier`: `HfJsonTokenizer` with a byte-level BPE `tokenizer.json`
  written here (GPT-2's format, a vocabulary of the ASCII letters and a few merges). It
  takes a batch of texts and pads the shorter ones' ids with 0. With `mask_padding` the
  adapter masks the padding out of the attention (the model batches); without, the
  classifier attends to the padding, so a text's logits depend on the longest text it
  runs with (it does not batch, and its declared shapes cannot tell).
  With `keep_rows=2` the logits keep at most their first two rows (a Slice a converter
  left in): one and two texts are right, and the model passes for one that batches, but a
  batch of three texts is one row short.

`classify_alone` runs a model on one request with ONNX Runtime, nothing else: what each
served answer must equal.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, compose, helper

from models.transformer_models import BATCH, SEQUENCE, EncoderConfig, build_encoder

OPSET = 17
BERT_WORDS = (
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "jumps",
    "over", "lazy", "dog", "hello", "world", "a", "cat", "sat", "on", "mat", "##s", "good",
    "bad", "movie", "film", "was", "is", "great", "awful", "not", "very", "plot", "actors",
)  # fmt: skip
LABELS = 2
CLASSIFIER = EncoderConfig(vocab=128, hidden=32, heads=4, layers=2, intermediate=64,
                           labels=LABELS, seed=5)  # fmt: skip
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _extensions_session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    from onnxruntime_extensions import get_library_path

    options = ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def classify_alone(model: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs for one request, run by itself on ONNX Runtime (string inputs
    given as `bytes` or `str`)."""
    session = _extensions_session(model)
    feed = {
        name: np.array([v.decode() if isinstance(v, bytes) else v for v in array.ravel()],
                       dtype=object).reshape(array.shape) if array.dtype == object else array
        for name, array in inputs.items()
    }  # fmt: skip
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def _classifier(work: Path) -> onnx.ModelProto:
    path = build_encoder(work / "classifier.onnx", CLASSIFIER)
    return onnx.load(str(path))


def _at_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """A tokenizer graph (custom operators only) stated at the classifier's opset."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.domain, entry.version = "", OPSET
    model.ir_version = 8
    return model


def _adapter(
    inputs: list[onnx.ValueInfoProto], nodes: list[onnx.NodeProto], constants: dict[str, int]
) -> onnx.ModelProto:
    """The graph between a tokenizer's outputs and the classifier's three inputs
    (`constants`: INT64 initializers, a name and a value each, `[1]`-shaped where the name
    says rows)."""
    outputs = [helper.make_tensor_value_info(f"adapted_{n}", TensorProto.INT64, [BATCH, SEQUENCE])
               for n in TEXT_INPUTS]  # fmt: skip
    initializers = [
        helper.make_tensor(name, TensorProto.INT64, [1] if "rows" in name else [], [value])
        for name, value in constants.items()
    ]
    graph = helper.make_graph(nodes, "adapter", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def build_bert_tokenizer_classifier(path: Path) -> Path:
    """`BertTokenizer` in front of the classifier (see the module)."""
    from onnxruntime_extensions import gen_processing_models

    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = path.with_suffix(".vocab.txt")
    vocab.write_text("\n".join(BERT_WORDS) + "\n")
    tokenizer, _ = gen_processing_models(
        "BertTokenizer", pre_kwargs={"vocab_file": str(vocab), "do_lower_case": 1}, opset=OPSET
    )
    tokenizer = compose.add_prefix(_at_opset(tokenizer), "tokenizer_", rename_inputs=False)
    # BertTokenizer gives 1-D tensors of one sequence; the classifier wants [batch,
    # sequence]: each is reshaped to [-1, its length] (one row, which shape inference
    # cannot tell, so the graph declares a batch axis as a converter's graph would).
    inputs = [helper.make_tensor_value_info(f"{n}_1d", TensorProto.INT64, [None])
              for n in TEXT_INPUTS]  # fmt: skip
    nodes = []
    for n in TEXT_INPUTS:
        nodes += [
            helper.make_node("Shape", [f"{n}_1d"], [f"{n}_length"]),
            helper.make_node("Concat", ["adapter_any_rows", f"{n}_length"], [f"{n}_2d_shape"],
                             axis=0),
            helper.make_node("Reshape", [f"{n}_1d", f"{n}_2d_shape"], [f"adapted_{n}"]),
        ]  # fmt: skip
    adapter = _adapter(inputs, nodes, {"adapter_any_rows": -1})
    front = compose.merge_models(
        tokenizer, adapter, io_map=[(f"tokenizer_{n}", f"{n}_1d") for n in TEXT_INPUTS]
    )
    merged = compose.merge_models(
        front,
        _classifier(path.parent),
        io_map=[(f"adapted_{n}", n) for n in TEXT_INPUTS],
        outputs=["logits"],
    )
    onnx.checker.check_model(merged)
    onnx.save(merged, str(path))
    return path


def hf_json_tokenizer_files() -> tuple[str, str]:
    """(tokenizer.json, tokenizer_config.json) of a byte-level BPE tokenizer in GPT-2's
    format: the ASCII letters, digits and a few punctuation marks, `Ġ` (a space), and merges
    that make a few whole words; id 0 is `<|endoftext|>`, which also pads."""
    symbols = [*string.ascii_lowercase, "Ġ", *string.ascii_uppercase, *string.digits, *".,!?'"]
    merges = [("t", "h"), ("th", "e"), ("Ġ", "the"), ("Ġ", "a"), ("o", "g"), ("d", "og"),
              ("Ġ", "dog"), ("l", "o"), ("lo", "w"), ("i", "s"), ("Ġ", "is")]  # fmt: skip
    tokens = ["<|endoftext|>", *symbols, *(a + b for a, b in merges)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}  # fmt: skip
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": True,
                          "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {token: i for i, token in enumerate(tokens)},
                  "merges": [f"{a} {b}" for a, b in merges]},
    }  # fmt: skip
    config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
              "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
              "add_prefix_space": False, "model_max_length": 1024}  # fmt: skip
    return json.dumps(tokenizer), json.dumps(config)


def build_hf_json_classifier(path: Path, mask_padding: bool, keep_rows: int | None = None) -> Path:
    """`HfJsonTokenizer` in front of the classifier (see the module); with `keep_rows`, the
    logits of at most that many first rows."""
    from onnxruntime_extensions._cuops import SingleOpGraph
    from onnxruntime_extensions._ortapi2 import make_onnx_model

    path.parent.mkdir(parents=True, exist_ok=True)
    vocab, config = hf_json_tokenizer_files()
    graph = SingleOpGraph.build_graph(
        "HfJsonTokenizer", tokenizer_vocab=vocab, tokenizer_config=config
    )
    tokenizer = _at_opset(make_onnx_model(graph))
    [ids] = [o.name for o in tokenizer.graph.output]
    padded = helper.make_tensor_value_info("padded_ids", TensorProto.INT64, [BATCH, SEQUENCE])
    if mask_padding:  # a position holds a token where its id is not the padding's (0)
        mask = [
            helper.make_node("Equal", ["padded_ids", "adapter_zero"], ["is_padding"]),
            helper.make_node("Not", ["is_padding"], ["is_token"]),
            helper.make_node(
                "Cast", ["is_token"], ["adapted_attention_mask"], to=TensorProto.INT64
            ),
        ]
    else:  # every position attended, padding too
        mask = [
            helper.make_node("Mul", ["padded_ids", "adapter_zero"], ["zeros"]),
            helper.make_node("Add", ["zeros", "adapter_one"], ["adapted_attention_mask"]),
        ]
    nodes = [
        helper.make_node("Identity", ["padded_ids"], ["adapted_input_ids"]),
        helper.make_node("Mul", ["padded_ids", "adapter_zero"], ["adapted_token_type_ids"]),
        *mask,
    ]
    constants = {"adapter_zero": 0, **({} if mask_padding else {"adapter_one": 1})}
    adapter = _adapter([padded], nodes, constants)
    front = compose.merge_models(tokenizer, adapter, io_map=[(ids, "padded_ids")])
    merged = compose.merge_models(
        front,
        _classifier(path.parent),
        io_map=[(f"adapted_{n}", n) for n in TEXT_INPUTS],
        outputs=["logits"],
    )
    if keep_rows is not None:
        _keep_rows(merged, "logits", keep_rows)
    onnx.checker.check_model(merged)
    onnx.save(merged, str(path))
    return path


def _keep_rows(model: onnx.ModelProto, output: str, rows: int) -> None:
    """`output` cut to its first `rows` rows by a Slice at the end of the graph."""
    graph = model.graph
    for node in graph.node:
        node.output[:] = [f"uncut_{output}" if o == output else o for o in node.output]
    graph.initializer.extend([
        helper.make_tensor("keep_starts", TensorProto.INT64, [1], [0]),
        helper.make_tensor("keep_ends", TensorProto.INT64, [1], [rows]),
        helper.make_tensor("keep_axes", TensorProto.INT64, [1], [0]),
    ])  # fmt: skip
    graph.node.append(helper.make_node(
        "Slice", [f"uncut_{output}", "keep_starts", "keep_ends", "keep_axes"], [output]
    ))  # fmt: skip
