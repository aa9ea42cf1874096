"""Renders the chart's Grafana dashboard, panel by panel, to a PNG with matplotlib, from a
real Prometheus scraping real `kubeinfer serve` processes under a changing load (the
world of `tests/monitoring/monitoring_world.py`): the picture in docs/monitoring.md.

    .venv/bin/python tests/benchmarks/render_dashboard.py [--seconds 120] [--out PNG]

(`--out` defaults to docs/images/dashboard.png.)

The panels' queries are read from the shipped dashboard JSON
(`helm/kubeinfer/files/monitoring/grafana-dashboard.json`), its variables set to every
value and `$__rate_interval` to 10 s, and asked of Prometheus over the run. The load
goes in phases: the client concurrency steps up and down, and from the middle of the run
tenant `acme`'s inputs drift out of the int8 engine's calibrated range, so the quality
watch's agreement for that slice and its classes falls. No control plane runs: the
replicas panel is the operator's exporter serving statuses this script writes (desired
following the load's phase, ready one phase behind), and says so in its title. GPU
memory is empty on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [
    str(ROOT / "tests"),
    str(ROOT / "tests" / "monitoring"),
    str(ROOT / "tests" / "support"),
]

from kubeinfer.cli.monitoring.render import DASHBOARD  # noqa: E402
from kubeinfer.operator.api.v1alpha1.conditions import (  # noqa: E402
    ConditionStatus,
    ConditionType,
    Reason,
    set_condition,
)
from kubeinfer.operator.api.v1alpha1.status import InferenceDeploymentStatus  # noqa: E402
from kubeinfer.operator.telemetry.exporter import Report  # noqa: E402
from monitoring_world import World, running_world  # noqa: E402

RATE_INTERVAL = "10s"
PHASES = ((1, 0.0), (4, 0.0), (8, 0.0), (4, 1 / 3), (8, 1 / 3), (2, 1 / 3))
"""(client concurrency, share of requests from `acme` that drifted) per phase."""
SLO_MILLISECONDS = 10.0


def replicas_status(desired: int, ready: int) -> InferenceDeploymentStatus:
    now = datetime.now(UTC)
    conditions = set_condition(
        [], ConditionType.READY, ConditionStatus.TRUE, Reason.READY, "", 1, now
    )
    return InferenceDeploymentStatus(conditions=conditions, replicas=desired, ready_replicas=ready)


def run_load(world: World, seconds: float) -> tuple[float, float]:
    """The phased load; returns (start, end) in Unix seconds."""
    world.wait_for_scrape_after(time.time())
    start = time.time()
    per_phase = seconds / len(PHASES)
    ready = 1
    for index, (concurrency, shifted) in enumerate(PHASES):
        desired = max(1, concurrency // 2)
        world.board.record(("ns-a", "tiny"), Report(replicas_status(desired, ready)))
        until = time.monotonic() + per_phase
        seed = index * 1000
        while time.monotonic() < until:
            world.load(
                requests=concurrency * 8,
                concurrency=concurrency,
                seed=seed,
                shifted_share=shifted,
                orphan_every=20,
            )
            seed += 1
        ready = desired
    end = time.time()
    world.wait_for_scrape_after(end)
    return start, end


def substituted(expr: str) -> str:
    for variable, value in {
        "$namespace": ".*",
        "$model": ".*",
        "$__rate_interval": RATE_INTERVAL,
    }.items():
        expr = expr.replace(variable, value)
    return expr


def legend(template: str, metric: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), template)


UNITS = {
    "s": ("ms", 1000.0),
    "percentunit": ("%", 100.0),
    "reqps": ("req/s", 1.0),
    "short": ("", 1.0),
}


def draw(world: World, start: float, end: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    board = json.loads((ROOT / DASHBOARD).read_text())
    panels = [p for p in board["panels"] if p["type"] != "row"]
    rows = (len(panels) + 1) // 2
    figure, axes = plt.subplots(rows, 2, figsize=(16, 3.4 * rows), squeeze=False)
    step = 1.0
    for ax, panel in zip(axes.flat, panels, strict=False):
        unit, scale = UNITS.get(panel["fieldConfig"]["defaults"].get("unit", "short"), ("", 1.0))
        title = panel["title"]
        if "replicas" in title.lower():
            title += " (statuses written by the script)"
        ax.set_title(title, fontsize=10, loc="left")
        plotted = False
        for target in panel["targets"]:
            result = world.query_range(substituted(target["expr"]), start, end, step)
            if panel["type"] == "heatmap":
                plotted |= heatmap(ax, result, start, np)
                continue
            for item in result:
                times = np.array([float(t) for t, _ in item["values"]]) - start
                values = np.array([float(v) for _, v in item["values"]]) * scale
                ax.plot(
                    times,
                    values,
                    linewidth=1.2,
                    label=legend(target["legendFormat"], item["metric"]),
                )
                plotted = True
        if not plotted:
            ax.text(
                0.5,
                0.5,
                "no data (no GPU on this machine)" if "GPU" in title else "no data",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
        elif panel["type"] != "heatmap":
            ax.legend(fontsize=7, loc="upper left", ncol=2)
        ax.set_xlim(0, end - start)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run", fontsize=8)
    figure.suptitle(
        "kubeinfer dashboard (helm/kubeinfer/files/monitoring/grafana-dashboard.json), rendered "
        "from a real Prometheus scraping real kubeinfer serve processes",
        fontsize=11,
    )
    figure.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)


def heatmap(ax, result: list[dict], start: float, np) -> bool:
    """Batches per second by bucket, from the cumulative `le` series."""
    by_bound = {}
    for item in result:
        bound = float(item["metric"]["le"])
        by_bound[bound] = {float(t): float(v) for t, v in item["values"]}
    if not by_bound:
        return False
    bounds = sorted(by_bound)
    times = sorted(set().union(*(set(v) for v in by_bound.values())))
    cumulative = np.array([[by_bound[b].get(t, 0.0) for t in times] for b in bounds])
    per_bucket = np.diff(np.vstack([np.zeros(len(times)), cumulative]), axis=0).clip(min=0)
    finite = [b for b in bounds if np.isfinite(b)]
    labels = [f"≤{b:g}" for b in finite] + ["+Inf"][: len(bounds) - len(finite)]
    x = np.array(times) - start
    ax.imshow(
        per_bucket,
        aspect="auto",
        origin="lower",
        cmap="viridis",
        extent=(x[0], x[-1], -0.5, len(bounds) - 0.5),
        interpolation="nearest",
    )
    ax.set_yticks(range(len(bounds)), labels, fontsize=6)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        with running_world(Path(directory), SLO_MILLISECONDS) as world:
            start, end = run_load(world, args.seconds)
            draw(world, start, end, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
