"""Triton's model configuration extension, which load generators (perf_analyzer) read
before anything else: the Rust data plane's answer from a model's tensors as a table
(stand-in engines of those tensors, served in process), the engine's platform named in it
and in the metadata, then a real `kubeinfer serve` answering it over REST and gRPC to
tritonclient, equal on both, and an unknown model refused with 404 / NOT_FOUND.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tritonclient.grpc as triton
from google.protobuf.json_format import MessageToDict
from kubeinfer.contract.runtime_config import BatchingPolicy, EngineSource, RuntimeConfig
from kubeinfer.runtime.engines.base import TensorSpec
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from ports import free_port
from rust_served import rust_served
from serve_process import ServeProcess
from tritonclient.utils import InferenceServerException


class UnusedSlot:
    def input_views(self, rows: int, shape=None):
        raise AssertionError("no request is served")

    def run(self, rows: int, shape=None):
        raise AssertionError("no request is served")

    def close(self) -> None:
        pass


class TensorsOnly:
    """An engine that has only its tensors: what the configuration is made from."""

    max_batch_size = 8
    default_execution_slots = 1

    def __init__(self, inputs: list, outputs: list) -> None:
        self.inputs = tuple(TensorSpec(n, d, tuple(s)) for n, d, s in inputs)
        self.outputs = tuple(TensorSpec(n, d, tuple(s)) for n, d, s in outputs)

    def create_slot(self) -> UnusedSlot:
        return UnusedSlot()


def config(name: str = "m") -> RuntimeConfig:
    return RuntimeConfig(
        model_name=name, engine=EngineSource(onnx_path="m.onnx"), host="127.0.0.1",
        batching=BatchingPolicy(max_batch_size=8),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("inputs", "outputs", "batch", "config_inputs", "config_outputs"),
    [
        # a batch axis first everywhere: it leaves the dims, the batch size is said
        (
            [("x", "FP32", [-1, 16])], [("y", "FP32", [-1, 10])],
            8,
            [{"name": "x", "data_type": "TYPE_FP32", "dims": [16]}],
            [{"name": "y", "data_type": "TYPE_FP32", "dims": [10]}],
        ),
        # strings are Triton's TYPE_STRING; other variable axes stay -1
        (
            [("t", "BYTES", [-1, -1]), ("n", "INT64", [-1, 3])], [("l", "BYTES", [-1])],
            8,
            [
                {"name": "t", "data_type": "TYPE_STRING", "dims": [-1]},
                {"name": "n", "data_type": "TYPE_INT64", "dims": [3]},
            ],
            [{"name": "l", "data_type": "TYPE_STRING", "dims": []}],
        ),
        # a tensor whose first axis is fixed: no batch axis, the shapes as they are
        (
            [("x", "FP16", [4, 16])], [("y", "FP16", [-1, 10])],
            0,
            [{"name": "x", "data_type": "TYPE_FP16", "dims": [4, 16]}],
            [{"name": "y", "data_type": "TYPE_FP16", "dims": [-1, 10]}],
        ),
    ],
)  # fmt: skip
def test_the_configuration_says_the_batch_axis_and_the_tensors(
    inputs: list, outputs: list, batch: int, config_inputs: list, config_outputs: list
) -> None:
    with rust_served(config(), TensorsOnly(inputs, outputs)) as served:
        answer = served.get_json("/v2/models/m/config")
    assert answer == {
        "name": "m",
        "platform": "TensorsOnly",  # the engine's class, as for any engine without its own
        "max_batch_size": batch,
        "input": config_inputs,
        "output": config_outputs,
    }


def test_the_configuration_and_the_metadata_name_the_engines_platform(tiny_model: Path) -> None:
    engine = OnnxRuntimeEngine(tiny_model, 8, intra_op_threads=1)
    try:
        with rust_served(config("tiny"), engine) as served:
            platforms = {served.get_json(f"/v2/models/tiny{path}")["platform"]
                         for path in ("", "/config")}  # fmt: skip
    finally:
        engine.close()
    assert platforms == {"OnnxRuntimeEngine"}


@pytest.mark.slow
def test_serve_answers_the_configuration_over_rest_and_grpc(tiny_model: Path) -> None:
    grpc_port = free_port()
    with ServeProcess(
        tiny_model, "tiny", "--grpc-port", str(grpc_port), "--max-batch-size", "16"
    ) as served:
        status, _, body = served.request("GET", "/v2/models/tiny/config")
        assert status == 200, body
        rest = json.loads(body)
        assert rest["max_batch_size"] == 16
        assert rest["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [16]}]
        assert rest["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]}]
        status, _, _ = served.request("GET", "/v2/models/tiny/versions/1/config")
        assert status == 200
        status, _, body = served.request("GET", "/v2/models/other/config")
        assert status == 404 and "other" in json.loads(body)["error"]

        client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            answer = client.get_model_config("tiny").config  # Triton's own message parses it
            over_grpc = MessageToDict(answer, preserving_proto_field_name=True)
            assert over_grpc["max_batch_size"] == 16
            assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]])
                    for t in over_grpc["input"] + over_grpc["output"]] == [
                ("input", "TYPE_FP32", [16]), ("logits", "TYPE_FP32", [10]),
            ]  # fmt: skip
            with pytest.raises(InferenceServerException) as refused:
                client.get_model_config("other")
            assert refused.value.status() == "StatusCode.NOT_FOUND"
        finally:
            client.close()
        assert served.stop() == 0, served.output()
