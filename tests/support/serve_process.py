"""`kubeinfer serve` as a real process on a loopback port, for the tests that treat it as
a client, an attacker or Kubernetes would: requests over real sockets (`http.client`, or
raw bytes where a test needs to send half a request), /metrics scraped as text, resident
memory read from /proc, SIGTERM sent to the process and its output kept for the end.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ports import free_port
from processes import stop, wait_ready
from prometheus_client.parser import text_string_to_metric_families


class LoopbackHttp:
    """A client's plain HTTP to a server on the loopback `port`: a connection, a raw
    socket, one request."""

    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def connect(self, timeout: float = 30) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def socket(self, timeout: float = 30) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> tuple[int, dict[str, str], bytes]:
        connection = self.connect(timeout)
        try:
            connection.request(method, path, body, headers or {})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()


class ServeProcess(LoopbackHttp):
    """One `kubeinfer serve --onnx MODEL --model-name NAME FLAGS...` process, started and
    ready (its readiness route answers 200; `ready_path` another route to wait for, such
    as liveness for a process that must never become ready). With `model` None the flags
    name the source (`--engine DIGEST --cache DIR`, `--config FILE`). `port`: the one to
    listen on (default: a free one), for a client told it before the process starts.
    `launcher`: what runs the Python process (`qemu-x86_64 -cpu MODEL`: another CPU's
    instructions)."""

    def __init__(
        self,
        model: Path | None,
        name: str,
        *flags: str,
        ready_timeout: float = 60,
        ready_path: str = "/v2/health/ready",
        port: int | None = None,
        launcher: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self._log = tempfile.TemporaryFile()
        source = ["--onnx", str(model)] if model is not None else []
        self.process = subprocess.Popen(
            [*launcher, sys.executable, "-m", "kubeinfer.cli", "serve", *source,
             "--model-name", name, "--host", "127.0.0.1", "--port", str(self.port), *flags],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_ready(
            lambda: self.request("GET", ready_path, timeout=2)[0] == 200,
            self.process, f"kubeinfer serve on port {self.port}", ready_timeout, self.output,
        )  # fmt: skip

    @property
    def infer_path(self) -> str:
        return f"/v2/models/{self.name}/infer"

    def infer(self, request: dict[str, Any], **kwargs: Any) -> tuple[int, dict[str, Any]]:
        status, _, payload = self.request(
            "POST", self.infer_path, json.dumps(request).encode(), **kwargs
        )
        return status, json.loads(payload)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        _, _, body = self.request("GET", "/metrics")
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        key = tuple(sorted({"model": self.name, "version": "1", **labels}.items()))
        return self.metrics().get((name, key), 0.0)

    def memory_kib(self, field: str = "VmRSS") -> int:
        """A memory figure of the process from /proc (VmRSS now, VmHWM its peak)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.process.pid}/status")

    def reset_peak_memory(self) -> None:
        """Resets VmHWM to the current RSS (Linux: write 5 to clear_refs)."""
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60) -> int:
        return stop(self.process, timeout)

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (with Content-Length) read from a raw socket; raises
    ConnectionError if the server closes or resets the connection first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head ({data[:80]!r})")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the middle of a response body")
        body += chunk
    return status, headers, body[:length]


def head(path: str, port: int, length: int, extra: str = "") -> bytes:
    """The head of a POST with a declared body length (the body is the caller's)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
