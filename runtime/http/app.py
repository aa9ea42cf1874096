"""The HTTP transport: `create_app(dataplane)` and the v2 routes, which only translate HTTP
to the `DataPlane` and back (the data plane is assembled, started and stopped by
`kubeinfer.runtime.serving`, once for both transports).

Why aiohttp: it is already a dependency (kopf runs on it), its HTTP parser is in C, and a
plain `web.Application` adds only a few microseconds per request on top of the parser,
which matters because the small model's benchmark compares our p50 at one client with an
unbatched server's to within 0.3 ms. No ASGI layer, no request validation framework: the
codec checks the body itself and every error goes through `error_response_parts`.

Routes (also under `/v2/models/{name}/versions/{version}/...`):
`GET /v2/health/live`, `GET /v2/health/ready`, `GET /v2`, `GET /v2/models/{name}`,
`GET /v2/models/{name}/ready`, `GET /v2/models/{name}/config` (Triton's model
configuration extension, which load generators read first: `protocol.model_config`),
`POST /v2/models/{name}/infer`, `GET /metrics`, and
`GET /v2/shadow` (the running aggregates of the shadow candidate this runtime mirrors to,
see `kubeinfer.runtime.shadow`), `GET /v2/quality` (the quality watch's running figures,
JSON) and `GET /v2/quality/exemplars` (the watch's worst input rows of its window, an
`.npz` as `application/octet-stream`, see `kubeinfer.runtime.shadow.exemplars`), and
`GET /v2/batching` (the batching policy and the queue delay and preferred batch size in
force, JSON; see `kubeinfer.runtime.batching.adaptive`), and `GET /v2/known-answers` (the
verdicts of the engine's known-answer set at start and latest, JSON) and `POST
/v2/known-answers` (the set run again at the lowest priority, answered with the verdicts;
see `kubeinfer.runtime.known_answers`).

While a quality watch names a slice header, the infer route reads that one header's raw
value and hands it to the data plane (one dictionary lookup; the mirror sanitizes and
bounds it, and only for the requests it samples).

Every infer response carries `Server-Timing: infer;dur=<ms>`, the server's own time for
the request (the span of `kubeinfer_request_duration_seconds`): a shadow mirror reads a
candidate's latency from it, measured the same way as its own.

An infer request is admitted before its body is read (`DataPlane.admitted`): a server
that cannot take it (its queue full, draining) answers 503 with Retry-After at once, and
aiohttp reads and drops the unread body afterwards (`lingering_time`), so a keep-alive
connection stays in step. Its body is read by `body.py`, and a client that leaves (an
abandoned upload, or a request it stopped waiting for: the runner cancels the handler,
`handler_cancellation`) is counted as cancelled, not answered; a request it abandoned
before it ran is never executed. Once draining has begun, every answer closes its
connection (`Connection: close`). Excess load is better refused before it reaches the
process: see docs/overload.md.
"""

from __future__ import annotations

import json
import logging
import math
import time
from functools import partial
from typing import Any

from aiohttp import web
from kubeinfer.runtime.dataplane import DataPlane
from kubeinfer.runtime.http.body import content_encoding, inflate, read_body
from kubeinfer.runtime.known_answers.runner import known_answers_body
from kubeinfer.runtime.protocol.codec_pool import OFFLOAD_BYTES
from kubeinfer.runtime.protocol.errors import (
    ClientGone,
    InferenceServerError,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    error_response_parts,
    over_request_limit,
)
from kubeinfer.runtime.protocol.tensor_codec import decode_infer_request, encode_infer_response
from kubeinfer.runtime.protocol.v2_types import (
    HEADER_LENGTH_HEADER,
    SERVER_TIMING_HEADER,
    InferResponse,
    format_server_timing,
)
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

DATAPLANE = web.AppKey("dataplane", DataPlane)

# auto_decompress off: `body.inflate` does it, bounded, with our errors (see body.py).
# handler_cancellation on: a client that leaves cancels its handler, so a request it
# abandoned is dropped from the queue, never executed, and counted as cancelled.
RUNNER_OPTIONS: dict[str, Any] = {
    "access_log": None,
    "auto_decompress": False,
    "handler_cancellation": True,
}


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(obj).encode(), status=status, content_type="application/json"
    )


def _error(error: InferenceServerError, seconds: float | None = None) -> web.Response:
    status, body, headers = error_response_parts(error)
    if seconds is not None:
        headers[SERVER_TIMING_HEADER] = format_server_timing(seconds)
    response = web.Response(body=body, status=status, headers=headers)
    if error.close_connection:
        response.force_close()
    return response


def _model(request: web.Request) -> tuple[str, str | None]:
    """The model name and version (None: any) the request's path names."""
    return request.match_info["name"], request.match_info.get("version")


async def live(request: web.Request) -> web.Response:
    is_live = request.app[DATAPLANE].live()
    return _json({"live": is_live}, 200 if is_live else 503)


async def ready(request: web.Request) -> web.Response:
    is_ready = request.app[DATAPLANE].ready()
    return _json({"ready": is_ready}, 200 if is_ready else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].model_metadata(*_model(request)))


async def model_configuration(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].model_config(*_model(request)))


async def model_ready(request: web.Request) -> web.Response:
    is_ready = request.app[DATAPLANE].model_ready(*_model(request))
    return _json({"name": request.match_info["name"], "ready": is_ready}, 200 if is_ready else 503)


def _header_length(request: web.Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH_HEADER)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"{HEADER_LENGTH_HEADER} must be an integer") from None


