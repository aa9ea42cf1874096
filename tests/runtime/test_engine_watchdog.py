"""The engine watchdog, against real `kubeinfer serve` processes whose engine call really
does not return for a while (the spin model of `onnx_models`: a request picks how many
times the model's ONNX Loop runs).

Covers: a batch still running at its requests' deadline answers them 504 at that
deadline, naming the stuck engine, instead of leaving them waiting; readiness turns off
(503) and new requests are refused with 503 and Retry-After, while liveness stays on; once
the batch has not returned within `--engine-stuck-liveness-seconds`, liveness turns off
too (503), so Kubernetes would restart the pod; when the engine returns, both turn on
again and requests are served; `kubeinfer_engine_stuck_batches` shows it. A server told
to stop while its engine is stuck exits within its grace period rather than waiting for
the engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from serve_process import ServeProcess
from waiting import wait_for

pytestmark = pytest.mark.slow


def serve(model: Path) -> ServeProcess:
    return ServeProcess(
        model, "spin", "--intra-op-threads", "1", "--execution-slots", "1",
        "--max-batch-size", "8", "--engine-stuck-liveness-seconds", "1",
        "--drain-grace-period-seconds", "2",
    )  # fmt: skip


def spin_request(spins: int, timeout_us: int | None = None) -> dict:
    ids = np.zeros((5, 4), np.int32)  # 5 rows: a worker thread's batch, not an inline one
    ids[0, 0] = spins
    request: dict = {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [5, 4], "data": [0.0] * 20},
        {"name": "ids", "datatype": "INT32", "shape": [5, 4], "data": ids.ravel().tolist()},
    ]}  # fmt: skip
    if timeout_us is not None:
        request["parameters"] = {"timeout": timeout_us}
    return request


def status_of(server: ServeProcess, path: str) -> int:
    return server.request("GET", path, timeout=5)[0]


def test_a_stuck_engine_fails_its_requests_and_turns_health_off(spin_model: Path) -> None:
    with serve(spin_model) as server:
        status, answer = server.infer(spin_request(3_000_000, timeout_us=300_000))
        assert status == 504, answer
        assert "engine did not finish" in answer["error"] and "stuck" in answer["error"]
        # Answered at its deadline, not when the batch returned: the batch is still
        # running (the spin lasts seconds, longer on a busy machine).
        assert server.metric("kubeinfer_engine_stuck_batches") == 1
        assert status_of(server, "/v2/health/ready") == 503
        assert status_of(server, f"/v2/models/{server.name}/ready") == 503
        assert status_of(server, "/v2/health/live") == 200  # not yet: it may come back
        status, headers, payload = server.request(
            "POST", server.infer_path, json.dumps(spin_request(0)).encode()
        )
        assert status == 503 and headers["Retry-After"] == "1", payload
        assert "has not returned a batch" in json.loads(payload)["error"]
        wait_for(lambda: status_of(server, "/v2/health/live") == 503, what="liveness off")
        wait_for(lambda: status_of(server, "/v2/health/ready") == 200, what="the engine's return")
        assert status_of(server, "/v2/health/live") == 200
        assert server.metric("kubeinfer_engine_stuck_batches") == 0
        status, answer = server.infer(spin_request(10))
        assert status == 200 and answer["outputs"][0]["data"][0] == 10.0
        assert server.stop() == 0
        assert "Engine returned the stuck batch" in server.output()


def test_a_server_stops_while_its_engine_is_stuck(spin_model: Path) -> None:
    with serve(spin_model) as server:
        status, _ = server.infer(spin_request(200_000_000, timeout_us=100_000))  # minutes
        assert status == 504
        server.terminate()
        # The batch spins for minutes: an exit at all, within the wait, is one that did
        # not wait for it.
        assert server.process.wait(timeout=60) == 0
        assert "Exiting with a batch still running on the engine" in server.output()
