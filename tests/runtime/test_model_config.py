"""Triton's model configuration extension, which load generators (perf_analyzer) read
before anything else: `protocol.model_config` from a model's metadata as a table, then a
real `kubeinfer serve` answering it over REST and gRPC to tritonclient, equal on both, and
an unknown model refused with 404 / NOT_FOUND.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tritonclient.grpc as triton
from google.protobuf.json_format import MessageToDict
from kubeinfer.runtime.protocol.model_config import model_config
from ports import free_port
from serve_process import ServeProcess
from tritonclient.utils import InferenceServerException


def metadata(inputs: list, outputs: list, max_batch_size: int = 8) -> dict:
    return {
        "name": "m",
        "versions": ["1"],
        "platform": "OnnxRuntimeEngine",
        "inputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in inputs],
        "outputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in outputs],
        "parameters": {"max_batch_size": max_batch_size},
    }


@pytest.mark.parametrize(
    ("given", "batch", "inputs", "outputs"),
    [
        # a batch axis first everywhere: it leaves the dims, the batch size is said
        (
            metadata([("x", "FP32", [-1, 16])], [("y", "FP32", [-1, 10])]),
            8,
            [{"name": "x", "data_type": "TYPE_FP32", "dims": [16]}],
            [{"name": "y", "data_type": "TYPE_FP32", "dims": [10]}],
        ),
        # strings are Triton's TYPE_STRING; other variable axes stay -1
        (
            metadata([("t", "BYTES", [-1, -1]), ("n", "INT64", [-1, 3])], [("l", "BYTES", [-1])]),
            8,
            [
                {"name": "t", "data_type": "TYPE_STRING", "dims": [-1]},
                {"name": "n", "data_type": "TYPE_INT64", "dims": [3]},
            ],
            [{"name": "l", "data_type": "TYPE_STRING", "dims": []}],
        ),
        # a tensor whose first axis is fixed: no batch axis, the shapes as they are
        (
            metadata([("x", "FP16", [4, 16])], [("y", "FP16", [-1, 10])]),
            0,
            [{"name": "x", "data_type": "TYPE_FP16", "dims": [4, 16]}],
            [{"name": "y", "data_type": "TYPE_FP16", "dims": [-1, 10]}],
        ),
    ],
)
def test_the_configuration_says_the_batch_axis_and_the_tensors(
    given: dict, batch: int, inputs: list, outputs: list
) -> None:
    config = model_config(given)
    assert config == {
        "name": "m",
        "platform": "OnnxRuntimeEngine",
        "max_batch_size": batch,
        "input": inputs,
        "output": outputs,
    }


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
