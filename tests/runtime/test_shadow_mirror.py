"""The mirror's mechanism, in-process against real HTTP servers on loopback (the Rust data
plane serving the tiny demo model, and scripted aiohttp candidates that are slow, fail,
or answer wrongly):

- what goes to the candidate: a v2 request with binary inputs and `binary_data_output`,
  the mirror's timeout as its `timeout` parameter, decoding to exactly the serving's
  inputs; the codec's request/response pair round-trips and refuses a garbled answer;
- a kubeinfer candidate of the same model is compared output by output, its latency
  taken from its Server-Timing; without that header the round trip stands in;
- bounds: a slow candidate times out, the queue holds at most maxQueueSize requests and
  maxQueuedBytes of tensors, the rest is dropped, and `offer` never waits;
- a candidate that refuses connections, answers 500 or garbage is counted
  `candidate_error`, logged as one WARNING (no traceback), never raised; one that
  refuses is not tried again until its backoff (0.25 s, doubling) has passed;
- an answer of another shape is a mismatch;
- `close()` cancels work in flight at once and records nothing after;
- `ShadowController.apply`: a new share keeps the aggregates, another candidate restarts
  them and removes the old series, no target turns mirroring off.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
from aiohttp import web
from kubeinfer.contract.runtime_config import MirrorPolicy, MirrorTarget, RuntimeConfig
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from kubeinfer.runtime.protocol.tensor_codec import (
    InvalidResponse,
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
)
from kubeinfer.runtime.protocol.v2_types import (
    HEADER_LENGTH_HEADER,
    InferInput,
    InferOutput,
    InferResponse,
)
from kubeinfer.runtime.shadow.aggregates import RunningAggregates, ShadowMetrics
from kubeinfer.runtime.shadow.controller import ShadowController
from kubeinfer.runtime.shadow.mirror import Mirror
from prometheus_client import CollectorRegistry, generate_latest
from rust_served import rust_served
from waiting import eventually

X = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
LOGITS = np.random.default_rng(2).standard_normal((2, 10)).astype(np.float32)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    # A short shutdown: a scripted candidate still sleeping in a handler is not waited for.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


class Scripted:
    """A candidate whose answer a test decides: `answer(request_body, header_length)` ->
    (status, body, headers), after `delay` seconds. Records what it was sent."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.received: list[tuple[bytes, dict[str, str]]] = []
        self.arrived = asyncio.Event()
        self.answer: Callable[[bytes, int | None], tuple[int, bytes, dict[str, str]]] = echo

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.append((body, dict(request.headers)))
        self.arrived.set()
        await asyncio.sleep(self.delay)  # not a wait: the candidate's answer is this slow
        length = request.headers.get(HEADER_LENGTH_HEADER)
        status, payload, headers = self.answer(body, int(length) if length else None)
        return web.Response(status=status, body=payload, headers=headers)


def echo(body: bytes, header_length: int | None) -> tuple[int, bytes, dict[str, str]]:
    """Answers LOGITS as a kubeinfer server would, binary, without Server-Timing."""
    response = InferResponse("m", "2", None, [InferOutput("logits", "FP32", LOGITS, True)])
    payload, length = encode_infer_response(response)
    return 200, payload, {HEADER_LENGTH_HEADER: str(length)}


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Scripted, str]]:
    candidate = Scripted()
    app = web.Application()
    app.router.add_post("/v2/models/m/infer", candidate.handle)
    runner, url = await serve(app)
    yield candidate, url
    await runner.cleanup()


def target(url: str, percent: int = 100, **policy: int) -> MirrorTarget:
    return MirrorTarget(url=url, model_name="m", candidate_version="2",
                        candidate_digest="sha256:c", traffic_percent=percent,
                        policy=MirrorPolicy(**policy))  # fmt: skip


def aggregates_for(to: MirrorTarget) -> RunningAggregates:
    return RunningAggregates(to, "m", "1", ShadowMetrics(CollectorRegistry()))


INPUTS = {"input": ("FP32", X)}
SERVING = {"logits": ("FP32", LOGITS)}


# --------------------------------------------------------------------------- the codec


