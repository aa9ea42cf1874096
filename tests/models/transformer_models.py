"""Transformer models of the two families users bring, built with `onnx.helper` and numpy
only (no torch), with deterministic random weights, and a numpy reference of the same math.

- `build_encoder`: a BERT-style sequence classifier. Inputs `input_ids`, `attention_mask`
  and `token_type_ids`, INT64 `[batch_size, sequence_length]`; word, position and token
  type embeddings, layer norm, `layers` post-norm self-attention blocks whose scores are
  masked by `attention_mask` (BERT's additive `(1 - mask) * -10000`), erf GELU feed-forward
  blocks, a tanh pooler over the first token and a classifier head. Outputs `logits`
  `[batch_size, labels]` and `last_hidden_state` `[batch_size, sequence_length, hidden]`.
- `build_decoder`: a GPT-2-style causal language model with past key/values. Inputs
  `input_ids` INT64 `[batch_size, sequence_length]`, `attention_mask` INT64
  `[batch_size, past_sequence_length + sequence_length]` and, per layer, `past_{i}_key` /
  `past_{i}_value` FP32 `[batch_size, heads, past_sequence_length, head_size]`; pre-norm
  blocks, positions counted from the past's length, a causal mask combined with the
  attention mask, logits over the vocabulary (embeddings tied). Outputs `logits`
  `[batch_size, sequence_length, vocab]` and `present_{i}_key` / `present_{i}_value`
  `[batch_size, heads, past_sequence_length + sequence_length, head_size]`.

The dynamic axes carry the names torch writes when the exporter is given them as
transformers' ONNX configurations do (`batch_size`, `sequence_length`,
`past_sequence_length`, `past_sequence_length + sequence_length`). `encoder_reference`
and `decoder_reference` compute the same outputs with numpy, so a test can tell the graph
is the architecture it claims to be, and serving answers can be judged without ONNX
Runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BATCH = "batch_size"
SEQUENCE = "sequence_length"
PAST = "past_sequence_length"
TOTAL = "past_sequence_length + sequence_length"
MASK_BIAS = -10000.0
"""BERT's additive bias on masked keys (exp of it underflows to exactly 0 in float32)."""
CAUSAL_BIAS = -1e9
"""The decoder's bias on keys a query may not see."""
OPSET = 17  # LayerNormalization is opset 17


@dataclass(frozen=True)
class EncoderConfig:
    vocab: int = 1000
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    intermediate: int = 128
    max_positions: int = 512
    type_vocab: int = 2
    labels: int = 3
    seed: int = 7


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 512
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    max_positions: int = 512
    seed: int = 11

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


