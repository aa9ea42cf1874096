"""The seeds' Transformer case (issue 29, item 7): a BERT-style encoder and a GPT-2-style
decoder (`tests/models/transformer_models.py`, larger than the tests' copies) served by
`kubeinfer serve` under each shape batching strategy, request lengths drawn uniformly from
8 to 128 tokens, 32 closed-loop clients; beside each, ONNX Runtime run directly, in this
process, on the same requests grouped the same way.

One run, side by side, per model:

- served, EqualShapes and PadToBuckets (buckets 16/32/64/128): throughput, p50 and p99
  of 32 closed-loop clients of Triton's perf_analyzer (binary tensors over HTTP, one
  sequence a request, each request's shape its own from `--input-data` JSON; the
  decoder's prompts with an empty past; every output answered, as perf_analyzer asks for
  them all); mean rows per batch from the runtime's own histogram over perf_analyzer's
  measured windows.
- direct, the same strategy: the requests taken 32 at a time (as many as the clients
  keep in flight), grouped as the strategy groups them (equal lengths; or one bucket,
  padded), up to maxBatchSize rows, each group one `InferenceSession.run` of every output
  with the serving session options; throughput, and p50/p99 of the time from the 32 requests'
  start to the end of each one's batch. A batcher with no overhead and perfect
  knowledge of what is coming: the ceiling the served figure compares with.
- direct, one request at a time: what batching buys at all.
- padding waste: the share of the positions computed under PadToBuckets that are
  padding (0 under EqualShapes).

The load generator is Triton's perf_analyzer through `kubeinfer.cli.tune.perf` (install
it with `make .venv/bin/perf_analyzer`).

    .venv/bin/python tests/benchmarks/bench_transformers.py [--rounds 3] [--duration 10]

Each round runs every row once, the strategies taking turns to go first; the tables give
each row's median over the rounds, and the ratios are the medians of each round's own
ratios (the rounds' values beside them), since other work on a shared machine moves whole
rows, not ratios within a round.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the models
sys.path.insert(0, str(HERE))

from kubeinfer.cli.tune import perf  # noqa: E402
from kubeinfer.runtime.engines.onnxruntime import serving_session_options  # noqa: E402
from models.transformer_models import (  # noqa: E402
    DecoderConfig,
    EncoderConfig,
    build_decoder,
    build_encoder,
    decoder_inputs,
    encoder_inputs,
)
from servers import HOST, REPO, ServerProcess, ServerSpec, free_port, http_get  # noqa: E402

ENCODER = EncoderConfig(vocab=8000, hidden=256, heads=4, layers=4, intermediate=1024)
DECODER = DecoderConfig(vocab=2048, hidden=256, heads=4, layers=4)
BUCKETS = (16, 32, 64, 128)
SHORTEST, LONGEST = 8, 128
MAX_BATCH = 16
STRATEGIES = ("EqualShapes", "PadToBuckets")


@dataclass
class Workload:
    """One model's requests and how to serve and run them."""

    name: str
    path: Path
    requests: list[dict[str, np.ndarray]]
    lengths: list[int]
    padded_inputs: tuple[str, ...]
    flags: list[str]


@dataclass
class Row:
    model: str
    how: str
    strategy: str
    throughput: float
    p50_ms: float
    p99_ms: float
    rows_per_batch: float | None = None
    padding: float | None = None


def bucket(length: int) -> int:
    return next(b for b in BUCKETS if b >= length)


def workloads(folder: Path, count: int, seed: int) -> list[Workload]:
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(SHORTEST, LONGEST + 1, count)]
    text = ("input_ids", "attention_mask", "token_type_ids")
    encoder = Workload(
        "bert-style",
        build_encoder(folder / "encoder.onnx", ENCODER),
        [encoder_inputs(rng, 1, n, ENCODER) for n in lengths],
        lengths,
        text,
        [f"--input-shape={n}=1:64:{LONGEST}:0" for n in text],
    )
    kv = f"{DECODER.heads}x{{}}x{DECODER.head_size}"
    past = [f"past_{i}_{p}" for i in range(DECODER.layers) for p in ("key", "value")]
    decoder = Workload(
        "gpt2-style",
        build_decoder(folder / "decoder.onnx", DECODER),
        [decoder_inputs(rng, 1, n, 0, DECODER) for n in lengths],
        lengths,
        ("input_ids", "attention_mask"),
        [
            f"--input-shape=input_ids=1:64:{LONGEST}:0",
            f"--input-shape=attention_mask=1:64:{LONGEST}:0",
            *(f"--input-shape={p}={kv.format(0)}:{kv.format(0)}:{kv.format(0)}" for p in past),
        ],
    )
    return [encoder, decoder]