async def infer(request: web.Request) -> web.Response:
    arrived = time.monotonic()
    dataplane = request.app[DATAPLANE]
    try:
        with dataplane.admitted(*_model(request)) as admission:
            header_length = _header_length(request)
            body = await _read_inflated(request, dataplane, admission.deadline, header_length)
            admission.stage = "waiting"
            json_bytes = len(body) if header_length is None else header_length
            decoded = await dataplane.offloaded(
                admission, json_bytes >= OFFLOAD_BYTES,  # binary tensors are views: no work
                decode_infer_request, body, header_length, dataplane.limits,
            )  # fmt: skip
            header = dataplane.slice_header
            slice_value = request.headers.get(header) if header else None
            (payload, response_header_length), seconds = await dataplane.infer_decoded(
                admission, decoded, partial(_encode, dataplane), slice_value
            )
    except InferenceServerError as error:
        return _error(error, time.monotonic() - arrived)
    except ClientGone as gone:
        log.debug("Client left before its answer stage=%s reason=%s", gone.stage, gone)
        return web.Response(status=400)  # nobody reads it: the connection is gone
    timing = format_server_timing(seconds)
    if response_header_length is None:
        return web.Response(
            body=payload,
            headers={"Content-Type": "application/json", SERVER_TIMING_HEADER: timing},
        )
    return web.Response(
        body=payload,
        headers={
            HEADER_LENGTH_HEADER: str(response_header_length),
            "Content-Type": "application/octet-stream",
            SERVER_TIMING_HEADER: timing,
        },
    )


async def _read_inflated(
    request: web.Request, dataplane: DataPlane, deadline: float, header_length: int | None
) -> bytes | memoryview:
    """The request's body (`body.read_body`), inflated on a codec thread when it comes
    compressed, both bounded by the request limit."""
    config, limit = dataplane.config, dataplane.max_request_bytes
    encoding = content_encoding(request)
    body = await read_body(
        request, limit, deadline, config.body_read_timeout_seconds, time.monotonic
    )
    if encoding is None:
        return body
    return await dataplane.codec.run(
        deadline, inflate, body, encoding, limit, dataplane.limits.max_json_values, header_length
    )


async def _encode(dataplane: DataPlane, response: InferResponse) -> tuple[bytes, int | None]:
    """The response body (JSON, or with the binary extension) and its header length;
    large JSON is written on a codec thread."""
    json_tensor_bytes = sum(o.data.nbytes for o in response.outputs if not o.binary)
    if json_tensor_bytes >= OFFLOAD_BYTES // 4:
        # JSON writes about 4 bytes of text per byte of float32 (a quarter of the
        # threshold's worth of tensors makes a body of about the threshold).
        return await dataplane.codec.run(math.inf, encode_infer_response, response)
    return encode_infer_response(response)


async def shadow(request: web.Request) -> web.Response:
    controller = request.app[DATAPLANE].shadow
    assert controller is not None  # serving.assemble always makes one
    return _json(controller.status())


async def quality(request: web.Request) -> web.Response:
    controller = request.app[DATAPLANE].shadow
    assert controller is not None  # serving.assemble always makes one
    return _json(controller.quality_status())


async def quality_exemplars(request: web.Request) -> web.Response:
    controller = request.app[DATAPLANE].shadow
    assert controller is not None
    return web.Response(
        body=controller.quality_exemplars(),
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Disposition": 'attachment; filename="exemplars.npz"',
            "Cache-Control": "no-store",
        },
    )


async def batching(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].batcher.batching_status())


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[DATAPLANE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@web.middleware
async def _json_http_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """The data plane's errors (`error_response_parts`), aiohttp's own (no such route,
    wrong method, body over client_max_size) as JSON `{"error": ...}` like ours, and
    anything unexpected as a logged JSON 500 rather than a traceback page. Once draining
    has begun, closes every connection after its answer."""
    response = await _answer(request, handler)
    if request.app[DATAPLANE].draining:
        response.force_close()
    return response


async def _answer(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except InferenceServerError as error:  # the data plane's refusals, in one place
        return _error(error)
    except web.HTTPException as http_error:
        if http_error.status == 413:
            limit = request.app[DATAPLANE].max_request_bytes
            return _error(
                over_request_limit(f"the request body is over the limit of {limit} bytes")
            )
        if http_error.status == 404:
            return _error(ModelNotFound(f"no route {request.method} {request.path}"))
        return web.Response(
            body=json.dumps({"error": http_error.reason}).encode(),
            status=http_error.status,
            content_type="application/json",
        )
    except Exception:
        log.exception("Request failed unexpectedly method=%s path=%s", request.method, request.path)
        return _error(InternalError())


async def known_answers(request: web.Request) -> web.Response:
    """The known-answer verdicts; a POST runs the set again first (when idle)."""
    dataplane = request.app[DATAPLANE]
    if request.method == "POST":
        await dataplane.check_known_answers()
    return _json(known_answers_body(dataplane.known_answers))


def create_app(dataplane: DataPlane) -> web.Application:
    """The v2 routes over `dataplane` (`serving.assemble` makes it). Starting and stopping
    the data plane is its owner's (`serving.serve_transports`), not the app's."""
    app = web.Application(
        client_max_size=dataplane.max_request_bytes, middlewares=[_json_http_errors]
    )
    app[DATAPLANE] = dataplane
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2", server_metadata)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.router.add_get(prefix, model_metadata)
        app.router.add_get(prefix + "/ready", model_ready)
        app.router.add_get(prefix + "/config", model_configuration)
        app.router.add_post(prefix + "/infer", infer)
    app.router.add_get("/v2/shadow", shadow)
    app.router.add_get("/v2/quality", quality)
    app.router.add_get("/v2/quality/exemplars", quality_exemplars)
    app.router.add_get("/v2/batching", batching)
    app.router.add_get("/v2/known-answers", known_answers)
    app.router.add_post("/v2/known-answers", known_answers)
    app.router.add_get("/metrics", metrics)
    return app