@dataclass
class _Graph:
    """Nodes and initializers being assembled, with unique intermediate names."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    count: int = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, kind: str, inputs: list[str], **attributes: object) -> str:
        self.count += 1
        out = f"{kind.lower()}_{self.count}"
        self.nodes.append(helper.make_node(kind, inputs, [out], **attributes))
        return out

    def output(self, kind: str, inputs: list[str], name: str, **attributes: object) -> str:
        self.nodes.append(helper.make_node(kind, inputs, [name], **attributes))
        return name

    def linear(self, x: str, weight: str, bias: str) -> str:
        return self.op("Add", [self.op("MatMul", [x, weight]), bias])

    def layer_norm(self, x: str, prefix: str) -> str:
        return self.op("LayerNormalization", [x, f"{prefix}.gamma", f"{prefix}.beta"], axis=-1)

    def gelu(self, x: str) -> str:
        """0.5 x (1 + erf(x / sqrt 2)), as BERT and GPT-2's exports write it (opset 17 has
        no Gelu)."""
        scaled = self.op("Mul", [x, "inv_sqrt2"])
        return self.op(
            "Mul", [self.op("Mul", [x, "half"]), self.op("Add", ["one", self.op("Erf", [scaled])])]
        )

    def heads(self, x: str, heads_shape: str, perm: list[int]) -> str:
        """[b, s, hidden] -> [b, heads, s, head_size] (perm [0, 2, 1, 3]) or its keys'
        transpose (perm [0, 2, 3, 1])."""
        return self.op("Transpose", [self.op("Reshape", [x, heads_shape])], perm=perm)


def _weights(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Normal(0, 0.05) matrices, small non-zero biases, layer norms near identity."""
    weights = {}
    for name, shape in shapes.items():
        if name.endswith(".gamma"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith((".beta", ".b")):
            value = 0.02 * rng.standard_normal(shape)
        else:
            value = 0.05 * rng.standard_normal(shape)
        weights[name] = value.astype(np.float32)
    return weights


def encoder_weights(config: EncoderConfig) -> dict[str, np.ndarray]:
    h, f = config.hidden, config.intermediate
    shapes: dict[str, tuple[int, ...]] = {
        "word_embeddings": (config.vocab, h),
        "position_embeddings": (config.max_positions, h),
        "token_type_embeddings": (config.type_vocab, h),
        "embeddings_ln.gamma": (h,),
        "embeddings_ln.beta": (h,),
        "pooler.w": (h, h),
        "pooler.b": (h,),
        "classifier.w": (h, config.labels),
        "classifier.b": (config.labels,),
    }
    for i in range(config.layers):
        for part in ("q", "k", "v", "o"):
            shapes[f"layer{i}.{part}.w"] = (h, h)
            shapes[f"layer{i}.{part}.b"] = (h,)
        shapes |= {
            f"layer{i}.attention_ln.gamma": (h,), f"layer{i}.attention_ln.beta": (h,),
            f"layer{i}.ffn_in.w": (h, f), f"layer{i}.ffn_in.b": (f,),
            f"layer{i}.ffn_out.w": (f, h), f"layer{i}.ffn_out.b": (h,),
            f"layer{i}.output_ln.gamma": (h,), f"layer{i}.output_ln.beta": (h,),
        }  # fmt: skip
    weights = _weights(np.random.default_rng(config.seed), shapes)
    weights["word_embeddings"] *= 10  # embeddings of BERT's scale: tokens tell apart
    weights["pooler.w"] *= 6  # a head whose classes differ from one input to the next
    weights["classifier.w"] *= 20
    return weights


def decoder_weights(config: DecoderConfig) -> dict[str, np.ndarray]:
    h = config.hidden
    shapes: dict[str, tuple[int, ...]] = {
        "wte": (config.vocab, h),
        "wpe": (config.max_positions, h),
        "final_ln.gamma": (h,),
        "final_ln.beta": (h,),
    }
    for i in range(config.layers):
        for part in ("q", "k", "v", "o"):
            shapes[f"layer{i}.{part}.w"] = (h, h)
            shapes[f"layer{i}.{part}.b"] = (h,)
        shapes |= {
            f"layer{i}.ln1.gamma": (h,), f"layer{i}.ln1.beta": (h,),
            f"layer{i}.ln2.gamma": (h,), f"layer{i}.ln2.beta": (h,),
            f"layer{i}.mlp_in.w": (h, 4 * h), f"layer{i}.mlp_in.b": (4 * h,),
            f"layer{i}.mlp_out.w": (4 * h, h), f"layer{i}.mlp_out.b": (h,),
        }  # fmt: skip
    weights = _weights(np.random.default_rng(config.seed), shapes)
    weights["wte"] *= 10
    return weights


def _common_constants(graph: _Graph, heads: int, head_size: int) -> None:
    graph.const("half", np.array(0.5, np.float32))
    graph.const("one", np.array(1.0, np.float32))
    graph.const("inv_sqrt2", np.array(1 / math.sqrt(2), np.float32))
    graph.const("scale", np.array(1 / math.sqrt(head_size), np.float32))
    graph.const("heads_shape", np.array([0, 0, heads, head_size], np.int64))
    graph.const("merged_shape", np.array([0, 0, heads * head_size], np.int64))
    graph.const("zero_i", np.array(0, np.int64))
    graph.const("one_i", np.array(1, np.int64))


def _attention(graph: _Graph, q: str, keys_t: str, values: str, bias: str) -> str:
    """softmax(q k^T / sqrt(d) + bias) v, heads merged back: [b, s, hidden]."""
    scores = graph.op("Add", [graph.op("Mul", [graph.op("MatMul", [q, keys_t]), "scale"]), bias])
    context = graph.op("MatMul", [graph.op("Softmax", [scores], axis=-1), values])
    merged = graph.op("Transpose", [context], perm=[0, 2, 1, 3])
    return graph.op("Reshape", [merged, "merged_shape"])


def _save(graph: _Graph, name: str, inputs: list, outputs: list, path: Path) -> Path:
    model = helper.make_model(
        helper.make_graph(graph.nodes, name, inputs, outputs, graph.initializers),
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="kubeinfer-tests",
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def build_encoder(path: Path, config: EncoderConfig = EncoderConfig()) -> Path:
    """Writes the BERT-style classifier to `path` (see the module docstring)."""
    graph = _Graph()
    for name, value in encoder_weights(config).items():
        graph.const(name, value)
    _common_constants(graph, config.heads, config.hidden // config.heads)
    graph.const("mask_bias", np.array(MASK_BIAS, np.float32))
    graph.const("mask_axes", np.array([1, 2], np.int64))
    length = graph.op("Gather", [graph.op("Shape", ["input_ids"]), "one_i"], axis=0)
    positions = graph.op("Range", ["zero_i", length, "one_i"])
    embedded = graph.op("Add", [
        graph.op("Add", [graph.op("Gather", ["word_embeddings", "input_ids"]),
                         graph.op("Gather", ["position_embeddings", positions])]),
        graph.op("Gather", ["token_type_embeddings", "token_type_ids"]),
    ])  # fmt: skip
    x = graph.layer_norm(embedded, "embeddings_ln")
    mask = graph.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    bias = graph.op(
        "Unsqueeze", [graph.op("Mul", [graph.op("Sub", ["one", mask]), "mask_bias"]), "mask_axes"]
    )
    for i in range(config.layers):
        p = f"layer{i}"
        q = graph.heads(graph.linear(x, f"{p}.q.w", f"{p}.q.b"), "heads_shape", [0, 2, 1, 3])
        k = graph.heads(graph.linear(x, f"{p}.k.w", f"{p}.k.b"), "heads_shape", [0, 2, 3, 1])
        v = graph.heads(graph.linear(x, f"{p}.v.w", f"{p}.v.b"), "heads_shape", [0, 2, 1, 3])
        attended = graph.linear(_attention(graph, q, k, v, bias), f"{p}.o.w", f"{p}.o.b")
        x = graph.layer_norm(graph.op("Add", [x, attended]), f"{p}.attention_ln")
        inner = graph.gelu(graph.linear(x, f"{p}.ffn_in.w", f"{p}.ffn_in.b"))
        ffn = graph.linear(inner, f"{p}.ffn_out.w", f"{p}.ffn_out.b")
        x = graph.layer_norm(graph.op("Add", [x, ffn]), f"{p}.output_ln")
    graph.output("Identity", [x], "last_hidden_state")
    first = graph.op("Gather", [x, "zero_i"], axis=1)
    pooled = graph.op("Tanh", [graph.linear(first, "pooler.w", "pooler.b")])
    graph.output("Add", [graph.op("MatMul", [pooled, "classifier.w"]), "classifier.b"], "logits")
    ids = [BATCH, SEQUENCE]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ids)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, config.labels]),
        helper.make_tensor_value_info(
            "last_hidden_state", TensorProto.FLOAT, [BATCH, SEQUENCE, config.hidden]
        ),
    ]
    return _save(graph, "bert_style_encoder", inputs, outputs, path)