def metric_sum_count(text: str, name: str) -> tuple[float, float]:
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total, count


def served(work: Workload, strategy: str, args: argparse.Namespace, logs: Path) -> Row:
    port = free_port()
    command = [
        str(REPO / ".venv" / "bin" / "kubeinfer"), "serve", "--onnx", str(work.path),
        "--model-name", work.name, "--host", HOST, "--port", str(port),
        "--max-batch-size", str(MAX_BATCH), "--intra-op-threads", str(args.threads),
        "--shape-batching", strategy, "--shape-buckets", ",".join(map(str, BUCKETS)),
        *work.flags,
    ]  # fmt: skip
    with ServerProcess(ServerSpec("kubeinfer", command, port, work.name), logs):
        url = f"http://{HOST}:{port}/metrics"
        scrapes: list[tuple[float, float]] = []

        def scrape() -> None:
            text = http_get(url)[1].decode()
            scrapes.append(metric_sum_count(text, "kubeinfer_batch_size"))

        samples = [{name: array[0] for name, array in feed.items()} for feed in work.requests]
        result = perf.run(
            perf.Target(f"{HOST}:{port}", work.name),
            perf.Load(rows=1, concurrency=args.clients),
            samples,
            args.duration / 3,
            logs / f"{work.name}-{strategy}",
            warmup_seconds=args.warmup,
            around=scrape,
        )
    (rows_before, batches_before), (rows_after, batches_after) = scrapes
    batches = batches_after - batches_before
    return Row(
        work.name, "served", strategy, result.requests_per_second, result.p50_milliseconds,
        result.p99_milliseconds, (rows_after - rows_before) / batches if batches else None,
    )  # fmt: skip


def padded_feed(work: Workload, group: list[int], length: int) -> dict[str, np.ndarray]:
    """The requests `group` as one batch at `length` tokens, padded with 0 at the end."""
    feed = {}
    for name in work.requests[0]:
        arrays = []
        for index in group:
            array = work.requests[index][name]
            if name in work.padded_inputs:
                width = [(0, 0)] * array.ndim
                width[1] = (0, length - array.shape[1])
                array = np.pad(array, width)
            arrays.append(array)
        feed[name] = np.concatenate(arrays)
    return feed


def direct(work: Workload, strategy: str | None, args: argparse.Namespace) -> Row:
    """The requests run by ONNX Runtime in this process, 32 at a time, grouped by the
    strategy (None: one request at a time)."""
    session = ort.InferenceSession(
        str(work.path), serving_session_options(args.threads), providers=["CPUExecutionProvider"]
    )
    latencies, done, computed, real = [], 0, 0, 0
    deadline = time.perf_counter() + args.warmup + args.duration
    start = None
    order = list(range(len(work.requests)))
    position = 0
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        if start is None and now >= deadline - args.duration:
            start, latencies, done = now, [], 0
        window = [order[(position + i) % len(order)] for i in range(args.clients)]
        position += args.clients
        groups: dict[int, list[int]] = {}
        for index in window:
            length = work.lengths[index]
            key = length if strategy != "PadToBuckets" else bucket(length)
            groups.setdefault(index if strategy is None else key, []).append(index)
        began = time.perf_counter()
        for key, members in groups.items():
            for at in range(0, len(members), MAX_BATCH):
                chunk = members[at : at + MAX_BATCH]
                length = key if strategy == "PadToBuckets" else work.lengths[chunk[0]]
                session.run(None, padded_feed(work, chunk, length))  # every output, as served
                finished = time.perf_counter() - began
                latencies += [finished] * len(chunk)
                computed += length * len(chunk)
                real += sum(work.lengths[i] for i in chunk)
        done += len(window)
    elapsed = time.perf_counter() - (start or deadline)
    how = "direct, one at a time" if strategy is None else "direct, same grouping"
    return Row(
        work.name, how, strategy or "-", done / elapsed,
        float(np.percentile(latencies, 50) * 1000), float(np.percentile(latencies, 99) * 1000),
        padding=1 - real / computed if computed else None,
    )  # fmt: skip


