"""What serving one request per run costs: the tokenizer-in-graph classifier that batches
(`models.tokenizer_models.build_hf_json_classifier`, padding masked) served by `kubeinfer
serve` as configured (maxBatchSize 8) and one request per run (`--max-batch-size 1`, which
is what a model found not to batch gets), under the same closed-loop load of
one-text requests over HTTP (tritonclient, `--clients` threads).

    .venv/bin/python tests/benchmarks/bench_one_request_per_run.py \
        [--clients 16] [--requests 400] [--rounds 3]

Prints, per round and setting, requests per second and the mean rows per batch from the
runtime's own histogram; the settings take turns to go first, and the table gives each
setting's median over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "support"), str(ROOT)]

import numpy as np  # noqa: E402
import tritonclient.http as triton_http  # noqa: E402
from models.tokenizer_models import build_hf_json_classifier  # noqa: E402
from serve_process import ServeProcess  # noqa: E402

TEXTS = [
    "the dog is low", "hello world", "a lazy dog", "the quick brown fox jumps over the dog",
    "is the world low", "the the the", "dogs and cats", "low low low dog",
]  # fmt: skip


def _load(serving: ServeProcess, clients: int, requests: int) -> float:
    """Requests per second of `requests` one-text requests from `clients` threads."""

    def one(index: int) -> None:
        client = triton_http.InferenceServerClient(serving.address)
        tensor = triton_http.InferInput("str", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([TEXTS[index % len(TEXTS)].encode()], object))
        client.infer(serving.name, [tensor])

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(clients)))  # warm every connection and the engine
        started = time.perf_counter()
        list(pool.map(one, range(requests)))
        return requests / (time.perf_counter() - started)


def _rows_per_batch(serving: ServeProcess) -> float:
    total = serving.metric("kubeinfer_batch_size_sum")
    count = serving.metric("kubeinfer_batch_size_count")
    return total / count if count else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = {"maxBatchSize 8": "8", "one request per run": "1"}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as work:
        model = build_hf_json_classifier(Path(work) / "model.onnx", mask_padding=True)
        for round_ in range(args.rounds):
            order = list(settings) if round_ % 2 == 0 else list(reversed(settings))
            for name in order:
                flags = ("--max-batch-size", settings[name], "--intra-op-threads", "1")
                with ServeProcess(model, "classifier", *flags) as serving:
                    rate = _load(serving, args.clients, args.requests)
                    rows = _rows_per_batch(serving)
                results[name].append((rate, rows))
                print(f"round {round_ + 1} {name}: {rate:.0f} requests/s, {rows:.2f} rows/batch")
    print(f"\n| setting | requests/s (median of {args.rounds}) | rows per batch |")
    print("|---|---|---|")
    for name, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        rows = statistics.median(b for _, b in runs)
        print(f"| {name} | {rate:.0f} | {rows:.2f} |")


if __name__ == "__main__":
    main()
