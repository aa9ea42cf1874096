"""Admission before the body, bounded work and memory per request, and read timeouts,
against real `kubeinfer serve` processes (the spin model of `onnx_models`, whose
engine call the request can make last about a second).

Covers:
- a request's deadline counts from its arrival: one whose body came after its `timeout`
  gets 504 and is never executed (the body is sent once the server shows the request
  admitted, and the timeout has passed: an order, not a race);
- request heads that stall, and idle keep-alive connections, are closed after
  `--header-read-timeout-seconds`; a body that stalls gets 408 and its connection is
  closed;
- a 64 KiB gzip body inflating to 15 MiB of empty JSON lists is refused (413) without being
  parsed, the server's peak memory growing by less than 50 MB (it used to parse it into
  millions of lists);
- uploads abandoned after most of their declared body, round after round, leave resident
  memory within 100 MB of where it started, are counted as cancelled (stage `reading`)
  and logged at no level above DEBUG.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
from serve_process import ServeProcess, head, read_response
from waiting import wait_for

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
RESET_ON_CLOSE = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s


@pytest.fixture(scope="module")
def small_queue(spin_model) -> Iterator[ServeProcess]:
    """One slot, one place in the queue."""
    with ServeProcess(
        spin_model, "spin", "--execution-slots", "1", "--intra-op-threads", "1",
        "--max-batch-size", "8", "--max-queue-size", "1",
    ) as running:  # fmt: skip
        yield running


@pytest.fixture(scope="module")
def roomy(spin_model) -> Iterator[ServeProcess]:
    """Default queue, a body limit of 16 MiB (the spin model's own is 72 KiB: room for
    the large uploads these tests send); short read timeouts."""
    with ServeProcess(
        spin_model, "spin", "--intra-op-threads", "1", "--header-read-timeout-seconds", "0.5",
        "--body-read-timeout-seconds", "0.5", "--max-request-bytes", str(16 * MIB),
    ) as running:  # fmt: skip
        yield running
        assert running.stop() == 0
        log = running.output()
        assert " ERROR " not in log and " WARNING " not in log and "Traceback" not in log, log


def body(rows: int = 1, spin: int = 0, **parameters: int) -> bytes:
    ids = np.zeros((rows, 4), np.int32)
    ids[0, 0] = spin
    request: dict = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": [1.0] * (rows * 4)},
            {"name": "ids", "datatype": "INT32", "shape": [rows, 4], "data": ids.ravel().tolist()},
        ]
    }
    if parameters:
        request["parameters"] = parameters
    return json.dumps(request).encode()


def test_the_deadline_counts_from_arrival(small_queue) -> None:
    server = small_queue
    batches = server.metric("kubeinfer_batch_size_count")
    payload = body(timeout=200_000)  # 200 ms
    with server.socket(timeout=30) as sock:
        sock.sendall(head(server.infer_path, server.port, len(payload)))
        # Admitted (its arrival taken) before the wait: the 200 ms have passed, whatever
        # the machine's load, when the body is sent.
        wait_for(
            lambda: server.metric("kubeinfer_requests_in_progress") == 1,
            what="the admission",
            every=0.005,
        )
        time.sleep(0.3)  # not a wait: the 200 ms deadline passes, as the test needs
        sock.sendall(payload)
        status, _, answer = read_response(sock)
    assert status == 504, answer
    assert "after it arrived" in json.loads(answer)["error"]
    assert server.metric("kubeinfer_batch_size_count") == batches  # never executed


def test_stalled_heads_and_idle_keep_alive_are_closed(roomy) -> None:
    server = roomy
    keep_alive = server.socket(timeout=30)
    payload = body()
    keep_alive.sendall(head(server.infer_path, server.port, len(payload)) + payload)
    assert read_response(keep_alive)[0] == 200
    stalled = [keep_alive]
    for index in range(40):
        sock = server.socket(timeout=30)
        if index % 2:  # half a head; or nothing at all
            sock.sendall(f"POST {server.infer_path} HTTP/1.1\r\nHost: x\r\n".encode())
        stalled.append(sock)
    for sock in stalled:
        assert sock.recv(1024) == b""  # closed by the server (recv would time out)
        sock.close()
    assert server.infer({"inputs": json.loads(payload)["inputs"]})[0] == 200


def test_a_stalled_body_is_a_408_and_closes(roomy) -> None:
    with roomy.socket(timeout=5) as sock:
        sock.sendall(head(roomy.infer_path, roomy.port, 100) + b'{"inputs": ')
        status, headers, answer = read_response(sock)
        assert status == 408 and headers["connection"] == "close", answer
        assert "stalled" in json.loads(answer)["error"]
        assert sock.recv(1024) == b""


def test_an_amplification_body_is_refused_unparsed(roomy) -> None:
    lists = b"[]," * (5 * MIB)  # 15 MiB of empty lists
    document = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [' + (
        lists + b"[]]}]}"
    )
    bomb = gzip.compress(document, 9)
    assert len(bomb) < 64 * 1024
    roomy.reset_peak_memory()
    before = roomy.memory_kib("VmRSS")
    status, _, answer = roomy.request("POST", roomy.infer_path, bomb, {"Content-Encoding": "gzip"})
    growth_mb = (roomy.memory_kib("VmHWM") - before) / 1024
    assert growth_mb < 50, f"peak memory grew by {growth_mb:.0f} MB"
    assert status == 413, answer
    assert "was not parsed" in json.loads(answer)["error"]


def test_abandoned_uploads_give_their_memory_back(roomy) -> None:
    server = roomy
    cancelled = server.metric("kubeinfer_requests_cancelled_total", stage="reading")
    start_kib = server.memory_kib("VmRSS")
    declared, sent, clients, rounds = 12 * MIB, 11 * MIB, 16, 2
    chunk = b"0" * MIB
    for _ in range(rounds):
        sockets = [server.socket() for _ in range(clients)]
        for sock in sockets:
            sock.sendall(head(server.infer_path, server.port, declared))
        for _ in range(sent // MIB):
            for sock in sockets:
                sock.sendall(chunk)
        for sock in sockets:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
            sock.close()  # a reset, as a client that crashed or timed out
        wait_for(
            lambda: server.metric("kubeinfer_requests_in_progress") == 0,
            what="the aborts noticed",
            every=0.005,
        )
    growth_mb = (server.memory_kib("VmRSS") - start_kib) / 1024
    assert growth_mb < 100, f"resident memory grew by {growth_mb:.0f} MB and stayed"
    assert server.metric("kubeinfer_requests_cancelled_total", stage="reading") - cancelled == (
        clients * rounds
    )
