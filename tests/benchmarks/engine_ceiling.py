"""The in-process ceiling, and the reference outputs the servers are checked against.

The ceiling is ONNX Runtime called directly in a loop at each batch size, with nothing
else on the machine: no HTTP, no codec, no queue. No server can serve more items per
second than the best of these figures, so served/ceiling says how much of the engine a
server delivers. The same session gives each request's expected output, so a server that
answers fast but wrong is caught before it is timed.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class CeilingPoint:
    batch_size: int
    seconds_per_batch: float

    @property
    def items_per_second(self) -> float:
        return self.batch_size / self.seconds_per_batch


def open_session(model_path: Path, threads: int) -> ort.InferenceSession:
    """The session settings every server in the benchmark gets (kubeinfer's engine's):
    `threads` intra-op threads, one inter-op thread, no spin-waiting (spinning threads
    would take the core the HTTP event loop and the load generator need)."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def measure_ceiling(
    model_path: Path,
    threads: int,
    min_seconds: float,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
    seed: int = 1,
) -> list[CeilingPoint]:
    """Seconds per `session.run` at each batch size: 2 warm-up runs, then runs until
    `min_seconds` have passed (at least 3). The session is closed before returning so its
    threads and memory are gone before a server starts."""
    session = open_session(model_path, threads)
    spec = session.get_inputs()[0]
    width = int(spec.shape[1])
    rng = np.random.default_rng(seed)
    points = []
    try:
        for batch_size in batch_sizes:
            feed = {spec.name: rng.standard_normal((batch_size, width)).astype(np.float32)}
            for _ in range(2):
                session.run(None, feed)
            runs, start = 0, time.perf_counter()
            while runs < 3 or time.perf_counter() - start < min_seconds:
                session.run(None, feed)
                runs += 1
            points.append(CeilingPoint(batch_size, (time.perf_counter() - start) / runs))
    finally:
        del session
        gc.collect()
    return points


def reference_outputs(model_path: Path, items: np.ndarray) -> np.ndarray:
    """The first output for each item run alone (batch 1), as the servers will run it."""
    session = open_session(model_path, 1)
    name = session.get_inputs()[0].name
    try:
        return np.concatenate([session.run(None, {name: item[None]})[0] for item in items])
    finally:
        del session
        gc.collect()
