"""Start a server as a real subprocess on a loopback port and stop it.

`ServerProcess` starts one command, waits until the model answers ready (or the process
dies, whose log tail is then shown), and stops it with SIGTERM (SIGKILL after a grace
period). `kubeinfer tune` starts each sweep point's `kubeinfer serve` with it; the
benchmarks (tests/benchmarks/servers.py) start theirs and their baselines with it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"


class ServerFailed(RuntimeError):
    """A server did not become ready; the message carries its log's tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@dataclass
class ServerSpec:
    """How to start one server: its command, environment, and where it answers."""

    label: str
    command: list[str]
    port: int
    model_name: str
    metrics_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    encodings: tuple[str, ...] = ("json", "binary")

    @property
    def ready_url(self) -> str:
        return f"http://{HOST}:{self.port}/v2/models/{self.model_name}/ready"


class ServerProcess:
    """A context manager: started and ready inside, stopped on exit."""

    def __init__(self, spec: ServerSpec, log_dir: Path, ready_timeout_s: float = 180.0):
        self.spec = spec
        self.log_path = log_dir / f"{spec.label}-{spec.model_name}.log"
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.spec.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.spec.env},
            cwd=self.log_path.parent,  # not the repo: its operator/ shadows the stdlib
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise ServerFailed(f"{self.spec.label} exited at start:\n{self.log_tail()}")
            try:
                status, _ = http_get(self.spec.ready_url, timeout=2.0)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerFailed(
            f"{self.spec.label} not ready in {self.ready_timeout_s}s:\n{self.log_tail()}"
        )

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
