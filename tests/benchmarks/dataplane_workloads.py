"""bench_dataplane's models and the raw engine: each model's distinct requests and their
expected answers (ONNX Runtime's own, each request run alone), the `kubeinfer serve` flags
it is served with, and ONNX Runtime in this process at the batch sizes the servers formed.

For each model (`kubeinfer.cli.demo.mlp_models`: the overhead-bound small MLP and the
~170 MB memory-bound MLP; and a BERT-shaped encoder (`bert-encoder`), bench_transformers'
size, requests of 8 to 128 tokens served with PadToBuckets at 16/32/64/128, max batch 16).
The raw engine runs with the servers' session settings (`engine_ceiling.open_session`);
for the encoder, batches of one bucket's requests padded to it, weighted by the buckets'
shares.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_serving import DISTINCT_REQUESTS, INPUT, MEMORY, MODELS, OUTPUT, SMALL
from engine_ceiling import open_session, reference_outputs
from servers import REPO

OUTPUT_BYTES = {SMALL: 128 * 4, MEMORY: 1000 * 4}
"""Bytes of one request's output (the shared-memory region perf_analyzer sets aside)."""
WIDTH = {SMALL: 512, MEMORY: 1024}
ENCODER_MODEL = "bert-encoder"


# --------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    """One model: its requests, their expected answers, and how it is served."""

    model: str
    path: Path
    feeds: list[dict[str, np.ndarray]]
    """The distinct requests, each one row (batch axis 1) of every input."""
    expected: list[np.ndarray]
    """ONNX Runtime's `output` for each request run alone."""
    output: str
    max_batch_size: int
    flags: tuple[str, ...]
    """`kubeinfer serve` flags of this model, both servers alike."""
    output_bytes: int | None
    """Bytes of one request's outputs (perf_analyzer's output region); None: shapes that
    vary, which perf_analyzer's shared memory does not take."""
    raw_batches: Callable[[int], list[tuple[float, dict[str, np.ndarray]]]]
    """The raw engine's batches of a size: (the share of requests they stand for, feed)."""
    min_window_seconds: float = 0.0
    """perf_analyzer's shortest window, the warm-up's too: longer than a request takes at
    32 clients (a window in which nothing was answered does not count, and ten such end
    the run)."""


def mlp_workload(model: str) -> Workload:
    path = REPO / ".bench" / "models" / f"{model}.onnx"
    if not path.exists():
        MODELS[model](path)
    width = WIDTH[model]
    items = np.random.default_rng(7).standard_normal((DISTINCT_REQUESTS, width))
    items = items.astype(np.float32)
    expected = reference_outputs(path, items)
    rng = np.random.default_rng(1)

    def raw_batches(size: int) -> list[tuple[float, dict[str, np.ndarray]]]:
        return [(1.0, {INPUT: rng.standard_normal((size, width)).astype(np.float32)})]

    return Workload(
        model, path, [{INPUT: item[None]} for item in items], [e[None] for e in expected],
        OUTPUT, 32, (), OUTPUT_BYTES[model], raw_batches,
    )  # fmt: skip


