"""`kubeinfer serve --grpc-port`: the flag and `KUBEINFER_SERVE_GRPC_PORT` set the config's
grpcPort (a flag wins; none: no gRPC), the HTTP port is refused as the gRPC port, and a
gRPC port another process holds is a start-up error (exit 1, said on stderr and in the
termination message) rather than a server without its gRPC side.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from kubeinfer.cli.main import build_parser
from kubeinfer.runtime.serve_command import config_from_args
from serve_process import free_port


def config(*argv: str):
    return config_from_args(
        build_parser().parse_args(["serve", "--model-name", "m", "--onnx", "/m.onnx", *argv])
    )


def test_the_flag_and_its_variable_set_the_grpc_port(monkeypatch) -> None:
    assert config().grpc_port is None
    assert config("--grpc-port", "8001").grpc_port == 8001
    monkeypatch.setenv("KUBEINFER_SERVE_GRPC_PORT", "8002")
    assert config().grpc_port == 8002
    assert config("--grpc-port", "8003").grpc_port == 8003


def test_the_http_port_is_refused_as_the_grpc_port() -> None:
    with pytest.raises(ValueError, match=r"grpcPort: .*grpcPort 9000 is the httpPort"):
        config("--port", "9000", "--grpc-port", "9000")


@pytest.mark.slow
def test_a_grpc_port_in_use_stops_the_start(tiny_model: Path, tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        termination = tmp_path / "termination-log"
        result = subprocess.run(
            [sys.executable, "-m", "kubeinfer.cli", "serve", "--onnx", str(tiny_model),
             "--model-name", "tiny", "--host", "127.0.0.1", "--port", str(free_port()),
             "--grpc-port", str(taken), "--termination-message-path", str(termination)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on 127.0.0.1:{taken} (gRPC)" in result.stderr
    assert termination.read_text().startswith(f"error: cannot listen on 127.0.0.1:{taken}")


@pytest.mark.slow
def test_an_http_port_in_use_stops_the_start_with_a_message(
    tiny_model: Path, tmp_path: Path
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        termination = tmp_path / "termination-log"
        result = subprocess.run(
            [sys.executable, "-m", "kubeinfer.cli", "serve", "--onnx", str(tiny_model),
             "--model-name", "tiny", "--host", "127.0.0.1", "--port", str(taken),
             "--termination-message-path", str(termination)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert f"cannot listen on 127.0.0.1:{taken} (HTTP)" in result.stderr
    assert termination.read_text().startswith(f"error: cannot listen on 127.0.0.1:{taken} (HTTP)")
