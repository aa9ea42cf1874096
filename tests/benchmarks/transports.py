"""gRPC beside REST on one `kubeinfer serve` (the serving benchmark's transport rows).

One server listens on both transports; its three ways in (REST with JSON tensors, REST
with the binary tensor extension, gRPC with raw contents) are driven in interleaved
rounds, each round running every transport at 1 client and then at 32, so a shared
machine's drift falls on all three alike. Each cell is the median over the rounds, and
each ratio is the median of the rounds' own ratios (a round's transports ran within
seconds of each other).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from report import Row

TRANSPORTS = ("json", "binary", "grpc")
NAMES = {"json": "REST JSON", "binary": "REST binary", "grpc": "gRPC"}
CLIENTS = (1, 32)


def compare_transports(run: Callable[[str, int], Row], rounds: int) -> list[list[Row]]:
    """`rounds` rounds of every (clients, transport) run by `run(encoding, clients)`."""
    measured = []
    for number in range(rounds):
        print(f"  round {number + 1} of {rounds}", flush=True)
        measured.append([run(encoding, c) for c in CLIENTS for encoding in TRANSPORTS])
    return measured


def _cell(rounds: Sequence[Sequence[Row]], encoding: str, clients: int) -> list[Row]:
    return [r for rows in rounds for r in rows if (r.encoding, r.clients) == (encoding, clients)]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ratios(
    rounds: Sequence[Sequence[Row]], clients: int, value: Callable[[Row], float], a: str, b: str
) -> list[float]:
    ratios = []
    for rows in rounds:
        by = {r.encoding: r for r in rows if r.clients == clients}
        if a in by and b in by and value(by[b]):
            ratios.append(value(by[a]) / value(by[b]))
    return ratios


def transports_table(model: str, rounds: Sequence[Sequence[Row]]) -> str:
    head = (
        "| model | transport | clients | req/s | p50 ms | p99 ms | mean batch | errors "
        "| server CPU ms/req | loadgen µs/req | other CPU % |\n"
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    lines = []
    for clients in CLIENTS:
        for encoding in TRANSPORTS:
            cell = _cell(rounds, encoding, clients)
            if not cell:
                continue
            batches = [r.mean_batch for r in cell if r.mean_batch is not None]
            lines.append(
                f"| {model} | {NAMES[encoding]} | {clients} "
                f"| {_median([r.throughput for r in cell]):.0f} "
                f"| {_median([r.p50_ms for r in cell]):.2f} "
                f"| {_median([r.p99_ms for r in cell]):.2f} "
                f"| {_median(batches):.1f} | {sum(r.errors for r in cell)} "
                f"| {_median([r.server_cpu_ms_per_request for r in cell]):.2f} "
                f"| {_median([r.client_us_per_request for r in cell]):.0f} "
                f"| {_median([r.foreign_cpu_pct for r in cell]):.0f} |"
            )
    ratio_lines = []
    for other in ("json", "binary"):
        p50 = _ratios(rounds, 1, lambda r: r.p50_ms, "grpc", other)
        throughput = _ratios(rounds, 32, lambda r: r.throughput, "grpc", other)
        ratio_lines.append(
            f"- gRPC / {NAMES[other]}: p50 at 1 client {_median(p50):.2f}x "
            f"(rounds: {', '.join(f'{v:.2f}' for v in p50)}); throughput at 32 clients "
            f"{_median(throughput):.2f}x (rounds: {', '.join(f'{v:.2f}' for v in throughput)})"
        )
    return head + "\n".join(lines) + "\n\n" + "\n".join(ratio_lines) + "\n"
