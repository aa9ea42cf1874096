"""The Open Inference Protocol's gRPC messages <-> the data plane's types:
`from_model_infer_request` and `to_model_infer_response` (and the metadata's), direction
in the name.

Inputs come either all in `raw_input_contents` (little-endian bytes, one entry per input
in order: the form Triton's clients send) or all as typed `contents` (the repeated field
of the input's datatype: `fp32_contents` for FP32, `int_contents` for INT8/16/32,
`bytes_contents` for BYTES, ...); FP16 has no typed field and comes raw only. A raw BYTES
tensor is Triton's serialized form: each element a 4-byte little-endian length and its
bytes (`bytes_tensors`).

Everything a client can get wrong raises `InvalidRequest` naming the input, before any
tensor is built: a shape is checked against the model's largest input (`DecodeLimits`)
and against its data's length, a typed value against the range of its datatype (an INT8
of 300 is refused, never wrapped).

Outputs go raw (`raw_output_contents`) by default, as Triton answers, and as typed
`contents` when the request asks for them: its `binary_data_output` parameter false, or
`binary_data: false` on its requested outputs, the parameters REST uses for the same
choice. A response is all raw or all typed (the protocol allows no mix), so a request
asking both ways is refused; FP16 outputs, which have no typed field, make it raw.

Request parameters read here (Triton's names, as REST): `timeout` (int64, microseconds)
and `binary_data_output` (bool); others are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubeinfer.runtime.engines.base import V2_TO_NUMPY
from kubeinfer.runtime.grpc_service import open_inference_grpc_pb2 as pb
from kubeinfer.runtime.protocol import bytes_tensors
from kubeinfer.runtime.protocol.errors import InvalidRequest
from kubeinfer.runtime.protocol.json_tensors import MAX_RANK
from kubeinfer.runtime.protocol.tensor_codec import NO_LIMITS, DecodeLimits
from kubeinfer.runtime.protocol.v2_types import (
    BINARY_DATA_OUTPUT_PARAMETER,
    BINARY_DATA_PARAMETER,
    TIMEOUT_PARAMETER,
    InferInput,
    InferRequest,
    InferResponse,
    RequestedOutput,
)

CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The typed field of each datatype that has one (FP16 travels raw only)."""

_FIELD_DTYPE: dict[str, np.dtype] = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}
_ALL_FIELDS = (*_FIELD_DTYPE, "bytes_contents")
_BYTES = "BYTES"


@dataclass(frozen=True, slots=True)
class ReceivedInfer:
    """A ModelInfer request as the server reads it: the message and its size on the wire.
    gRPC hands the deserializer the message's bytes, whose length is free; the parsed
    message's `ByteSize()` serialises it all again (upb), a copy of every tensor byte on
    the event loop, which was the largest line of a gRPC server's profile under
    ResNet-50-sized requests."""

    message: pb.ModelInferRequest
    wire_bytes: int


def read_infer_request(data: bytes) -> ReceivedInfer:
    """ModelInfer's request deserializer (`server.service_handlers`)."""
    return ReceivedInfer(pb.ModelInferRequest.FromString(data), len(data))


def typed_elements(message: pb.ModelInferRequest) -> int:
    """Elements the request's typed contents hold (0 when its inputs are raw): what
    converting them costs, for the transport's choice of a worker thread."""
    if message.raw_input_contents:
        return 0
    return sum(
        len(getattr(tensor.contents, CONTENTS_FIELD.get(tensor.datatype, "fp32_contents")))
        for tensor in message.inputs
    )


def _parameter(parameters: Any, name: str, kind: str, where: str) -> Any:
    """A parameter's value when it is of `kind` (the InferParameter oneof's field), None
    when absent; another kind is a client's mistake."""
    if name not in parameters:
        return None
    parameter = parameters[name]
    given = parameter.WhichOneof("parameter_choice")
    if given != kind:
        raise InvalidRequest(f"{where}parameters.{name} must be given as {kind}, not {given}")
    return getattr(parameter, kind)


def _shape(tensor: pb.ModelInferRequest.InferInputTensor, limits: DecodeLimits) -> tuple[int, ...]:
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise InvalidRequest(f"input {tensor.name!r}: shape {list(shape)} has a negative dimension")
    if len(shape) > MAX_RANK:
        raise InvalidRequest(f"input {tensor.name!r}: shape has {len(shape)} dimensions")
    count = math.prod(shape)
    if limits.max_elements is not None and count > limits.max_elements:
        raise InvalidRequest(
            f"input {tensor.name!r}: shape {list(shape)} declares {count} elements; this model "
            f"takes at most {limits.max_elements} per input"
        )
    return shape


def _from_raw(
    tensor: pb.ModelInferRequest.InferInputTensor, shape: tuple[int, ...], raw: bytes
) -> np.ndarray:
    if tensor.datatype == _BYTES:
        where = f"input {tensor.name!r}: raw_input_contents"
        array = bytes_tensors.deserialize(raw, math.prod(shape), where)
        return bytes_tensors.check_text(array, where).reshape(shape)
    dtype = V2_TO_NUMPY[tensor.datatype]
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise InvalidRequest(
            f"input {tensor.name!r}: raw_input_contents holds {len(raw)} bytes; shape "
            f"{list(shape)} of {tensor.datatype} takes {expected}"
        )
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)


