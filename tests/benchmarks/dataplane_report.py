"""bench_dataplane's report: the measured rounds in, Markdown out (pure: the ratios and the
goals' verdicts are computed here, once).

The side-by-side table has, per model, transport and clients, a row per server (the
baseline commit's runtime, this commit's, the unbatched server at 1 client) and one for
the raw engine at the batch this commit's server formed; each server's requests/s is
given against the baseline's (the median of the rounds' own ratios) and against the raw
engine's items/s at the server's own mean batch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dataplane_workloads import RawPoint, raw_at
from report import Row

BASELINE, OURS, UNBATCHED = "baseline", "this-commit", "unbatched"
"""The servers' labels in the rows (`Row.server`) and the logs."""
SERVERS = (BASELINE, OURS, UNBATCHED)
TRANSPORTS = ("json", "binary", "grpc", "shm")
NAMES = {"json": "REST JSON", "binary": "REST binary", "grpc": "gRPC", "shm": "system shm"}

GOAL_OF_RAW = {"small-mlp": 0.50, "memory-bound-mlp": 0.85}
"""This commit's requests/s as a share of the raw engine's items/s at the batch it formed."""
GOAL_CPU_US = 40.0
"""This commit's server CPU per request less the engine's own CPU per row, at most."""


@dataclass(frozen=True)
class Labels:
    """What the report calls each server."""

    baseline: str
    ours: str = "this commit (Rust data plane)"
    unbatched: str = "unbatched server"

    def of(self, label: str) -> str:
        return {BASELINE: self.baseline, OURS: self.ours, UNBATCHED: self.unbatched}[label]


@dataclass
class ModelRun:
    model: str
    max_batch_size: int
    rounds: list[list[Row]]
    transports: dict[str, tuple[str, ...]]
    metrics: dict[str, bool]
    raw: dict[int, RawPoint]
    crossings: int | None
    slots: int | None
    ours_batches: float | None
    """Batches this commit's server ran over its life (its /metrics just before it stopped)."""
    notes: list[str] = field(default_factory=list)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass(frozen=True)
class Cell:
    """One (model, transport, clients) across the servers: medians over the rounds."""

    model: str
    transport: str
    clients: int
    rows: dict[str, list[Row]]
    ours_over_baseline: float
    """The median of the rounds' own ratios of requests/s."""
    raw: dict[int, RawPoint]

    def median(self, label: str, value: Callable[[Row], float | None]) -> float | None:
        values = [v for r in self.rows.get(label, []) if (v := value(r)) is not None]
        return _median(values) if values else None

    def batch(self, label: str) -> float | None:
        return self.median(label, lambda r: r.mean_batch)

    def raw_for(self, label: str) -> tuple[float, float, bool] | None:
        """The raw engine's items/s and CPU µs per row at `label`'s mean batch, and True;
        where that batch is unknown, its best items/s and CPU per row over the sizes
        measured (a stricter bound) and False. None: `label` has no rows here."""
        if not self.rows.get(label) or not self.raw:
            return None
        batch = self.batch(label)
        if batch:
            return (*raw_at(self.raw, batch), True)
        best = max(p.items_per_second for p in self.raw.values())
        return best, min(p.cpu_us_per_row for p in self.raw.values()), False

    def over_raw(self, label: str) -> float | None:
        rate, raw = self.median(label, lambda r: r.throughput), self.raw_for(label)
        return rate / raw[0] if rate is not None and raw and raw[0] else None


def cells(run: ModelRun, clients: Sequence[int]) -> list[Cell]:
    out = []
    for count in clients:
        for transport in TRANSPORTS:
            rows = {
                label: [
                    r
                    for measured in run.rounds
                    for r in measured
                    if (r.server, r.encoding, r.clients) == (label, transport, count)
                ]
                for label in SERVERS
            }
            if not rows[BASELINE] and not rows[OURS]:
                continue
            ratios = []
            for measured in run.rounds:
                by = {
                    r.server: r for r in measured if (r.encoding, r.clients) == (transport, count)
                }
                if BASELINE in by and OURS in by and by[BASELINE].throughput:
                    ratios.append(by[OURS].throughput / by[BASELINE].throughput)
            out.append(Cell(run.model, transport, count, rows, _median(ratios), run.raw))
    return out


