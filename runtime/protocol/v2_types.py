"""Open Inference Protocol v2 request and response, as the data plane sees them.

Plain slotted dataclasses rather than pydantic models: a request is parsed once per call on
the hot path, and the codec already checks every field by hand with a precise 400 message
(pydantic would validate a 1000-float `data` list element by element only to have numpy
convert it again). Tensors are numpy arrays from the moment they are decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Request-level parameters the server understands (Triton's names); others are ignored.
TIMEOUT_PARAMETER = "timeout"  # microseconds, as tritonclient's `timeout=` sends it
BINARY_DATA_OUTPUT_PARAMETER = "binary_data_output"
BINARY_DATA_PARAMETER = "binary_data"
BINARY_DATA_SIZE_PARAMETER = "binary_data_size"
HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"

# Every infer response carries the server's own time for the request (W3C Server-Timing,
# metric "infer", in milliseconds): the span `kubeinfer_request_duration_seconds`
# observes. A shadow mirror compares a candidate's latency with its own through it, both
# measured the same way, free of the network between them.
SERVER_TIMING_HEADER = "Server-Timing"
SERVER_TIMING_METRIC = "infer"


def format_server_timing(seconds: float) -> str:
    """The Server-Timing header value for a request that took `seconds` in the server."""
    return f"{SERVER_TIMING_METRIC};dur={seconds * 1000:.3f}"


def parse_server_timing(value: str | None) -> float | None:
    """Seconds of the "infer" metric's `dur` in a Server-Timing header value; None when it
    is absent or unreadable (other metrics and parameters are skipped)."""
    if not value:
        return None
    for metric in value.split(","):
        name, *parameters = (part.strip() for part in metric.split(";"))
        if name != SERVER_TIMING_METRIC:
            continue
        for parameter in parameters:
            key, _, raw = parameter.partition("=")
            if key.strip().lower() != "dur":
                continue
            try:
                milliseconds = float(raw.strip().strip('"'))
            except ValueError:
                return None
            if not 0 <= milliseconds < float("inf"):  # NaN fails too
                return None
            return milliseconds / 1000
    return None


@dataclass(slots=True)
class InferInput:
    """One decoded input tensor; `data` already has `shape` and the datatype's dtype."""

    name: str
    datatype: str
    data: np.ndarray


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for; `binary` is None when it did not say."""

    name: str
    binary: bool | None = None


@dataclass(slots=True)
class InferRequest:
    id: str | None
    inputs: list[InferInput]
    outputs: list[RequestedOutput] | None = None
    timeout_microseconds: int | None = None
    binary_data_output: bool = False


@dataclass(slots=True)
class InferOutput:
    name: str
    datatype: str
    data: np.ndarray
    binary: bool = False


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str | None
    outputs: list[InferOutput] = field(default_factory=list)