def build_decoder(path: Path, config: DecoderConfig = DecoderConfig()) -> Path:
    """Writes the GPT-2-style decoder with past key/values to `path` (see the module)."""
    graph = _Graph()
    for name, value in decoder_weights(config).items():
        graph.const(name, value)
    _common_constants(graph, config.heads, config.head_size)
    graph.const("causal_bias", np.array(CAUSAL_BIAS, np.float32))
    graph.const("zero_f", np.array(0.0, np.float32))
    graph.const("axis0", np.array([0], np.int64))
    graph.const("axis1", np.array([1], np.int64))
    graph.const("mask_axes", np.array([1, 2], np.int64))
    graph.const("two_i", np.array(2, np.int64))
    past = graph.op("Gather", [graph.op("Shape", ["past_0_key"]), "two_i"], axis=0)
    length = graph.op("Gather", [graph.op("Shape", ["input_ids"]), "one_i"], axis=0)
    total = graph.op("Add", [past, length])
    positions = graph.op("Range", [past, total, "one_i"])
    h = graph.op(
        "Add", [graph.op("Gather", ["wte", "input_ids"]), graph.op("Gather", ["wpe", positions])]
    )
    queries_at = graph.op("Unsqueeze", [positions, "axis1"])  # [s, 1]
    keys_at = graph.op(
        "Unsqueeze", [graph.op("Range", ["zero_i", total, "one_i"]), "axis0"]
    )  # [1, t]
    causal = graph.op("LessOrEqual", [keys_at, queries_at])  # [s, t]
    visible = graph.op(
        "Unsqueeze", [graph.op("Cast", ["attention_mask"], to=TensorProto.BOOL), "mask_axes"]
    )
    bias = graph.op(
        "Where", [graph.op("And", [causal, visible]), "zero_f", "causal_bias"]
    )  # [b,1,s,t]
    present_names = []
    for i in range(config.layers):
        p = f"layer{i}"
        a = graph.layer_norm(h, f"{p}.ln1")
        q = graph.heads(graph.linear(a, f"{p}.q.w", f"{p}.q.b"), "heads_shape", [0, 2, 1, 3])
        k = graph.heads(graph.linear(a, f"{p}.k.w", f"{p}.k.b"), "heads_shape", [0, 2, 1, 3])
        v = graph.heads(graph.linear(a, f"{p}.v.w", f"{p}.v.b"), "heads_shape", [0, 2, 1, 3])
        keys = graph.output("Concat", [f"past_{i}_key", k], f"present_{i}_key", axis=2)
        values = graph.output("Concat", [f"past_{i}_value", v], f"present_{i}_value", axis=2)
        present_names += [keys, values]
        keys_t = graph.op("Transpose", [keys], perm=[0, 1, 3, 2])
        h = graph.op(
            "Add",
            [h, graph.linear(_attention(graph, q, keys_t, values, bias), f"{p}.o.w", f"{p}.o.b")],
        )
        m = graph.gelu(
            graph.linear(graph.layer_norm(h, f"{p}.ln2"), f"{p}.mlp_in.w", f"{p}.mlp_in.b")
        )
        h = graph.op("Add", [h, graph.linear(m, f"{p}.mlp_out.w", f"{p}.mlp_out.b")])
    final = graph.layer_norm(h, "final_ln")
    graph.const("wte_t", decoder_weights(config)["wte"].T.copy())
    graph.output("MatMul", [final, "wte_t"], "logits")
    kv = [BATCH, config.heads, PAST, config.head_size]
    present = [BATCH, config.heads, TOTAL, config.head_size]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [BATCH, SEQUENCE]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [BATCH, TOTAL]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, SEQUENCE, config.vocab])
    ]
    for i in range(config.layers):
        for part in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{i}_{part}", TensorProto.FLOAT, kv))
            outputs.append(
                helper.make_tensor_value_info(f"present_{i}_{part}", TensorProto.FLOAT, present)
            )
    return _save(graph, "gpt2_style_decoder", inputs, outputs, path)