def test_the_request_and_response_codecs_round_trip_bit_exact() -> None:
    ints = np.arange(6, dtype=np.int64).reshape(2, 3)
    body, length = encode_infer_request(
        [InferInput("input", "FP32", X), InferInput("ids", "INT64", ints)],
        request_id="r1",
        timeout_microseconds=250_000,
    )
    request = decode_infer_request(body, length)
    assert request.id == "r1" and request.timeout_microseconds == 250_000
    assert request.binary_data_output is True and request.outputs is None
    np.testing.assert_array_equal(request.inputs[0].data, X)
    np.testing.assert_array_equal(request.inputs[1].data, ints)

    response = InferResponse("m", "2", "r1", [
        InferOutput("logits", "FP32", LOGITS, True), InferOutput("n", "INT32", ints[0], False),
    ])  # fmt: skip
    decoded = decode_infer_response(*encode_infer_response(response))
    assert [(o.name, o.datatype, o.binary) for o in decoded.outputs] == [
        ("logits", "FP32", True), ("n", "INT32", False),
    ]  # fmt: skip
    np.testing.assert_array_equal(decoded.outputs[0].data, LOGITS)  # bit-exact floats
    np.testing.assert_array_equal(decoded.outputs[1].data, ints[0])


@pytest.mark.parametrize(
    ("body", "length", "reason"),
    [
        (b"<html>502</html>", None, "malformed JSON response"),
        (b'{"outputs": 3}', None, "outputs must be a list"),
        (orjson.dumps({"outputs": [{"name": "y", "datatype": "FP32", "shape": [2],
                                    "parameters": {"binary_data_size": 8}}]}), None,
         "output 'y': binary_data_size 8 runs past"),
        (b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [3], "data": [1]}]}',
         None, "output 'y': data has 1 elements"),
    ],
)  # fmt: skip
def test_a_garbled_answer_is_an_invalid_response(body: bytes, length, reason: str) -> None:
    with pytest.raises(InvalidResponse, match=reason):
        decode_infer_response(body, length)


# --------------------------------------------------------------------------- the mirror


async def test_the_candidate_gets_binary_inputs_and_is_asked_for_binary_outputs(
    scripted,
) -> None:
    candidate, url = scripted
    to = target(url, timeout_milliseconds=1500)
    aggregates = aggregates_for(to)
    mirror = Mirror(to, aggregates)
    await mirror.start()
    try:
        mirror.offer(INPUTS, SERVING, 0.003)
        await eventually(
            lambda: aggregates.outcomes["compared"] == 1,
            what="1 compared",
            every=0.005,
            in_thread=False,
        )
    finally:
        await mirror.close()
    body, headers = candidate.received[0]
    length = int(headers[HEADER_LENGTH_HEADER])
    header = orjson.loads(body[:length])
    assert header["parameters"] == {"binary_data_output": True, "timeout": 1_500_000}
    assert header["inputs"][0]["parameters"] == {"binary_data_size": X.nbytes}
    np.testing.assert_array_equal(decode_infer_request(body, length).inputs[0].data, X)
    status = aggregates.status()
    assert status["maxAbsDifference"] == 0 and status["top1"]["agreement"] == 1.0


async def test_a_kubeinfer_candidate_is_compared_and_timed_by_its_server_timing(
    tiny_model: Path,
) -> None:
    engine = OnnxRuntimeEngine(tiny_model, max_batch_size=32, intra_op_threads=1)
    config = RuntimeConfig(model_name="m", engine={"onnxPath": str(tiny_model)}, host="127.0.0.1")
    try:
        slot = engine.create_slot()
        slot.input_views(2)["input"][:] = X
        serving = {"logits": ("FP32", slot.run(2)["logits"].copy())}
        slot.close()
        with rust_served(config, engine) as candidate:
            to = target(f"http://{candidate.address}")
            aggregates = aggregates_for(to)
            mirror = Mirror(to, aggregates)
            await mirror.start()
            for _ in range(5):
                mirror.offer(INPUTS, serving, 0.0001)
            await eventually(
                lambda: aggregates.outcomes["compared"] == 5,
                what="5 compared",
                every=0.005,
                in_thread=False,
            )
            await mirror.close()
    finally:
        engine.close()
    status = aggregates.status()
    assert status["mismatches"] == 0 and status["maxAbsDifference"] < 1e-5
    assert status["top1"] == {"rows": 10, "agreements": 10, "agreement": 1.0}
    # The real runtime sends a Server-Timing the mirror reads: a positive time of its own
    # (how long depends on the machine's load; that the figure is the header's and not
    # the round trip is the next test's, with a scripted candidate).
    assert status["latency"]["candidateP99Seconds"] > 0