def _f(value: float | None, digits: int = 0, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}{suffix}"


def side_by_side(all_cells: Sequence[Cell], labels: Labels) -> str:
    head = (
        "| model | transport | clients | server | req/s | vs baseline | vs raw at its batch "
        "| p50 ms | p99 ms | mean batch | server CPU µs/req | other CPU % |\n"
        "|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    lines = []
    for c in all_cells:
        where = f"| {c.model} | {NAMES[c.transport]} | {c.clients} "
        for label in SERVERS:
            if not c.rows[label]:
                continue
            raw = c.raw_for(label) if label != UNBATCHED else None
            versus = {BASELINE: "1.00x", OURS: _f(c.ours_over_baseline, 2, "x")}.get(label, "")
            best = " (best)" if raw and not raw[2] else ""
            over_raw = _f(c.over_raw(label), 2, "x") + best if raw else "—"
            lines.append(
                f"{where}| {labels.of(label)} | {_f(c.median(label, lambda r: r.throughput))} "
                f"| {versus if c.rows[BASELINE] else '—'} | {over_raw} "
                f"| {_f(c.median(label, lambda r: r.p50_ms), 2)} "
                f"| {_f(c.median(label, lambda r: r.p99_ms), 2)} "
                f"| {_f(c.batch(label), 1)} "
                f"| {_f(c.median(label, lambda r: r.server_cpu_ms_per_request * 1000))} "
                f"| {_f(c.median(label, lambda r: r.foreign_cpu_pct))} |"
            )
        raw = c.raw_for(OURS)
        if raw is not None:
            at = f"batch {c.batch(OURS):.1f}" if raw[2] else "its best"
            lines.append(
                f"{where}| raw engine (ONNX Runtime, {at}) | {raw[0]:.0f} items/s | | 1.00x "
                f"| | | {_f(c.batch(OURS), 1)} | {raw[1]:.0f} per row | |"
            )
    return head + "\n".join(lines) + "\n"


def raw_table(runs: Sequence[ModelRun]) -> str:
    head = "| model | batch | items/s | ms per batch | CPU µs per row |\n|---|--:|--:|--:|--:|\n"
    lines = [
        f"| {run.model} | {p.batch_size} | {p.items_per_second:.0f} "
        f"| {p.seconds_per_batch * 1000:.2f} | {p.cpu_us_per_row:.0f} |"
        for run in runs
        for p in run.raw.values()
    ]
    return head + "\n".join(lines) + "\n"


def crossings_lines(runs: Sequence[ModelRun]) -> str:
    lines = []
    for run in runs:
        if run.crossings is None:
            lines.append(f"- {run.model}: this commit's server logged no `gil_crossings=` at stop.")
            continue
        slots = run.slots or 0
        if run.ours_batches:
            per = (run.crossings - slots) / run.ours_batches
            lines.append(
                f"- {run.model}: {run.crossings} GIL crossings over the server's life, "
                f"{slots} of them its slots' at start, for {run.ours_batches:.0f} batches: "
                f"**{per:.3f} per batch**."
            )
        else:
            lines.append(
                f"- {run.model}: {run.crossings} GIL crossings over the server's life "
                f"({slots} of them its slots' at start); per batch not known: its batches "
                "were not counted (no /metrics read before it stopped)."
            )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Goal:
    goal: str
    measured: str
    met: bool | None


def goals(all_cells: Sequence[Cell], models: Sequence[str], top: int) -> list[Goal]:
    """The issue's goals for every model, over REST JSON and REST binary always and over
    the other transports where this commit's server served them: at `top` clients its
    share of the raw engine (the MLPs) and its CPU per request against the engine's per
    row; at 1 client its p50 against the unbatched server's."""
    out = []
    by = {(c.model, c.transport, c.clients): c for c in all_cells}

    def wanted(model: str, transport: str, clients: int) -> Cell | None:
        cell = by.get((model, transport, clients))
        if cell is not None and cell.median(OURS, lambda r: r.throughput) is not None:
            return cell
        return None

    for model in models:
        for transport in TRANSPORTS:
            cell = wanted(model, transport, top)
            if cell is None and transport not in ("json", "binary"):
                continue
            where = f"{model}, {NAMES[transport]}, {top} clients"
            share = GOAL_OF_RAW.get(model)
            raw_goal = f"{where}: this commit ≥ {share:.0%} of raw" if share else None
            cpu_goal = (
                f"{where}: this commit's server CPU per request ≤ engine's CPU per row + "
                f"{GOAL_CPU_US:.0f} µs"
            )
            raw = cell.raw_for(OURS) if cell is not None else None
            if cell is None or raw is None:
                out += [Goal(g, "not measured", None) for g in (raw_goal, cpu_goal) if g]
                continue
            rate = cell.median(OURS, lambda r: r.throughput) or 0.0
            batch = cell.batch(OURS)
            at = f"batch {batch:.1f}" if raw[2] and batch else "its best (the batch unknown)"
            over = cell.over_raw(OURS)
            if raw_goal and share and over is not None:
                measured = f"{over:.0%} ({rate:.0f} req/s vs raw {raw[0]:.0f} items/s at {at})"
                out.append(Goal(raw_goal, measured, over >= share))
            cpu = cell.median(OURS, lambda r: r.server_cpu_ms_per_request * 1000)
            if cpu is not None:
                extra = cpu - raw[1]
                measured = f"{cpu:.0f} vs {raw[1]:.0f} µs ({extra:+.0f}; raw at {at})"
                out.append(Goal(cpu_goal, measured, extra <= GOAL_CPU_US))
        for transport in ("json", "binary"):
            goal = f"{model}, {NAMES[transport]}, 1 client: this commit's p50 ≤ unbatched's"
            cell = wanted(model, transport, 1)
            base = cell.median(UNBATCHED, lambda r: r.p50_ms) if cell else None
            ours = cell.median(OURS, lambda r: r.p50_ms) if cell else None
            if ours is None or base is None:
                out.append(Goal(goal, "not measured", None))
                continue
            out.append(
                Goal(goal, f"{ours:.2f} vs {base:.2f} ms ({ours - base:+.2f})", ours <= base)
            )
    return out


def goals_table(found: Sequence[Goal]) -> str:
    mark = {True: "met", False: "**missed**", None: "not measured"}
    lines = [f"| {g.goal} | {g.measured} | {mark[g.met]} |" for g in found]
    return "| goal | measured | verdict |\n|---|---|---|\n" + "\n".join(lines) + "\n"


def served_lines(runs: Sequence[ModelRun], labels: Labels) -> str:
    lines = []
    for run in runs:
        served = "; ".join(
            f"{labels.of(label)}: {', '.join(NAMES[t] for t in ts)}"
            f"{'' if run.metrics[label] or label == UNBATCHED else ' (no /metrics)'}"
            for label, ts in run.transports.items()
        )
        lines.append(f"- {run.model} served: {served}.")
    return "\n".join(lines)


def body(
    runs: Sequence[ModelRun],
    labels: Labels,
    clients: Sequence[int],
    probe: str | None,
    failures: Sequence[str],
    overload_text: str | None,
) -> list[str]:
    """The report's sections after its heading."""
    all_cells = [c for run in runs for c in cells(run, clients)]
    parts = [
        served_lines(runs, labels),
        "\n## Side by side (single-item requests, closed loop)\n",
        side_by_side(all_cells, labels),
        "\nvs baseline: the median of the rounds' own ratios of requests/s to the baseline "
        "commit's. vs raw: the server's requests/s over the raw engine's items/s at the "
        "server's own mean batch (interpolated between the whole sizes either side; "
        "'(best)': its batch unknown, the raw engine's best items/s over the sizes "
        "measured, a stricter bound). The raw engine's row is at this commit's batch, its "
        "CPU per row at that batch.\n",
        "\n## GIL crossings (this commit's Rust data plane)\n",
        crossings_lines(runs) + (probe + "\n" if probe else ""),
        "\n## Raw engine (ONNX Runtime in this process, at the batch sizes formed)\n",
        raw_table(runs),
        "\n## Goals (issue 41)\n",
        goals_table(goals(all_cells, [run.model for run in runs], max(clients))),
    ]
    notes = [n for run in runs for n in run.notes] + list(failures)
    if notes:
        parts += ["\n## Not measured\n", "\n".join(f"- {n}" for n in notes) + "\n"]
    if overload_text:
        parts += ["\n## Overload (bench_hostile's method, small MLP)\n", overload_text + "\n"]
    return parts