# -- numpy references -------------------------------------------------------------------


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + 1e-5) * gamma + beta


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf, otypes=[np.float64])(x / math.sqrt(2)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _merge_heads(x: np.ndarray) -> np.ndarray:
    b, heads, s, size = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, heads * size)


def encoder_reference(
    config: EncoderConfig,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    token_type_ids: np.ndarray,
) -> dict[str, np.ndarray]:
    """The encoder's outputs computed in float64 numpy."""
    w = {k: v.astype(np.float64) for k, v in encoder_weights(config).items()}
    s = input_ids.shape[1]
    x = (
        w["word_embeddings"][input_ids]
        + w["position_embeddings"][:s]
        + w["token_type_embeddings"][token_type_ids]
    )
    x = _layer_norm(x, w["embeddings_ln.gamma"], w["embeddings_ln.beta"])
    bias = ((1.0 - attention_mask.astype(np.float64)) * MASK_BIAS)[:, None, None, :]
    size = config.hidden // config.heads
    for i in range(config.layers):
        p = f"layer{i}"
        q, k, v = (_split_heads(x @ w[f"{p}.{n}.w"] + w[f"{p}.{n}.b"], config.heads) for n in "qkv")
        probs = _softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(size) + bias)
        attended = _merge_heads(probs @ v) @ w[f"{p}.o.w"] + w[f"{p}.o.b"]
        x = _layer_norm(x + attended, w[f"{p}.attention_ln.gamma"], w[f"{p}.attention_ln.beta"])
        ffn = (
            _gelu(x @ w[f"{p}.ffn_in.w"] + w[f"{p}.ffn_in.b"]) @ w[f"{p}.ffn_out.w"]
            + w[f"{p}.ffn_out.b"]
        )
        x = _layer_norm(x + ffn, w[f"{p}.output_ln.gamma"], w[f"{p}.output_ln.beta"])
    pooled = np.tanh(x[:, 0] @ w["pooler.w"] + w["pooler.b"])
    return {"logits": pooled @ w["classifier.w"] + w["classifier.b"], "last_hidden_state": x}