async def test_the_candidates_latency_is_its_own_server_timing(scripted) -> None:
    candidate, url = scripted

    def timed(body: bytes, length: int | None) -> tuple[int, bytes, dict[str, str]]:
        status, payload, headers = echo(body, length)
        return status, payload, {**headers, "Server-Timing": "infer;dur=123.0"}

    candidate.answer = timed  # answers at once, but says its server took 123 ms
    to = target(url)
    aggregates = aggregates_for(to)
    mirror = Mirror(to, aggregates)
    await mirror.start()
    for _ in range(3):
        mirror.offer(INPUTS, SERVING, 0.002)
    await eventually(
        lambda: aggregates.outcomes["compared"] == 3,
        what="3 compared",
        every=0.005,
        in_thread=False,
    )
    await mirror.close()
    latency = aggregates.status()["latency"]
    assert 0.123 / 2 ** (1 / 6) < latency["candidateP99Seconds"] <= 0.123 * 2 ** (1 / 6)
    assert latency["servingP99Seconds"] <= 0.002 * 2 ** (1 / 6)


async def test_without_server_timing_the_round_trip_stands_in(scripted) -> None:
    candidate, url = scripted
    candidate.delay = 0.06
    to = target(url)
    aggregates = aggregates_for(to)
    mirror = Mirror(to, aggregates)
    await mirror.start()
    mirror.offer(INPUTS, SERVING, 0.001)
    await eventually(
        lambda: aggregates.outcomes["compared"] == 1,
        what="1 compared",
        every=0.005,
        in_thread=False,
    )
    await mirror.close()
    assert aggregates.status()["latency"]["candidateP99Seconds"] >= 0.06 / 2 ** (1 / 6)


async def test_a_slow_candidate_times_out_and_what_does_not_fit_is_dropped(scripted) -> None:
    candidate, url = scripted
    candidate.delay = 2.0
    to = target(url, max_concurrency=1, max_queue_size=2, timeout_milliseconds=100)
    aggregates = aggregates_for(to)
    mirror = Mirror(to, aggregates)
    await mirror.start()
    try:
        started = time.perf_counter()
        for _ in range(10):  # one each: none of these waits for the candidate
            mirror.offer(INPUTS, SERVING, 0.001)
        assert time.perf_counter() - started < 0.05
        assert aggregates.outcomes["dropped"] == 8 and mirror.queued == 2
        await eventually(
            lambda: aggregates.outcomes["timeout"] == 2,
            within=3,
            what="2 timeout",
            every=0.005,
            in_thread=False,
        )
        assert mirror.queued == 0 and mirror.queued_bytes == 0
    finally:
        await mirror.close()
    assert aggregates.outcomes["compared"] == 0


async def test_queued_bytes_are_bounded(scripted) -> None:
    candidate, url = scripted
    candidate.delay = 2.0
    big = {"input": ("FP32", np.zeros((8, 16), np.float32))}  # 512 bytes, + 80 of outputs
    to = target(url, max_concurrency=1, max_queued_bytes=1024, timeout_milliseconds=50)
    aggregates = aggregates_for(to)
    mirror = Mirror(to, aggregates)
    await mirror.start()
    try:
        for _ in range(5):
            mirror.offer(big, SERVING, 0.001)
        assert mirror.queued == 1 and mirror.queued_bytes == 512 + LOGITS.nbytes
        assert aggregates.outcomes["dropped"] == 4
    finally:
        await mirror.close()


def _status_500(body: bytes, length: int | None):
    return 500, b'{"error": "engine failed"}', {"Content-Type": "application/json"}


def _garbage(body: bytes, length: int | None):
    return 200, b"not json at all", {}


