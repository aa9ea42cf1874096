"""The servers under test, each started as a real subprocess on a loopback port.

`ServerProcess` (in `kubeinfer.cli.tune.server`, which `kubeinfer tune` uses too; its names
are re-exported here) starts one command, waits until the model answers ready (or the
process dies, whose log tail is then shown), and stops it with SIGTERM (SIGKILL after a
grace period). The three launchers build the command lines: kubeinfer from `.venv`, the
hand-written unbatched server from `.venv`, MLServer from its own `.venv-bench` (its pins
conflict with ours).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from kubeinfer.cli.tune.server import (
    HOST,
    ServerFailed,
    ServerProcess,
    ServerSpec,
    free_port,
    http_get,
)

__all__ = [
    "HOST",
    "REPO",
    "KubeinferSpec",
    "ServerFailed",
    "ServerProcess",
    "ServerSpec",
    "free_port",
    "http_get",
]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


# --------------------------------------------------------------------------- launchers


@dataclass
class KubeinferSpec(ServerSpec):
    grpc_port: int | None = None
    """Where it serves the v2 API over gRPC too (`--grpc-port`), when it does."""


def kubeinfer_spec(
    model_path: Path,
    model_name: str,
    threads: int,
    max_batch_size: int = 32,
    extra_args: tuple[str, ...] = (),
    engine: tuple[str, Path] | None = None,
    grpc: bool = False,
) -> KubeinferSpec:
    """`kubeinfer serve` from `.venv` with its default batching policy except
    maxBatchSize (32, as MLServer's); `engine` = (digest, cache directory) serves a built
    engine from the cache (verified there) instead of the ONNX file; `grpc`: gRPC on a
    port of its own too."""
    port = free_port()
    grpc_port = free_port() if grpc else None
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
        *(["--grpc-port", str(grpc_port)] if grpc_port else []),
        *extra_args,
    ]
    return KubeinferSpec(
        "kubeinfer",
        command,
        port,
        model_name,
        metrics_url=f"http://{HOST}:{port}/metrics",
        grpc_port=grpc_port,
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


def link_source_tree(tree: Path, scratch: Path) -> Path:
    """A `kubeinfer` package under `scratch` whose subpackages link to the source tree
    `tree`'s folders (pyproject's package-dir layout), so a server started with `scratch`
    on PYTHONPATH runs that tree, say an older commit's, beside this checkout. Returns the
    folder to put on PYTHONPATH."""
    package = scratch / "kubeinfer"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").touch()
    for part in ("runtime", "operator", "contract", "cluster", "cli"):
        link = package / part
        if link.is_symlink():
            link.unlink()
        if (tree / part).is_dir():
            link.symlink_to((tree / part).resolve())
    return scratch