def decoder_reference(
    config: DecoderConfig,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    past: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The decoder's outputs computed in float64 numpy; `past` maps `past_{i}_key/value`."""
    w = {k: v.astype(np.float64) for k, v in decoder_weights(config).items()}
    past_length, length = past["past_0_key"].shape[2], input_ids.shape[1]
    positions = np.arange(past_length, past_length + length)
    h = w["wte"][input_ids] + w["wpe"][positions]
    causal = np.arange(past_length + length)[None, :] <= positions[:, None]
    visible = causal[None, None] & (attention_mask != 0)[:, None, None, :]
    bias = np.where(visible, 0.0, CAUSAL_BIAS)
    outputs = {}
    for i in range(config.layers):
        p = f"layer{i}"
        a = _layer_norm(h, w[f"{p}.ln1.gamma"], w[f"{p}.ln1.beta"])
        q, k, v = (_split_heads(a @ w[f"{p}.{n}.w"] + w[f"{p}.{n}.b"], config.heads) for n in "qkv")
        keys = np.concatenate([past[f"past_{i}_key"], k], axis=2)
        values = np.concatenate([past[f"past_{i}_value"], v], axis=2)
        outputs[f"present_{i}_key"], outputs[f"present_{i}_value"] = keys, values
        probs = _softmax(q @ keys.transpose(0, 1, 3, 2) / math.sqrt(config.head_size) + bias)
        h = h + _merge_heads(probs @ values) @ w[f"{p}.o.w"] + w[f"{p}.o.b"]
        m = _gelu(
            _layer_norm(h, w[f"{p}.ln2.gamma"], w[f"{p}.ln2.beta"]) @ w[f"{p}.mlp_in.w"]
            + w[f"{p}.mlp_in.b"]
        )
        h = h + m @ w[f"{p}.mlp_out.w"] + w[f"{p}.mlp_out.b"]
    outputs["logits"] = _layer_norm(h, w["final_ln.gamma"], w["final_ln.beta"]) @ w["wte"].T
    return outputs


# -- requests ---------------------------------------------------------------------------


def encoder_inputs(
    rng: np.random.Generator,
    rows: int,
    length: int,
    config: EncoderConfig = EncoderConfig(),
    padded_from: int | None = None,
) -> dict[str, np.ndarray]:
    """A request of `rows` sequences of `length` tokens (the first a [CLS]-like id, two
    segments); with `padded_from`, the positions from there on are padding (mask 0)."""
    ids = rng.integers(1, config.vocab, size=(rows, length), dtype=np.int64)
    mask = np.ones((rows, length), np.int64)
    types = np.zeros((rows, length), np.int64)
    types[:, length // 2 :] = 1
    if padded_from is not None:
        ids[:, padded_from:] = 0
        mask[:, padded_from:] = 0
        types[:, padded_from:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def decoder_inputs(
    rng: np.random.Generator,
    rows: int,
    length: int,
    past_length: int,
    config: DecoderConfig = DecoderConfig(),
) -> dict[str, np.ndarray]:
    """A request of `rows` sequences of `length` new tokens after `past_length` cached ones
    (random past keys and values of the scale the model's own are)."""
    inputs = {
        "input_ids": rng.integers(0, config.vocab, size=(rows, length), dtype=np.int64),
        "attention_mask": np.ones((rows, past_length + length), np.int64),
    }
    shape = (rows, config.heads, past_length, config.head_size)
    for i in range(config.layers):
        for part in ("key", "value"):
            inputs[f"past_{i}_{part}"] = rng.standard_normal(shape).astype(np.float32)
    return inputs
