"""The model configuration a load generator asks for first: Triton's model configuration
extension (`GET /v2/models/{name}/config`, gRPC `ModelConfig`), in its JSON form.

Triton's perf_analyzer, the field's Open Inference Protocol load generator, reads it
before sending anything: `max_batch_size` says whether the first axis is the batch (and
then `dims` leave it out), `input`/`output` name the tensors and their types. Only what a
client reads is said: the tensors and the batch size, from the model's metadata (the
batching policy's maxBatchSize); Triton's other fields (instance groups, its own
batching) describe Triton's scheduler, not ours, and are left out. Pure.
"""

from __future__ import annotations

from typing import Any

V2_TO_CONFIG_TYPE = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
    "BF16": "TYPE_BF16",
}
"""A v2 datatype's name in Triton's model configuration (its `DataType` enum)."""


def model_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """The configuration of a model from its v2 metadata (`DataPlane.model_metadata`):
    batched (a first axis of -1 and a max batch size) or not, as the metadata says."""
    max_batch_size = int(metadata.get("parameters", {}).get("max_batch_size", 0))
    tensors = [*metadata["inputs"], *metadata["outputs"]]
    batched = max_batch_size > 0 and all(t["shape"] and t["shape"][0] == -1 for t in tensors)

    def tensor(meta: dict[str, Any]) -> dict[str, Any]:
        dims = list(meta["shape"][1:] if batched else meta["shape"])
        datatype = V2_TO_CONFIG_TYPE[meta["datatype"]]
        return {"name": meta["name"], "data_type": datatype, "dims": dims}

    return {
        "name": metadata["name"],
        "platform": metadata.get("platform", ""),
        "max_batch_size": max_batch_size if batched else 0,
        "input": [tensor(t) for t in metadata["inputs"]],
        "output": [tensor(t) for t in metadata["outputs"]],
    }