def encoder_workload() -> Workload:
    """A BERT-shaped encoder (bench_transformers' size: hidden 256, 4 layers), requests of
    8 to 128 tokens, served with PadToBuckets (16/32/64/128), max batch 16, as
    bench_transformers serves it; the raw engine's batches are one bucket's requests
    padded to the bucket, each bucket weighted by its share of the requests."""
    from bench_transformers import BUCKETS, ENCODER, LONGEST, MAX_BATCH, SHORTEST, bucket
    from models.transformer_models import build_encoder, encoder_inputs

    path = REPO / ".bench" / "models" / f"{ENCODER_MODEL}.onnx"
    if not path.exists():
        build_encoder(path, ENCODER)
    rng = np.random.default_rng(7)
    lengths = [int(n) for n in rng.integers(SHORTEST, LONGEST + 1, 2 * DISTINCT_REQUESTS)]
    feeds = [encoder_inputs(rng, 1, n, ENCODER) for n in lengths]
    session = open_session(path, 1)
    try:
        expected = [session.run(["logits"], feed)[0] for feed in feeds]
    finally:
        del session
        gc.collect()
    text = ("input_ids", "attention_mask", "token_type_ids")
    flags = ("--shape-batching", "PadToBuckets", "--shape-buckets", ",".join(map(str, BUCKETS)),
             *(f"--input-shape={n}=1:64:{LONGEST}:0" for n in text))  # fmt: skip
    by_bucket: dict[int, list[int]] = {}
    for index, n in enumerate(lengths):
        by_bucket.setdefault(bucket(n), []).append(index)

    def raw_batches(size: int) -> list[tuple[float, dict[str, np.ndarray]]]:
        out = []
        for length, members in sorted(by_bucket.items()):
            chosen = [members[i % len(members)] for i in range(size)]
            feed = {
                name: np.concatenate([np.pad(feeds[i][name], [(0, 0), (0, length - lengths[i])])
                                      for i in chosen])
                for name in text
            }  # fmt: skip
            out.append((len(members) / len(lengths), feed))
        return out

    return Workload(
        ENCODER_MODEL, path, feeds, expected, "logits", MAX_BATCH, flags, None, raw_batches, 4.0
    )


WORKLOADS: dict[str, Callable[[], Workload]] = {
    SMALL: lambda: mlp_workload(SMALL),
    MEMORY: lambda: mlp_workload(MEMORY),
    ENCODER_MODEL: encoder_workload,
}


# --------------------------------------------------------------------------- raw engine


@dataclass(frozen=True)
class RawPoint:
    batch_size: int
    seconds_per_batch: float
    cpu_seconds_per_batch: float

    @property
    def items_per_second(self) -> float:
        return self.batch_size / self.seconds_per_batch

    @property
    def cpu_us_per_row(self) -> float:
        return self.cpu_seconds_per_batch / self.batch_size * 1e6


def raw_engine(
    work: Workload, threads: int, sizes: Sequence[int], seconds: float
) -> dict[int, RawPoint]:
    """ONNX Runtime in this process (the servers' session settings) at each batch size: per
    batch of the workload's, 2 warm-up runs, then runs for `seconds` (at least 3); the
    median wall time of a run (a shared machine's pauses, which a mean would take in, fall
    on a few runs) and this process's CPU time (every thread: the intra-op threads too)
    per batch, the batches weighted by the share of requests they stand for."""
    session = open_session(work.path, threads)
    points = {}
    try:
        for size in sorted(set(sizes)):
            wall = cpu = 0.0
            for weight, feed in work.raw_batches(size):
                for _ in range(2):
                    session.run(None, feed)
                times: list[float] = []
                start, cpu_start = time.perf_counter(), time.process_time()
                while len(times) < 3 or time.perf_counter() - start < seconds:
                    began = time.perf_counter()
                    session.run(None, feed)
                    times.append(time.perf_counter() - began)
                wall += weight * statistics.median(times)
                cpu += weight * (time.process_time() - cpu_start) / len(times)
            points[size] = RawPoint(size, wall, cpu)
    finally:
        del session
        gc.collect()
    return points


def sizes_around(batches: Sequence[float | None], largest: int) -> set[int]:
    """The whole batch sizes either side of each mean, and 1 and `largest` always."""
    sizes = {1, largest}
    for b in batches:
        if b is not None and not math.isnan(b):
            sizes |= {max(1, math.floor(b)), min(largest, max(1, math.ceil(b)))}
    return sizes


def raw_at(points: dict[int, RawPoint], batch: float) -> tuple[float, float]:
    """The raw engine's items/s and CPU µs per row at a mean batch, interpolated between
    the whole sizes either side (seconds and CPU per batch are close to linear there)."""
    low, high = max(1, math.floor(batch)), max(1, math.ceil(batch))
    a, b = points[low], points[high]
    w = batch - low if high != low else 0.0
    seconds = a.seconds_per_batch + w * (b.seconds_per_batch - a.seconds_per_batch)
    cpu = a.cpu_seconds_per_batch + w * (b.cpu_seconds_per_batch - a.cpu_seconds_per_batch)
    return batch / seconds, cpu / batch * 1e6
