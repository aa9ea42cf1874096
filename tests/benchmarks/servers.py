"""The servers under test, each started as a real subprocess on a loopback port.

`ServerProcess` starts one command, waits until the model answers ready (or the process
dies, whose log tail is then shown), and stops it with SIGTERM (SIGKILL after a grace
period). The three launchers build the command lines: kubeinfer from `.venv`, the
hand-written unbatched server from `.venv`, MLServer from its own `.venv-bench` (its pins
conflict with ours).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
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


# --------------------------------------------------------------------------- launchers


def kubeinfer_spec(
    model_path: Path,
    model_name: str,
    threads: int,
    max_batch_size: int = 32,
    extra_args: tuple[str, ...] = (),
    engine: tuple[str, Path] | None = None,
) -> ServerSpec:
    """`kubeinfer serve` from `.venv` with its default batching policy except
    maxBatchSize (32, as MLServer's); `engine` = (digest, cache directory) serves a built
    engine from the cache (verified there) instead of the ONNX file."""
    port = free_port()
    source = (
        ["--engine", engine[0], "--cache", str(engine[1])]
        if engine
        else ["--onnx", str(model_path)]
    )
    command = [
        str(REPO / ".venv" / "bin" / "kubeinfer"),
        "serve",
        *source,
        "--model-name",
        model_name,
        "--host",
        HOST,
        "--port",
        str(port),
        "--max-batch-size",
        str(max_batch_size),
        "--intra-op-threads",
        str(threads),
        *extra_args,
    ]
    return ServerSpec(
        "kubeinfer", command, port, model_name, metrics_url=f"http://{HOST}:{port}/metrics"
    )


def unbatched_spec(model_path: Path, model_name: str, threads: int) -> ServerSpec:
    port = free_port()
    command = [
        sys.executable,
        str(HERE / "unbatched_server.py"),
        "--model",
        str(model_path),
        "--name",
        model_name,
        "--host",
        HOST,
        "--port",
        str(port),
        "--intra-op-threads",
        str(threads),
    ]
    return ServerSpec("unbatched", command, port, model_name)


def mlserver_spec(
    model_path: Path,
    model_name: str,
    threads: int,
    work_dir: Path,
    parallel_workers: int = 1,
    max_batch_size: int = 32,
    max_batch_time_s: float = 0.005,
) -> ServerSpec:
    """MLServer with adaptive batching (max batch 32, 5 ms) and our ONNX runtime; its
    settings are written to `work_dir`. Debug (access logs) off, as in production."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    root = work_dir / model_name
    model_dir = root / "models" / model_name
    model_dir.mkdir(parents=True, exist_ok=True)
    (root / "settings.json").write_text(
        json.dumps(
            {
                "debug": False,
                "host": HOST,
                "http_port": http_port,
                "grpc_port": grpc_port,
                "metrics_port": metrics_port,
                "parallel_workers": parallel_workers,
                "model_repository_root": str(root / "models"),
                "metrics_dir": str(root / ".metrics"),
                "environments_dir": str(root / ".envs"),
            },
            indent=2,
        )
    )
    (model_dir / "model-settings.json").write_text(
        json.dumps(
            {
                "name": model_name,
                "implementation": "mlserver_runtime.OnnxRuntimeModel",
                "max_batch_size": max_batch_size,
                "max_batch_time": max_batch_time_s,
                "parameters": {
                    "uri": str(model_path),
                    "extra": {"intra_op_threads": threads},
                },
            },
            indent=2,
        )
    )
    command = [str(REPO / ".venv-bench" / "bin" / "mlserver"), "start", str(root)]
    return ServerSpec(
        "mlserver",
        command,
        http_port,
        model_name,
        metrics_url=f"http://{HOST}:{metrics_port}/metrics",
        env={"PYTHONPATH": str(HERE)},
        encodings=("json",),
    )
