"""Deterministic ONNX models for the demo, the tests and the benchmark.

Real models, built with onnx.helper from a seeded generator: the same arguments give the
same bytes on every machine, so digests and expected outputs are reproducible. Nothing is
downloaded.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def build_mlp(
    path: Path,
    input_size: int = 512,
    hidden_sizes: tuple[int, ...] = (1024, 1024, 1024),
    output_size: int = 128,
    seed: int = 0,
    input_name: str = "input",
    output_name: str = "logits",
) -> Path:
    """Writes an MLP `[batch, input_size] -> Relu hidden layers -> [batch, output_size]`
    (a classifier-shaped output: softmax is left to the client, as logits are)."""
    rng = np.random.default_rng(seed)
    sizes = [input_size, *hidden_sizes, output_size]
    nodes, initializers = [], []
    current = input_name
    for layer, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        weight = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        bias = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
        initializers += [
            numpy_helper.from_array(weight, f"w{layer}"),
            numpy_helper.from_array(bias, f"b{layer}"),
        ]
        last = layer == len(sizes) - 2
        gemm_out = output_name if last else f"h{layer}_linear"
        nodes.append(helper.make_node("Gemm", [current, f"w{layer}", f"b{layer}"], [gemm_out]))
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [f"h{layer}"]))
            current = f"h{layer}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", input_size])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", output_size])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kubeinfer"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def build_small_mlp(path: Path, seed: int = 0) -> Path:
    """The overhead-bound model: [batch,512] -> 3x1024 Relu -> [batch,128] (~9 MB)."""
    return build_mlp(path, 512, (1024, 1024, 1024), 128, seed)


def build_memory_bound_mlp(path: Path, seed: int = 0) -> Path:
    """The memory-bound model: ~170 MB of fp32 weights, far beyond the CPU caches, so
    batch 1 is bound by memory bandwidth as GPU inference of real models is."""
    return build_mlp(path, 1024, (4096, 4096, 4096), 1000, seed)


def build_tiny_mlp(path: Path, seed: int = 0) -> Path:
    """A fast model for tests: [batch,16] -> 32 Relu -> [batch,10]."""
    return build_mlp(path, 16, (32,), 10, seed)
