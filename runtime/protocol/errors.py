"""Domain errors of the data plane, each carrying its HTTP status, and the one place that
turns any of them into a response of either transport.

The data plane, the codec and the batcher raise these; the HTTP transport catches
`InferenceServerError` and calls `error_response_parts`, the gRPC transport
`grpc_error_parts` (and nothing else decides a status code). The HTTP body is always
`{"error": "..."}`, the shape the Open Inference Protocol and Triton use; over gRPC the
message is the status details.

The gRPC code follows from the HTTP status (`GRPC_STATUS_BY_HTTP_STATUS`), so one error
has one meaning on both: a refusal worth retrying later (503) is UNAVAILABLE, the code
gRPC clients retry, with the same Retry-After as trailing metadata; a deadline passed
(504, and 408 for a body that did not come in time) is DEADLINE_EXCEEDED. The requests
metric counts both transports' answers by this HTTP status.
"""

from __future__ import annotations

import json


class InferenceServerError(Exception):
    """Base: `status` is the HTTP status; `headers` extra response headers;
    `close_connection`: the transport closes the connection after this answer (the rest
    of the request cannot be read, or is not worth reading)."""

    status: int = 500
    close_connection: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequest(InferenceServerError):
    """The request is malformed or does not match the model's inputs (400)."""

    status = 400


class ModelNotFound(InferenceServerError):
    """No model (or version) of that name is served here (404)."""

    status = 404


class RequestTooLarge(InferenceServerError):
    """The body is over `maxRequestBytes` (413)."""

    status = 413


REQUEST_LIMIT_HINT = (
    "maxRequestBytes, kubeinfer serve --max-request-bytes; by default a full batch "
    "(maxBatchSize rows) of the model's largest allowed inputs as JSON"
)
"""Which limit a 413 is about and how to raise it, as every 413 says."""


def over_request_limit(message: str) -> RequestTooLarge:
    """A 413 for a request over `maxRequestBytes`: `message`, then which limit that is and
    how to raise it."""
    return RequestTooLarge(f"{message} ({REQUEST_LIMIT_HINT})")


class RequestTimeout(InferenceServerError):
    """The request body stalled, or did not arrive by the request's deadline (408); the
    connection is closed, since the rest of the body may still come."""

    status = 408
    close_connection = True


class _RetryLater(InferenceServerError):
    status = 503

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_seconds)}


class Overloaded(_RetryLater):
    """The queue is full (`maxQueueSize`): refused at once so latency stays bounded (503)."""


class NotReady(_RetryLater):
    """The model is not loaded yet, or the server is draining after SIGTERM (503)."""


class DeadlineExceeded(InferenceServerError):
    """The request's deadline (counted from its arrival) passed before it ran: while its
    body was read, while it waited for a decoder or in the queue. Never executed (504)."""

    status = 504


class EngineTimeout(DeadlineExceeded):
    """The request's batch was still running on the engine at the latest deadline of its
    requests: the engine may be stuck (504). The batcher's watchdog answers it."""


class ClientGone(Exception):
    """The client closed its connection before its answer: an upload it abandoned, or a
    request it stopped waiting for. Nothing can be answered; it is counted, not logged
    as an error."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.stage = stage


class EngineFailed(InferenceServerError):
    """The engine raised while running a batch; every request of that batch gets it (500).

    The only 500 the server answers on purpose: the input was valid, the model failed."""

    status = 500


class OutputRowsMismatch(EngineFailed):
    """A batch's output does not hold one row per row the batch ran (its first axis is not
    the batch's row count): handing its rows out would answer a request with another's, or
    with nothing, so every request of the batch gets this instead (500). The message names
    the model, the output and both counts."""

    def __init__(self, model: str, output: str, rows: int, output_rows: int) -> None:
        super().__init__(
            f"model {model!r} gave output {output!r} {output_rows} rows for a batch of {rows} "
            "rows: its outputs do not line up with the requests' rows, so none is answered "
            "from them"
        )
        self.model, self.output, self.rows, self.output_rows = model, output, rows, output_rows


class InternalError(InferenceServerError):
    """Anything unexpected, logged by the transport that caught it and answered 500
    without its details: the server's bug, not the client's."""

    status = 500

    def __init__(self) -> None:
        super().__init__("internal server error")


def error_response_parts(error: InferenceServerError) -> tuple[int, bytes, dict[str, str]]:
    """(status, JSON body, headers) for an error: the single status mapping of the server."""
    body = json.dumps({"error": error.message}).encode()
    return error.status, body, {"Content-Type": "application/json", **error.headers}


GRPC_STATUS_BY_HTTP_STATUS = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
"""The name of the `grpc.StatusCode` of each status the server answers (a name, so that
this module, and REST, never import grpc)."""


def grpc_error_parts(error: InferenceServerError) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """(gRPC status code name, details, trailing metadata) for an error: the gRPC side of
    the single status mapping (metadata keys are lower case, as gRPC requires)."""
    code = GRPC_STATUS_BY_HTTP_STATUS.get(error.status, "INTERNAL")
    return code, error.message, tuple((k.lower(), v) for k, v in error.headers.items())
