"""SIGTERM loses nothing it has read, against real `kubeinfer serve` processes (the spin
model of `onnx_models`, each request holding the engine ~15 ms so that requests are
queued and running when the signal comes).

Covers, each with its own process, SIGTERM sent in the middle of the load:
- 64 keep-alive clients in a closed loop: every request whose bytes were sent gets an
  answer, its result (200, checked) or 503 with Retry-After; none gets a reset or an EOF
  (the old server reset 64 of them); the clients behave as HTTP asks (a new connection
  after `Connection: close`, the next request after Retry-After) and are then refused at
  connect, which loses nothing; the process exits 0 long before the grace period;
- 24 clients opening a connection per request: the same (the old server left 25-43 of
  them hanging for the whole grace period, then closed them);
- an upload in progress at SIGTERM: its body is read to the end and it gets its result;
- an idle server exits without waiting on a timeout (both of them set to ten minutes),
  with an idle keep-alive connection and one that opened and never sent a byte.

And on the Rust data plane in the test's own process with the engine behind a gate (the
`start_serving` fixture, whose server SIGTERM to this process drains as it drains
`kubeinfer serve`), where the gate, not the clock, decides what is still queued when
SIGTERM comes: every request accepted before it is answered with its result, the ones
after it get 503 with Retry-After, and the drain ends with no batch left on the engine.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from aiohttp import ClientSession
from kubeinfer.contract.runtime_config import BatchingPolicy
from serve_process import ServeProcess, head, read_response
from waiting import eventually, wait_for

pytestmark = pytest.mark.slow

GRACE_SECONDS = 30


def serve(model: Path) -> ServeProcess:
    return ServeProcess(
        model, "spin", "--intra-op-threads", "1", "--execution-slots", "1",
        "--max-batch-size", "8", "--drain-grace-period-seconds", str(GRACE_SECONDS),
    )  # fmt: skip


def request_body(seed: int) -> tuple[bytes, list[float]]:
    """A one-row request holding the engine ~15 ms, and its expected output."""
    x = np.random.default_rng(seed).standard_normal(4).astype(np.float32)
    ids = [20_000, 1, 2, 3]
    body = json.dumps({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": x.tolist()},
        {"name": "ids", "datatype": "INT32", "shape": [1, 4], "data": ids},
    ]}).encode()  # fmt: skip
    return body, (x + np.array(ids, np.float32)).tolist()


class Outcomes:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answered: dict[int, int] = {}
        self.lost: list[str] = []
        self.refused = 0
        self.wrong: list[str] = []

    def add_status(self, status: int) -> None:
        with self.lock:
            self.answered[status] = self.answered.get(status, 0) + 1


def client_loop(server: ServeProcess, outcomes: Outcomes, seed: int, per_request: bool) -> None:
    """Sends requests until a connection is refused (the listener has closed)."""
    connection = server.connect(timeout=GRACE_SECONDS + 10)
    sent = 0
    while True:
        body, expected = request_body(seed * 10_000 + sent)
        headers = {"Connection": "close"} if per_request else {}
        try:
            connection.request("POST", server.infer_path, body, headers)
        except ConnectionRefusedError:
            outcomes.refused += 1
            return
        except OSError as error:
            outcomes.lost.append(f"send: {error!r}")
            return
        sent += 1
        try:
            response = connection.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as error:
            outcomes.lost.append(f"answer: {error!r}")
            return
        outcomes.add_status(response.status)
        if response.status == 200:
            got = json.loads(payload)["outputs"][0]["data"]
            if not np.allclose(got, expected, rtol=1e-6):
                outcomes.wrong.append(f"{got} != {expected}")
        elif response.status != 503 or response.getheader("Retry-After") != "1":
            outcomes.wrong.append(f"{response.status} {payload[:200]!r}")
        else:
            # not a wait: a client that honours Retry-After, as the drain expects
            time.sleep(int(response.getheader("Retry-After")))
        if per_request:
            connection.close()
            connection = server.connect(timeout=GRACE_SECONDS + 10)


def run_until_sigterm(server: ServeProcess, clients: int, per_request: bool) -> Outcomes:
    outcomes = Outcomes()
    threads = [
        threading.Thread(target=client_loop, args=(server, outcomes, seed, per_request))
        for seed in range(clients)
    ]
    for thread in threads:
        thread.start()
    wait_for(
        lambda: sum(outcomes.answered.values()) >= 3 * clients,
        within=60,
        what="the load",
        every=0.01,
    )
    wait_for(lambda: server.metric("kubeinfer_queue_depth") >= 4, what="a queue", every=0.01)
    signalled = time.monotonic()
    server.terminate()
    assert server.process.wait(timeout=GRACE_SECONDS + 10) == 0
    exited = time.monotonic() - signalled
    for thread in threads:
        thread.join(timeout=30)
    assert exited < GRACE_SECONDS / 3, f"exit took {exited:.1f} s"
    return outcomes


def check(outcomes: Outcomes, server: ServeProcess) -> None:
    assert outcomes.lost == [], (outcomes.lost, outcomes.answered)
    assert outcomes.wrong == []
    assert outcomes.answered.get(200, 0) > 0
    log = server.output()
    assert "Started draining" in log and "Traceback" not in log and " ERROR " not in log, log


def test_keep_alive_clients_lose_nothing(spin_model: Path) -> None:
    with serve(spin_model) as server:
        outcomes = run_until_sigterm(server, clients=64, per_request=False)
        check(outcomes, server)


def test_a_connection_per_request_loses_nothing(spin_model: Path) -> None:
    with serve(spin_model) as server:
        outcomes = run_until_sigterm(server, clients=24, per_request=True)
        check(outcomes, server)


def test_an_upload_in_progress_gets_its_result(spin_model: Path) -> None:
    with serve(spin_model) as server:
        body, expected = request_body(7)
        with server.socket(timeout=GRACE_SECONDS) as sock:
            sock.sendall(head(server.infer_path, server.port, len(body)) + body[:40])
            wait_for(lambda: server.metric("kubeinfer_requests_in_progress") == 1, what="admission")
            server.terminate()
            wait_for(lambda: server.request("GET", "/v2/health/ready")[0] == 503, what="unready")
            time.sleep(0.3)  # not a wait: the upload goes on a while into the drain
            sock.sendall(body[40:])
            status, headers, answer = read_response(sock)
            assert status == 200, answer
            assert headers["connection"] == "close"
            assert np.allclose(json.loads(answer)["outputs"][0]["data"], expected, rtol=1e-6)
        assert server.process.wait(timeout=GRACE_SECONDS) == 0


def test_an_idle_server_exits_without_waiting_on_a_timeout(spin_model: Path) -> None:
    # Both timeouts it could wait on (the head timeout for the silent connection, the
    # grace period for the idle one) are ten minutes: an exit within two shows it waited
    # on neither, however slow the machine.
    with ServeProcess(
        spin_model, "spin", "--intra-op-threads", "1", "--drain-grace-period-seconds", "600",
        "--header-read-timeout-seconds", "600",
    ) as server:  # fmt: skip
        idle = server.connect()
        idle.request("GET", "/v2/health/ready")
        assert idle.getresponse().read()
        silent = server.socket()  # accepted, or in the backlog the drain accepts from
        server.terminate()
        assert server.process.wait(timeout=120) == 0
        assert "Drained" in server.output()
        idle.close()
        silent.close()


async def test_sigterm_answers_every_accepted_request_and_exits_0(
    start_serving, gated, tiny_model: Path
) -> None:
    count = 32
    serving = await start_serving(
        batching=BatchingPolicy(execution_slots=1, max_queue_size=64, max_batch_size=4)
    )
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(count)]
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])

    async with ClientSession(f"http://127.0.0.1:{serving.port}") as client:

        async def infer(x: np.ndarray) -> tuple[int, dict[str, str], dict]:
            tensor = {"name": "input", "datatype": "FP32", "shape": [1, 16],
                      "data": x.ravel().tolist()}  # fmt: skip
            async with client.post("/v2/models/tiny/infer", json={"inputs": [tensor]}) as answer:
                return answer.status, dict(answer.headers), await answer.json()

        gated.gate.clear()
        accepted = [asyncio.create_task(infer(x)) for x in inputs]

        # Every request accepted; one batch held on the engine by the gate, the rest queued.
        def all_accepted() -> bool:
            assert not any(task.done() for task in accepted), "answered with the gate shut"
            return gated.running == 1 and serving.served.in_progress() == count

        await eventually(all_accepted, what="every request accepted", every=0.002, in_thread=False)
        os.kill(os.getpid(), signal.SIGTERM)  # to the fixture's handler, on this loop

        async def unready() -> bool:  # the signal is handled on this loop, soon after
            async with client.get("/v2/health/ready") as readiness:
                return readiness.status == 503

        await eventually(unready, what="unready after the signal", every=0.002)
        status, headers, refusal = await infer(inputs[0])
        assert status == 503 and headers["Retry-After"] == "1", refusal
        assert serving.drained is not None and not serving.drained.done()  # still held
        assert not any(task.done() for task in accepted)
        gated.gate.set()
        answers = await asyncio.gather(*accepted)
    assert await serving.drained == 0  # no batch left on the engine
    for x, (status, _, answer) in zip(inputs, answers, strict=True):
        assert status == 200, answer
        [output] = answer["outputs"]
        expected = session.run(None, {"input": x})[0]
        np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(expected.shape),
                                   expected, rtol=1e-5, atol=1e-6)  # fmt: skip
