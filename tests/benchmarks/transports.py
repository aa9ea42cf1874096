"""gRPC beside REST on one `kubeinfer serve` (the serving benchmark's transport rows).

One server listens on both transports; its three ways in (REST with JSON tensors, REST
with the binary tensor extension, gRPC with raw contents) are driven in interleaved
rounds, each round running every transport at 1 client and then at 32, so a shared
machine's drift falls on all three alike. Each cell is the median over the rounds, and
each ratio is the median of the rounds' own ratios (a round's transports ran within
seconds of each other).

With a baseline source tree (`--baseline TREE`, e.g. a `git worktree` of an older commit)
a second server runs that tree's kubeinfer beside this checkout's, and each round drives
both, taking turns on which goes first: `before_after_table` compares them row by row.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from report import Row
from servers import KubeinferSpec, link_source_tree

BEFORE = "before"
"""The label of the baseline tree's server and rows."""

TRANSPORTS = ("json", "binary", "grpc")
NAMES = {"json": "REST JSON", "binary": "REST binary", "grpc": "gRPC"}
CLIENTS = (1, 32)


def baseline_spec(spec: KubeinferSpec, tree: Path, scratch: Path) -> KubeinferSpec:
    """`spec`'s server run from the source tree `tree` instead of this checkout: a
    `kubeinfer` package under `scratch` whose subpackages link to the tree's."""
    command = [sys.executable, "-m", "kubeinfer.cli", *spec.command[1:]]
    env = {**spec.env, "PYTHONPATH": str(link_source_tree(tree, scratch))}
    return dataclasses.replace(spec, label=BEFORE, command=command, env=env)


def compare_transports(
    runs: Mapping[str, Callable[[str, int], Row]], rounds: int
) -> list[list[Row]]:
    """`rounds` rounds of every (clients, transport) run by each server's
    `run(encoding, clients)`; the servers take turns going first."""
    measured = []
    labels = list(runs)
    for number in range(rounds):
        print(f"  round {number + 1} of {rounds}", flush=True)
        turn = labels[number % len(labels) :] + labels[: number % len(labels)]
        measured.append([runs[label](e, c) for label in turn for c in CLIENTS for e in TRANSPORTS])
    return measured


def _cell(rounds: Sequence[Sequence[Row]], encoding: str, clients: int) -> list[Row]:
    return [r for rows in rounds for r in rows if (r.encoding, r.clients) == (encoding, clients)]


def of_server(rounds: Sequence[Sequence[Row]], server: str) -> list[list[Row]]:
    """The rounds' rows of one server."""
    return [[r for r in rows if r.server == server] for rows in rounds]


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
        "| server CPU ms/req | perf_analyzer CPU µs/req | other CPU % |\n"
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


def _pairs(
    rounds: Sequence[Sequence[Row]], this: str, encoding: str, clients: int
) -> list[tuple[Row, Row]]:
    """Per round, this checkout's row and the baseline's, for one transport and clients."""
    pairs = []
    for rows in rounds:
        by = {r.server: r for r in rows if (r.encoding, r.clients) == (encoding, clients)}
        if this in by and BEFORE in by:
            pairs.append((by[this], by[BEFORE]))
    return pairs


def _both(pairs: Sequence[tuple[Row, Row]], value: Callable[[Row], float], digits: int) -> str:
    this = _median([value(a) for a, _ in pairs])
    before = _median([value(b) for _, b in pairs])
    return f"{this:.{digits}f} / {before:.{digits}f}"


def _ratio(pairs: Sequence[tuple[Row, Row]], value: Callable[[Row], float]) -> str:
    return f"{_median([value(a) / value(b) for a, b in pairs if value(b)]):.2f}x"


def before_after_table(model: str, rounds: Sequence[Sequence[Row]], this: str) -> str:
    """This checkout's server against the baseline's, per transport and clients: each
    side's medians, and the medians of the rounds' own ratios (this / before)."""
    head = (
        "| model | transport | clients | req/s this / before (ratio) | p50 ms this / before "
        "(ratio) | p99 ms this / before | mean batch this / before "
        "| server CPU ms/req this / before |\n"
        "|---|---|--:|--:|--:|--:|--:|--:|\n"
    )
    lines = []
    for clients in CLIENTS:
        for encoding in TRANSPORTS:
            pairs = _pairs(rounds, this, encoding, clients)
            if not pairs:
                continue
            lines.append(
                f"| {model} | {NAMES[encoding]} | {clients} "
                f"| {_both(pairs, lambda r: r.throughput, 0)} "
                f"({_ratio(pairs, lambda r: r.throughput)}) "
                f"| {_both(pairs, lambda r: r.p50_ms, 2)} ({_ratio(pairs, lambda r: r.p50_ms)}) "
                f"| {_both(pairs, lambda r: r.p99_ms, 2)} "
                f"| {_both(pairs, lambda r: r.mean_batch or 0.0, 1)} "
                f"| {_both(pairs, lambda r: r.server_cpu_ms_per_request, 2)} |"
            )
    return head + "\n".join(lines) + "\n"
