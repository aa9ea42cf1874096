"""What `kubeinfer tune` prints: a progress line per point, the table of points, the
frontier, the chosen `runtime.batching` block with its cost, and the same as JSON
(`--json`). Pure: text and dicts from measurements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from kubeinfer.cli.tune.frontier import (
    Choice,
    Measurement,
    Setting,
    meets_slo,
    window_cost_of,
)
from kubeinfer.contract.cost import WindowCost


@dataclass(frozen=True)
class Context:
    """What the figures were measured under, said beside them."""

    slo_p99_milliseconds: float
    traffic: str
    engine: str
    window: str
    gpu_engine: bool
    node_cost_per_hour: float | None = None
    max_queue_size: int | None = None


ADAPTIVE_NOTE = (
    "The figures hold for policy Static, as swept. With policy Adaptive (and\n"
    "spec.slo.p99LatencyMilliseconds) the runtime sets its queue delay and preferred batch\n"
    "size online instead; maxBatchSize and executionSlots still apply."
)


def format_duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    return f"{whole // 60}:{whole % 60:02d}"


def progress_line(
    done: int, total: int, point: Measurement, slo_p99_milliseconds: float, eta: float | None
) -> str:
    """One line per measured point: what it ran, what it measured, the time left."""
    width = len(str(total))
    head = f"[{done:>{width}}/{total}] {point.setting.describe()}: "
    if point.failure is not None:
        figures = f"failed: {point.failure}"
    else:
        figures = (
            f"{point.requests_per_second:.0f} req/s, p99 {point.p99_milliseconds:.2f} ms"
            + (f", {point.errors} failed" if point.errors else "")
            + (" (meets the SLO)" if meets_slo(point, slo_p99_milliseconds) else "")
        )
    tail = "" if eta is None or done == total else f"; ETA {format_duration(eta)}"
    return head + figures + tail


def batching_block(setting: Setting, max_queue_size: int | None = None) -> str:
    """The `runtime.batching` YAML of an InferenceDeployment for the setting: the policy
    and the fields the sweep set (and the queue size it ran with, when given); the rest
    keep their defaults."""
    policy = setting.batching_policy()
    fields = {"policy", "max_batch_size", "max_queue_delay_microseconds", "execution_slots"}
    if max_queue_size is not None:
        policy = policy.model_copy(update={"max_queue_size": max_queue_size})
        fields.add("max_queue_size")
    batching = policy.model_dump(mode="json", by_alias=True, include=fields)
    batching = {"policy": batching.pop("policy"), **batching}
    return yaml.safe_dump({"runtime": {"batching": batching}}, sort_keys=False)


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else value


def _cell(value: float | None, digits: int) -> str:
    return "-" if _number(value) is None else f"{value:.{digits}f}"


def points_table(
    points: Sequence[Measurement], frontier: Sequence[Measurement], slo_p99_milliseconds: float
) -> str:
    header = (
        "| queue delay µs | max batch | slots | req/s | rows/s | p50 ms | p99 ms "
        "| mean batch | failed | |"
    )
    lines = [header, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for p in points:
        notes = []
        if p in frontier:
            notes.append("frontier")
        if meets_slo(p, slo_p99_milliseconds):
            notes.append("meets SLO")
        if p.failure is not None:
            notes.append(p.failure)
        s = p.setting
        lines.append(
            f"| {s.max_queue_delay_microseconds} | {s.max_batch_size} | {s.execution_slots} "
            f"| {_cell(p.requests_per_second, 0)} | {_cell(p.rows_per_second, 0)} "
            f"| {_cell(p.p50_milliseconds, 2)} | {_cell(p.p99_milliseconds, 2)} "
            f"| {_cell(p.mean_batch_rows, 1)} | {p.errors} | {', '.join(notes)} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Economics:
    """What the chosen point gives per unit of hardware."""

    requests_per_cpu_second: float | None
    requests_per_gpu_second: float | None
    cost: WindowCost | None = None
    """Its window's cost at the node's price (None: no price given)."""

    @property
    def cost_per_thousand_inferences(self) -> float | None:
        return _number(self.cost.per_thousand_inferences) if self.cost else None


def economics(point: Measurement, context: Context) -> Economics:
    """Requests per second of the server's CPU; per GPU-second (one GPU per server, so
    its throughput) for a GPU engine; the cost of 1,000 inferences at the node's price,
    by the operator's formula (`frontier.window_cost_of`)."""
    cost = (
        window_cost_of(point, context.node_cost_per_hour)
        if context.node_cost_per_hour is not None
        else None
    )
    return Economics(
        point.requests_per_cpu_second,
        point.requests_per_second if context.gpu_engine else None,
        cost,
    )


