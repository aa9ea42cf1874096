"""Deadlines and the drain over gRPC, against a real `kubeinfer serve --grpc-port` process
on the spin model of `onnx_models` (a request picks how long the engine call takes, so
one can hold the only execution slot while others queue), with `tritonclient.grpc`.

Covers: a request whose `timeout` parameter passes while it is queued is answered
DEADLINE_EXCEEDED with the data plane's message, and one whose client's gRPC deadline
passes is dropped too; neither is ever executed (one batch ran: the one holding the
slot); the answers are counted as REST's are. On SIGTERM, the gRPC requests in flight
(running, and queued behind it) are answered with their results, a new RPC is refused
UNAVAILABLE (the code gRPC clients retry elsewhere), and the process exits 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
from onnx_models import expected_y
from ports import free_port
from serve_process import ServeProcess
from tritonclient.utils import InferenceServerException
from waiting import wait_for

pytestmark = pytest.mark.slow

SPINS_PER_SECOND = 400_000
"""Loop turns of the spin model per second on one thread (about; a slow CPU only makes
the holding request longer)."""


class Spinning:
    def __init__(self, server: ServeProcess, grpc_port: int) -> None:
        self.server = server
        self.address = f"127.0.0.1:{grpc_port}"
        self.pool = ThreadPoolExecutor(4)

    def infer(self, spins: int, seed: int = 0, **kwargs: object) -> np.ndarray:
        x = np.random.default_rng(seed).standard_normal((5, 4)).astype(np.float32)
        ids = np.zeros((5, 4), np.int32)
        ids[0, 0] = spins
        tensors = [
            triton.InferInput("x", [5, 4], "FP32"),
            triton.InferInput("ids", [5, 4], "INT32"),
        ]
        tensors[0].set_data_from_numpy(x)
        tensors[1].set_data_from_numpy(ids)
        client = triton.InferenceServerClient(self.address)
        got = client.infer("spin", tensors, **kwargs).as_numpy("y")
        np.testing.assert_array_equal(got, expected_y(x, ids))
        return got

    def hold_the_slot(self, seconds: float) -> Future[np.ndarray]:
        holding = self.pool.submit(self.infer, int(seconds * SPINS_PER_SECOND))
        wait_for(
            lambda: self.server.metric("kubeinfer_inflight_batches") == 1, what="the slot held"
        )
        return holding


@pytest.fixture(scope="module")
def spinning(spin_model: Path) -> Iterator[Spinning]:
    grpc_port = free_port()
    with ServeProcess(
        spin_model, "spin", "--grpc-port", str(grpc_port), "--intra-op-threads", "1",
        "--execution-slots", "1", "--max-batch-size", "8", "--drain-grace-period-seconds", "30",
        # The holding request has no timeout of its own: the default deadline must outlast
        # its spin on a loaded machine (a CI run took past the usual ten seconds for four).
        "--default-timeout-milliseconds", "120000",
    ) as server:  # fmt: skip
        running = Spinning(server, grpc_port)
        yield running
        running.pool.shutdown(cancel_futures=True)


def test_requests_past_their_deadline_are_deadline_exceeded_and_never_run(
    spinning: Spinning,
) -> None:
    server = spinning.server
    batches = server.metric("kubeinfer_batch_size_count")
    answered_504 = server.metric("kubeinfer_requests_total", code="504")
    cancelled = server.metric("kubeinfer_requests_cancelled_total", stage="waiting")
    holding = spinning.hold_the_slot(4.0)
    # Each is answered at its deadline while the slot is still held: not when it frees.
    with pytest.raises(InferenceServerException) as timed_out:
        spinning.infer(1, timeout=200_000)  # the request's own timeout, microseconds
    assert not holding.done() and server.metric("kubeinfer_inflight_batches") == 1
    assert timed_out.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "not executed" in timed_out.value.message()

    with pytest.raises(InferenceServerException) as left:
        spinning.infer(1, client_timeout=0.2)  # the client's gRPC deadline
    assert not holding.done() and server.metric("kubeinfer_inflight_batches") == 1
    assert left.value.status() == "StatusCode.DEADLINE_EXCEEDED"

    holding.result(timeout=30)
    assert server.metric("kubeinfer_batch_size_count") - batches == 1  # the holding one only
    # the server's own deadline (504) or the client leaving first (cancelled): counted once
    ended = server.metric("kubeinfer_requests_total", code="504") - answered_504
    ended += server.metric("kubeinfer_requests_cancelled_total", stage="waiting") - cancelled
    assert ended == 2


def test_sigterm_answers_grpc_requests_in_flight_and_refuses_new_ones(spinning: Spinning) -> None:
    server = spinning.server
    holding = spinning.hold_the_slot(1.5)
    queued = spinning.pool.submit(spinning.infer, 10, 1)
    wait_for(lambda: server.metric("kubeinfer_queue_depth") == 1, what="the second queued")
    server.terminate()
    ready = lambda: server.request("GET", "/v2/health/ready", timeout=5)[0]  # noqa: E731
    wait_for(lambda: ready() == 503, what="draining")
    with pytest.raises(InferenceServerException) as refused:
        spinning.infer(1, seed=2)
    # Refused, never run: UNAVAILABLE from the stopping server, or CANCELLED when gRPC's
    # core cancels a call that raced its shutdown (seen on a loaded two-worker run).
    assert refused.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.CANCELLED")
    holding.result(timeout=30)
    queued.result(timeout=30)
    assert server.process.wait(timeout=30) == 0
    assert "Stopped serving gRPC" in server.output()
