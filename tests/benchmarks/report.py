"""Turns the measured runs into the Markdown the benchmark prints: the serving table with
its ratios, the ceiling table, the int8 row and the issue's targets checked one by one.

Pure: rows in, text out, so the ratios and the target verdicts are computed in one place.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from engine_ceiling import CeilingPoint


@dataclass(frozen=True)
class Row:
    """One load run against one server."""

    model: str
    server: str
    encoding: str
    clients: int
    throughput: float
    p50_ms: float
    p99_ms: float
    mean_batch: float | None
    errors: int
    client_us_per_request: float
    server_cpu_ms_per_request: float
    """CPU the server's processes used per completed request: unlike req/s, this hardly
    moves when other processes share the machine."""
    foreign_cpu_pct: float
    """CPU used during the window by processes other than the server and the load
    generator, in % of the machine: other users of a shared machine show up here."""


@dataclass(frozen=True)
class Int8Comparison:
    engine_megabytes: dict[str, float]
    ceiling_items_per_s: dict[str, dict[int, float]]  # precision -> batch -> items/s
    served: dict[tuple[str, str], Row]  # (precision, encoding) -> kubeinfer row
    accuracy: dict[str, float]


def _find(rows: Sequence[Row], server: str, like: Row) -> Row | None:
    for row in rows:
        if (row.server, row.model, row.encoding, row.clients) == (
            server,
            like.model,
            like.encoding,
            like.clients,
        ):
            return row
    return None


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def _ratio(a: Row | None, b: Row | None) -> str:
    if a is None or b is None or not b.throughput:
        return "—"
    return f"{a.throughput / b.throughput:.2f}x"


def serving_table(rows: Sequence[Row], ceilings: dict[str, list[CeilingPoint]]) -> str:
    head = (
        "| model | server | encoding | clients | req/s | p50 ms | p99 ms | mean batch "
        "| kubeinfer/MLServer | kubeinfer/unbatched | served/ceiling | errors "
        "| server CPU ms/req | perf_analyzer CPU µs/req | other CPU % |\n"
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    lines = []
    for row in rows:
        is_ours = row.server == "kubeinfer"
        best = max(p.items_per_second for p in ceilings[row.model])
        lines.append(
            f"| {row.model} | {row.server} | {row.encoding} | {row.clients} "
            f"| {row.throughput:.0f} | {_fmt(row.p50_ms, 2)} | {_fmt(row.p99_ms, 2)} "
            f"| {_fmt(row.mean_batch)} "
            f"| {_ratio(row, _find(rows, 'mlserver', row)) if is_ours else ''} "
            f"| {_ratio(row, _find(rows, 'unbatched', row)) if is_ours else ''} "
            f"| {row.throughput / best:.2f} | {row.errors} "
            f"| {row.server_cpu_ms_per_request:.2f} | {row.client_us_per_request:.0f} "
            f"| {row.foreign_cpu_pct:.0f} |"
        )
    return head + "\n".join(lines) + "\n"


def ceiling_table(ceilings: dict[str, list[CeilingPoint]]) -> str:
    sizes = sorted({p.batch_size for points in ceilings.values() for p in points})
    head = "| model | " + " | ".join(f"batch {b}" for b in sizes) + " |\n"
    head += "|---|" + "--:|" * len(sizes) + "\n"
    lines = []
    for model, points in ceilings.items():
        by_size = {p.batch_size: p for p in points}
        cells = [
            f"{by_size[b].items_per_second:.0f}/s ({by_size[b].seconds_per_batch * 1000:.1f} ms)"
            if b in by_size
            else "—"
            for b in sizes
        ]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def int8_table(comparison: Int8Comparison) -> str:
    head = (
        "| precision | encoding | engine MB | ceiling batch 1 | ceiling batch 32 | req/s "
        "| clients | p50 ms | p99 ms | mean batch | server CPU ms/req |\n"
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    lines = []
    for (precision, encoding), row in comparison.served.items():
        ceiling = comparison.ceiling_items_per_s.get(precision, {})
        lines.append(
            f"| {precision} | {encoding} | {comparison.engine_megabytes[precision]:.0f} "
            f"| {_fmt(ceiling.get(1), 0)}/s | {_fmt(ceiling.get(32), 0)}/s "
            f"| {row.throughput:.0f} | {row.clients} | {_fmt(row.p50_ms, 2)} "
            f"| {_fmt(row.p99_ms, 2)} | {_fmt(row.mean_batch)} "
            f"| {row.server_cpu_ms_per_request:.2f} |"
        )
    accuracy = ", ".join(f"{k} {v:.4g}" for k, v in comparison.accuracy.items())
    return (
        head
        + "\n".join(lines)
        + f"\n\nint8 against fp32 (the manifest's accuracy report): {accuracy}\n"
    )


@dataclass(frozen=True)
class Verdict:
    target: str
    measured: str
    met: bool | None  # None: not measured in this run


def _get(rows: Sequence[Row], server: str, model: str, encoding: str, clients: int) -> Row | None:
    for row in rows:
        if (row.server, row.model, row.encoding, row.clients) == (server, model, encoding, clients):
            return row
    return None


def check_targets(rows: Sequence[Row], memory_model: str, small_model: str) -> list[Verdict]:
    """The issue's targets, each with what was measured."""
    verdicts = []

    def ratio_target(text: str, a: Row | None, b: Row | None, minimum: float) -> None:
        if a is None or b is None:
            verdicts.append(Verdict(text, "not measured", None))
            return
        ratio = a.throughput / b.throughput
        verdicts.append(
            Verdict(
                text,
                f"{ratio:.2f}x ({a.throughput:.0f} vs {b.throughput:.0f} req/s)",
                ratio >= minimum,
            )
        )

    ours = _get(rows, "kubeinfer", memory_model, "json", 32)
    mls = _get(rows, "mlserver", memory_model, "json", 32)
    ratio_target("memory-bound, JSON, 32 clients: ≥ 2.5x MLServer", ours, mls, 2.5)
    ratio_target(
        "memory-bound, JSON, 32 clients: ≥ 5x unbatched",
        ours,
        _get(rows, "unbatched", memory_model, "json", 32),
        5.0,
    )
    if ours and mls:
        verdicts.append(
            Verdict(
                "memory-bound, JSON, 32 clients: p99 ≤ MLServer's",
                f"{ours.p99_ms:.1f} vs {mls.p99_ms:.1f} ms",
                ours.p99_ms <= mls.p99_ms,
            )
        )
    ratio_target(
        "small, JSON, 32 clients: ≥ 1.0x unbatched",
        _get(rows, "kubeinfer", small_model, "json", 32),
        _get(rows, "unbatched", small_model, "json", 32),
        1.0,
    )
    one, base = (_get(rows, s, small_model, "json", 1) for s in ("kubeinfer", "unbatched"))
    if one and base:
        verdicts.append(
            Verdict(
                "small, 1 client: p50 within 0.3 ms of unbatched",
                f"{one.p50_ms:.2f} vs {base.p50_ms:.2f} ms ({one.p50_ms - base.p50_ms:+.2f})",
                one.p50_ms - base.p50_ms <= 0.3,
            )
        )
    else:
        verdicts.append(
            Verdict("small, 1 client: p50 within 0.3 ms of unbatched", "not measured", None)
        )
    ratio_target(
        "memory-bound, 32 clients: binary ≥ 1.3x JSON",
        _get(rows, "kubeinfer", memory_model, "binary", 32),
        ours,
        1.3,
    )
    return verdicts


def targets_table(verdicts: Sequence[Verdict]) -> str:
    mark = {True: "met", False: "**missed**", None: "not measured"}
    lines = [f"| {v.target} | {v.measured} | {mark[v.met]} |" for v in verdicts]
    return "| target | measured | verdict |\n|---|---|---|\n" + "\n".join(lines) + "\n"


def rounds_table(title: str, rounds: Sequence[dict[str, float]], digits: int = 1) -> str:
    """A table of timed rounds: each measure's median (in seconds) and every round's
    value, in the rounds' order; the measures are the first round's keys."""
    lines = [f"| {title} | median s | rounds |", "|---|---:|---|"]
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        listed = ", ".join(f"{v:.{digits}f}" for v in values)
        lines.append(f"| {key} | {statistics.median(values):.{digits}f} | {listed} |")
    return "\n".join(lines)
