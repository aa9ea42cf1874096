"""Small real ONNX models that tests in more than one folder build with onnx.helper
(nothing is downloaded). The MLPs the benchmarks and the demo use are in
`kubeinfer.cli.demo.mlp_models`.

`build_reduced_batch_model`: the maximum over the batch, one row whatever the batch size: a
model `kubeinfer serve` refuses (an output that does not follow the batch), so
`kubeinfer build` must refuse it too. (Models with variable axes besides the batch, which
serve, are in `models.transformer_models`.)

`build_spin_model`: inputs `x` FP32 [batch, 4] and `ids` INT32 [batch, 4], output `y` FP32
[batch, 4] = x + ids. Before answering, the graph runs an ONNX `Loop` as many times as the
largest value in `ids`: small ids cost microseconds, an id of a few million holds the
engine for seconds, as a stuck or pathological engine call would (the loop is part of the
model; ONNX Runtime runs it like any other graph).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper


def build_spin_model(path: Path) -> Path:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["carried_in", "one"], ["carried_out"])],
        "spin",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("carried_in", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("carried_out", TensorProto.FLOAT, [])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )  # fmt: skip
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "ids_f"], ["sum"]),
        helper.make_node("ReduceMax", ["ids"], ["most"], keepdims=0),
        helper.make_node("Cast", ["most"], ["trips"], to=TensorProto.INT64),
        helper.make_node("Loop", ["trips", "true", "zero"], ["spun"], body=body),
        # y = sum + 0 * spun: the loop's result feeds the output, so it is never pruned
        helper.make_node("Mul", ["spun", "zero"], ["nothing"]),
        helper.make_node("Add", ["sum", "nothing"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "spin_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("true", TensorProto.BOOL, [], [True]),
         helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kubeinfer-tests"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def expected_y(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return (x + ids.astype(np.float32)).astype(np.float32)


def build_reduced_batch_model(path: Path) -> Path:
    """The maximum over the batch: one row whatever the batch size (an output that does
    not follow the batch, which `kubeinfer serve` refuses, so `kubeinfer build` must too)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMax", ["x"], ["total"], axes=[0], keepdims=1)],
        "reduced",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["one", "width"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