def cost_line(money: Economics, context: Context) -> str | None:
    """The report's line of the cost of 1,000 inferences, with what it is computed from."""
    figure, price = money.cost, context.node_cost_per_hour
    if figure is None or price is None:
        return None
    inputs = (
        f"the node at {price:g} per node-hour for {figure.pod_hours * 3600:.1f} s "
        f"(serving only this) over the {figure.inferences:.0f} inferences (requests answered) "
        "of the window"
    )
    if money.cost_per_thousand_inferences is None:
        return f"1,000 inferences: no figure, none answered ({inputs})"
    return f"1,000 inferences cost {money.cost_per_thousand_inferences:.6f}: {inputs}"


def text_report(
    points: Sequence[Measurement],
    frontier: Sequence[Measurement],
    choice: Choice,
    context: Context,
) -> str:
    slo = context.slo_p99_milliseconds
    out = [
        f"Engine {context.engine}; {context.traffic}; {context.window}.",
        "",
        points_table(points, frontier, slo),
        "",
        "The throughput/p99 frontier (no other point has more throughput at a lower p99):",
    ]
    out += [
        f"  {p.requests_per_second:.0f} req/s at p99 {p.p99_milliseconds:.2f} ms: "
        f"{p.setting.describe()}"
        for p in frontier
    ] or ["  (empty: no point answered every request)"]
    out.append("")
    point = choice.point
    if point is None:
        out.append(f"No setting can be recommended: {choice.reason}.")
        return "\n".join(out) + "\n"
    if choice.meets_slo:
        out.append(
            f"Meets p99 <= {slo:g} ms at the highest throughput, {point.requests_per_second:.0f} "
            f"req/s ({point.rows_per_second:.0f} rows/s), p99 {point.p99_milliseconds:.2f} ms:"
        )
    else:
        out.append(f"NO SETTING MEETS THE SLO: {choice.reason}. The closest point:")
    out += ["", batching_block(point.setting, context.max_queue_size), ADAPTIVE_NOTE, ""]
    money = economics(point, context)
    if money.requests_per_cpu_second is not None:
        out.append(f"At this point: {money.requests_per_cpu_second:.0f} requests per CPU-second")
    if money.requests_per_gpu_second is not None:
        out.append(f"At this point: {money.requests_per_gpu_second:.0f} requests per GPU-second")
    line = cost_line(money, context)
    if line is not None:
        out.append(line)
    return "\n".join(out) + "\n"


def point_json(point: Measurement, frontier: Sequence[Measurement], slo: float) -> dict[str, Any]:
    s = point.setting
    return {
        "maxQueueDelayMicroseconds": s.max_queue_delay_microseconds,
        "maxBatchSize": s.max_batch_size,
        "executionSlots": s.execution_slots,
        "windowSeconds": point.window_seconds,
        "failed": point.errors,
        "requestsPerSecond": _number(point.requests_per_second),
        "rowsPerSecond": _number(point.rows_per_second),
        "p50Milliseconds": _number(point.p50_milliseconds),
        "p99Milliseconds": _number(point.p99_milliseconds),
        "meanBatchRows": _number(point.mean_batch_rows),
        "requestsPerCpuSecond": _number(point.requests_per_cpu_second),
        "loadCpuSeconds": _number(point.load_cpu_seconds),
        "meetsSlo": meets_slo(point, slo),
        "onFrontier": point in frontier,
        "failure": point.failure,
        "errorSample": point.error_sample,
    }


def json_report(
    points: Sequence[Measurement],
    frontier: Sequence[Measurement],
    choice: Choice,
    context: Context,
) -> dict[str, Any]:
    slo = context.slo_p99_milliseconds
    chosen: dict[str, Any] | None = None
    if choice.point is not None:
        money = economics(choice.point, context)
        policy = choice.point.setting.batching_policy()
        if context.max_queue_size is not None:
            policy = policy.model_copy(update={"max_queue_size": context.max_queue_size})
        chosen = {
            **point_json(choice.point, frontier, slo),
            "batching": policy.model_dump(mode="json", by_alias=True),
            "requestsPerGpuSecond": _number(money.requests_per_gpu_second),
            "costPerThousandInferences": money.cost_per_thousand_inferences,
        }
    return {
        "sloP99Milliseconds": slo,
        "engine": context.engine,
        "traffic": context.traffic,
        "window": context.window,
        "nodeCostPerHour": context.node_cost_per_hour,
        "points": [point_json(p, frontier, slo) for p in points],
        "frontier": [point_json(p, frontier, slo) for p in frontier],
        "meetsSlo": choice.meets_slo,
        "reason": choice.reason,
        "choice": chosen,
    }