def median_rows(rows: Sequence[Row]) -> list[Row]:
    """One row per (model, run, strategy): the median of the rounds' figures."""
    keyed: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        keyed.setdefault((row.model, row.how, row.strategy), []).append(row)

    def median(values: list[float | None]) -> float | None:
        found = [v for v in values if v is not None]
        return float(np.median(found)) if found else None

    return [
        Row(
            model,
            how,
            strategy,
            float(np.median([r.throughput for r in group])),
            float(np.median([r.p50_ms for r in group])),
            float(np.median([r.p99_ms for r in group])),
            median([r.rows_per_batch for r in group]),
            median([r.padding for r in group]),
        )
        for (model, how, strategy), group in keyed.items()
    ]


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| model | run | strategy | req/s | p50 ms | p99 ms | rows/batch | padding |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        batch = "-" if r.rows_per_batch is None else f"{r.rows_per_batch:.1f}"
        pad = "-" if r.padding is None else f"{r.padding:.0%}"
        lines.append(
            f"| {r.model} | {r.how} | {r.strategy} | {r.throughput:.1f} | {r.p50_ms:.0f} | "
            f"{r.p99_ms:.0f} | {batch} | {pad} |"
        )
    return "\n".join(lines)


def ratios(rounds: Sequence[Sequence[Row]]) -> str:
    """Per model, the median over rounds of each round's own ratios: PadToBuckets over
    EqualShapes (throughput and p99), served and direct; served over direct."""
    found: dict[str, dict[str, list[float]]] = {}
    for rows in rounds:
        for model in dict.fromkeys(r.model for r in rows):
            get = {(r.how, r.strategy): r for r in rows if r.model == model}
            pad, eq = get[("served", "PadToBuckets")], get[("served", "EqualShapes")]
            dpad = get[("direct, same grouping", "PadToBuckets")]
            deq = get[("direct, same grouping", "EqualShapes")]
            one = get[("direct, one at a time", "-")]
            each = found.setdefault(model, {})
            for name, value in (
                ("served throughput PadToBuckets/EqualShapes", pad.throughput / eq.throughput),
                ("served p99 PadToBuckets/EqualShapes", pad.p99_ms / eq.p99_ms),
                ("direct throughput PadToBuckets/EqualShapes", dpad.throughput / deq.throughput),
                ("served/direct EqualShapes", eq.throughput / deq.throughput),
                ("served/direct PadToBuckets", pad.throughput / dpad.throughput),
                ("direct PadToBuckets / one at a time", dpad.throughput / one.throughput),
            ):
                each.setdefault(name, []).append(value)
    lines = []
    for model, each in found.items():
        parts = [
            f"{name} {np.median(values):.2f} ({'/'.join(f'{v:.2f}' for v in values)})"
            for name, values in each.items()
        ]
        lines.append(f"- {model}: " + "; ".join(parts))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    parser.add_argument("--requests", type=int, default=512, help="distinct requests cycled")
    parser.add_argument("--seed", type=int, default=29)
    args = parser.parse_args(argv)
    rounds: list[list[Row]] = []
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        works = workloads(folder, args.requests, args.seed)
        for index in range(args.rounds):
            rows: list[Row] = []
            order = STRATEGIES if index % 2 == 0 else STRATEGIES[::-1]  # take turns first
            for work in works:
                for strategy in order:
                    rows.append(served(work, strategy, args, folder / "logs"))
                    print(f"round {index + 1}", table(rows[-1:]).splitlines()[-1], flush=True)
                for direct_strategy in (*order, None):
                    rows.append(direct(work, direct_strategy, args))
                    print(f"round {index + 1}", table(rows[-1:]).splitlines()[-1], flush=True)
            rounds.append(rows)
    print(f"load average at the end: {os.getloadavg()}")
    print()
    print(table(median_rows([row for rows in rounds for row in rows])))
    print()
    print(ratios(rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