def _from_contents(
    tensor: pb.ModelInferRequest.InferInputTensor, shape: tuple[int, ...]
) -> np.ndarray:
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise InvalidRequest(
            f"input {tensor.name!r}: {tensor.datatype} has no typed contents; send it in "
            "raw_input_contents"
        )
    contents = tensor.contents
    for other in _ALL_FIELDS:
        if other != field and len(getattr(contents, other)):
            raise InvalidRequest(
                f"input {tensor.name!r} is {tensor.datatype}: its data goes in "
                f"contents.{field}, not contents.{other}"
            )
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidRequest(
            f"input {tensor.name!r}: contents.{field} holds {len(values)} values; shape "
            f"{list(shape)} takes {count}"
        )
    if field == "bytes_contents":
        array = bytes_tensors.to_bytes_array(values, shape)
        return bytes_tensors.check_text(array, f"input {tensor.name!r}: contents.bytes_contents")
    wire = np.array(values, dtype=_FIELD_DTYPE[field])
    target = V2_TO_NUMPY[tensor.datatype]
    if target != wire.dtype and wire.size:
        info = np.iinfo(target)
        low, high = wire.min(), wire.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise InvalidRequest(
                f"input {tensor.name!r}: {bad} is out of the range of {tensor.datatype}"
            )
        wire = wire.astype(target)
    return wire.reshape(shape)


def from_model_infer_request(
    message: pb.ModelInferRequest, limits: DecodeLimits = NO_LIMITS
) -> InferRequest:
    """The data plane's request from a ModelInferRequest (its model name and version are
    the transport's, for admission)."""
    if not message.inputs:
        raise InvalidRequest("inputs must not be empty")
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise InvalidRequest(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs; "
            "give one per input, in the order of inputs"
        )
    inputs = []
    for index, tensor in enumerate(message.inputs):
        if not tensor.name:
            raise InvalidRequest(f"inputs[{index}].name must not be empty")
        if tensor.datatype not in V2_TO_NUMPY:
            raise InvalidRequest(
                f"input {tensor.name!r}: datatype {tensor.datatype!r} is not supported "
                f"(one of {', '.join(V2_TO_NUMPY)})"
            )
        shape = _shape(tensor, limits)
        if raw:
            if tensor.HasField("contents"):
                raise InvalidRequest(
                    f"input {tensor.name!r} has contents beside raw_input_contents; use one"
                )
            data = _from_raw(tensor, shape, raw[index])
        else:
            data = _from_contents(tensor, shape)
        inputs.append(InferInput(tensor.name, tensor.datatype, data))
    parameters = message.parameters
    timeout = _parameter(parameters, TIMEOUT_PARAMETER, "int64_param", "")
    if timeout is not None and timeout < 0:
        raise InvalidRequest("parameters.timeout must be >= 0 (microseconds)")
    raw_output = _parameter(parameters, BINARY_DATA_OUTPUT_PARAMETER, "bool_param", "")
    default_raw = True if raw_output is None else raw_output
    outputs = None
    if message.outputs:
        outputs = []
        for index, output in enumerate(message.outputs):
            where = f"outputs[{index}]."
            binary = _parameter(output.parameters, BINARY_DATA_PARAMETER, "bool_param", where)
            outputs.append(RequestedOutput(output.name, binary))
        if len({default_raw if o.binary is None else o.binary for o in outputs}) > 1:
            raise InvalidRequest(
                "outputs ask for raw and for typed contents at once; a gRPC response has "
                "either raw_output_contents for every output or contents for every one"
            )
    return InferRequest(
        id=message.id or None,
        inputs=inputs,
        outputs=outputs,
        timeout_microseconds=timeout,
        binary_data_output=default_raw,
    )


def to_model_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    """The ModelInferResponse of an answer: raw unless every output asked for typed
    contents (and has a typed field)."""
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
    )
    raw = any(o.binary or o.datatype not in CONTENTS_FIELD for o in response.outputs)
    for output in response.outputs:
        tensor = message.outputs.add(
            name=output.name, datatype=output.datatype, shape=output.data.shape
        )
        if raw:
            message.raw_output_contents.append(bytes_tensors.to_raw(output.data))
        else:
            values = getattr(tensor.contents, CONTENTS_FIELD[output.datatype])
            if output.datatype == _BYTES:
                values.extend(bytes_tensors.as_bytes(e) for e in np.ravel(output.data))
            else:
                values.extend(np.ravel(output.data).tolist())
    return message


def to_model_metadata_response(metadata: dict[str, Any]) -> pb.ModelMetadataResponse:
    """The ModelMetadataResponse of `DataPlane.model_metadata` (its parameters have no
    place in the gRPC message)."""

    def tensors(specs: list[dict[str, Any]]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
        return [
            pb.ModelMetadataResponse.TensorMetadata(
                name=s["name"], datatype=s["datatype"], shape=s["shape"]
            )
            for s in specs
        ]

    return pb.ModelMetadataResponse(
        name=metadata["name"],
        versions=metadata["versions"],
        platform=metadata["platform"],
        inputs=tensors(metadata["inputs"]),
        outputs=tensors(metadata["outputs"]),
    )


def to_model_config_response(config: dict[str, Any]) -> pb.ModelConfigResponse:
    """The ModelConfigResponse of `protocol.model_config`'s JSON form (Triton's)."""

    def tensors(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"name": s["name"], "data_type": pb.DataType.Value(s["data_type"]), "dims": s["dims"]}
            for s in specs
        ]

    return pb.ModelConfigResponse(
        config=pb.ModelConfig(
            name=config["name"],
            platform=config["platform"],
            max_batch_size=config["max_batch_size"],
            input=[pb.ModelInput(**t) for t in tensors(config["input"])],
            output=[pb.ModelOutput(**t) for t in tensors(config["output"])],
        )
    )