@pytest.mark.parametrize("failure", ["refused", "500", "garbage"])
async def test_a_failing_candidate_is_counted_and_logged_once_without_traceback(
    scripted, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    candidate, url = scripted
    if failure == "refused":
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    candidate.answer = {"500": _status_500, "garbage": _garbage}.get(failure, echo)
    caplog.set_level(logging.DEBUG, logger="kubeinfer.runtime.shadow")
    to = target(url, max_concurrency=2)
    aggregates = aggregates_for(to)
    mirror = Mirror(to, aggregates)
    await mirror.start()
    for taken in range(1, 21):  # each taken alone: twenty attempts, none batched
        mirror.offer(INPUTS, SERVING, 0.001)
        await eventually(
            lambda: mirror.queued == 0, what=f"offer {taken} taken", every=0.005, in_thread=False
        )
    await eventually(
        lambda: aggregates.outcomes["candidate_error"] == 20,
        what="20 candidate_error",
        every=0.005,
        in_thread=False,
    )
    await mirror.close()
    assert aggregates.outcomes["dropped"] == 0 and aggregates.outcomes["compared"] == 0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "candidate_error=1" in warnings[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records)
    attempts = len([r for r in caplog.records if r.levelno == logging.DEBUG])
    # a refused connection is not retried at once: the rest are counted without a try
    assert 1 <= attempts < 20 if failure == "refused" else attempts == 20


async def test_a_refusing_candidate_is_not_retried_until_its_backoff_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    to = target(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    aggregates = aggregates_for(to)
    mirror = Mirror(to, aggregates, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="kubeinfer.runtime.shadow.mirror")

    def attempts() -> int:
        return len([r for r in caplog.records if r.levelno == logging.DEBUG])

    async def offer_and_settle() -> None:
        # each offer ends as a candidate_error, counted (and logged) once it is settled
        settled = aggregates.outcomes["candidate_error"] + 1
        mirror.offer(INPUTS, SERVING, 0.001)
        await eventually(
            lambda: aggregates.outcomes["candidate_error"] == settled,
            what=f"{settled} candidate errors",
            every=0.005,
            in_thread=False,
        )

    await mirror.start()
    try:
        await offer_and_settle()
        assert attempts() == 1  # refused at t=100: no new try before 100.25
        for at in (100.1, 100.2):
            now[0] = at
            await offer_and_settle()
        assert attempts() == 1 and aggregates.outcomes["candidate_error"] == 3
        now[0] = 100.3
        await offer_and_settle()
        assert attempts() == 2  # tried again; refused again: 0.5 s this time
        now[0] = 100.7
        await offer_and_settle()
        assert attempts() == 2
        now[0] = 100.81
        await offer_and_settle()
        assert attempts() == 3
    finally:
        await mirror.close()
    assert aggregates.outcomes["candidate_error"] == 6


async def test_an_answer_of_another_shape_is_a_mismatch(scripted) -> None:
    _, url = scripted
    to = target(url)
    aggregates = aggregates_for(to)
    mirror = Mirror(to, aggregates)
    await mirror.start()
    mirror.offer(INPUTS, {"logits": ("FP32", LOGITS[:, :4])}, 0.001)
    await eventually(
        lambda: aggregates.outcomes["compared"] == 1,
        what="1 compared",
        every=0.005,
        in_thread=False,
    )
    await mirror.close()
    assert aggregates.mismatches == 1 and aggregates.max_abs_difference is None


async def test_close_cancels_work_in_flight_at_once_and_records_nothing_after(scripted) -> None:
    candidate, url = scripted
    candidate.delay = 5.0
    to = target(url, timeout_milliseconds=10_000)
    aggregates = aggregates_for(to)
    mirror = Mirror(to, aggregates)
    await mirror.start()
    for _ in range(6):
        mirror.offer(INPUTS, SERVING, 0.001)
    await asyncio.wait_for(candidate.arrived.wait(), 5)
    started = time.perf_counter()
    await mirror.close()
    assert time.perf_counter() - started < 1.0
    mirror.offer(INPUTS, SERVING, 0.001)  # a closed mirror takes nothing
    await asyncio.sleep(0.05)  # not a wait: time for cancelled work to record, which it must not
    assert aggregates.outcomes == dict.fromkeys(aggregates.outcomes, 0)


# --------------------------------------------------------------------------- the controller


def _series_digests(registry: CollectorRegistry) -> set[str]:
    text = generate_latest(registry).decode()
    return {line.split('candidate_digest="')[1].split('"')[0]
            for line in text.splitlines() if 'candidate_digest="' in line}  # fmt: skip


async def test_the_controller_keeps_aggregates_for_a_new_share_and_restarts_for_a_new_candidate(
    scripted,
) -> None:
    _, url = scripted
    registry = CollectorRegistry()
    config = RuntimeConfig(model_name="m", engine={"onnxPath": "/m.onnx"})
    controller = ShadowController(config, registry)
    assert controller.status()["active"] is False and controller.status()["candidate"] is None
    first = target(url, percent=100)
    await controller.apply(first)
    controller.offer(INPUTS, SERVING, 0.001)
    await eventually(
        lambda: controller.status()["requests"]["compared"] == 1,
        what="1 compared by the controller",
        every=0.005,
        in_thread=False,
    )

    await controller.apply(first.model_copy(update={"traffic_percent": 50}))
    status = controller.status()
    assert status["trafficPercent"] == 50 and status["requests"]["compared"] == 1  # kept

    other = first.model_copy(update={"candidate_digest": "sha256:d"})
    await controller.apply(other)
    status = controller.status()
    assert status["candidate"]["digest"] == "sha256:d" and status["requests"]["compared"] == 0
    assert _series_digests(registry) == {"sha256:d"}  # the old candidate's series are gone

    await controller.apply(None)
    assert controller.status()["active"] is False and not controller.active
    assert _series_digests(registry) == set()
    controller.offer(INPUTS, SERVING, 0.001)  # mirroring off: nothing happens
    await controller.stop()
    await controller.apply(first)  # after stop, nothing starts again
    assert not controller.active
