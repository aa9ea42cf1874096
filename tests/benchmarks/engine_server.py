"""A benchmark's own engine (the GPU scripts' stand-ins for TensorRT) served as
`kubeinfer serve` serves a loaded one (`serve_command.run` past `load_engine_for`), by
whichever runtime `kubeinfer` resolves to in this process: this checkout's, or a
baseline's when the process was started with its packages first on PYTHONPATH
(`checkout_site.package_links`).

- `rust`: the Rust data plane, `rust_dataplane.serve` (the batching probe, readiness,
  SIGTERM's drain), with a known-answer check that has no set, as for an ONNX file;
- `python`: a baseline's Python data plane (c80431e and before): `serving.assemble` and
  `serving.serve_transports`.

Both with the NVML reader for the GPU memory gauges unless `gpu_memory` is False.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

PLANES = ("rust", "python")


def baseline_plane(checkout: Path) -> str:
    """The data plane a baseline checkout is served on: its Python one where it has it
    (the default up to c80431e), else the Rust one."""
    return "python" if (checkout / "runtime" / "serving.py").is_file() else "rust"


def serve_engine(config: Any, engine: Any, plane: str, gpu_memory: bool = True) -> int:
    """Serves `engine` under `config` (a RuntimeConfig) on `plane` until SIGTERM; returns
    the exit code. The caller closes the engine."""
    if plane == "python":
        from kubeinfer.runtime.serve_command import gpu_memory_reader
        from kubeinfer.runtime.serving import (  # type: ignore[import-not-found]
            assemble,
            serve_transports,
        )

        reader = gpu_memory_reader() if gpu_memory else None
        return asyncio.run(serve_transports(assemble(config, engine, gpu_memory=reader)))
    from kubeinfer.runtime.known_answers.runner import KnownAnswerCheck
    from kubeinfer.runtime.rust_dataplane import serve
    from kubeinfer.runtime.serve_command import gpu_memory_reader

    check = KnownAnswerCheck(
        engine, None, missing_reason="a benchmark's own engine has no known-answer set",
        missing_expected=True,
    )  # fmt: skip
    return serve(config, engine, check, gpu_memory_reader() if gpu_memory else None)
