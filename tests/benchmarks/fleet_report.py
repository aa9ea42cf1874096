"""`bench_fleet.py --json`'s results as the tables, per-object fits and plot of
docs/fleet.md:

    .venv/bin/python tests/benchmarks/fleet_report.py results.json [--plot docs/fleet.png]

The fits are least squares over the sizes measured (cost = fixed + per object x N), by
numpy; the plot (matplotlib) is the operator's CPU seconds to all Ready, peak memory and
seconds to all Ready against N.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np


def row(result: dict[str, Any]) -> list[str]:
    ready, steady = result["to_ready"], result["steady"]
    requests = ready["operator_requests"]
    p50, p99 = ready["pass_p50_seconds"], ready["pass_p99_seconds"]
    return [
        str(result["n"]),
        f"{result['seconds_to_all_ready']:.0f}",
        f"{ready['cpu_seconds']:.1f}",
        f"{result['peak_rss_mib']:.0f}",
        f"{ready['passes'].get('ok', 0):.0f}",
        f"{p50:.2f} / {p99:.1f}" if p50 is not None and p99 is not None else "-",
        " ".join(f"{verb} {count:.0f}" for verb, count in sorted(requests.items())),
        f"{ready['watch_events']:.0f}",
        f"{ready['apiserver_requests'].get('LIST', 0)}",
        f"{steady['operator_writes']} ({steady['seconds']:.0f} s)",
        f"{ready['load_average_1m']:.1f}",
    ]


HEADER = [
    "N", "s to all Ready", "CPU s to Ready", "peak RSS MiB", "passes", "pass p50 / p99 s",
    "operator requests to Ready", "watch events", "LISTs (all clients)",
    "operator writes, steady", "load avg",
]  # fmt: skip


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def fit(ns: list[int], values: list[float]) -> tuple[float, float]:
    """(per object, fixed) of the least-squares line through (N, value)."""
    slope, intercept = np.polyfit(np.array(ns, float), np.array(values, float), 1)
    return float(slope), float(intercept)


def report(results: list[dict[str, Any]]) -> str:
    ns = [r["n"] for r in results]
    parts = [table(HEADER, [row(r) for r in results])]
    if len(results) >= 2:
        cpu = fit(ns, [r["to_ready"]["cpu_seconds"] for r in results])
        memory = fit(ns, [r["peak_rss_mib"] for r in results])
        parts.append(
            f"Per object (least squares over N = {', '.join(map(str, ns))}): "
            f"{cpu[0] * 1000:.0f} ms of operator CPU to Ready (+ {cpu[1]:.1f} s fixed), "
            f"{memory[0] * 1024:.0f} KiB of peak memory (+ {memory[1]:.0f} MiB fixed)."
        )
    later = []
    for r in results:
        churn, scale = r.get("churn", {}), r.get("autoscale", {})
        later.append([
            str(r["n"]),
            f"{churn.get('changes', '-')} in {churn.get('seconds', 0):.0f} s: "
            f"{churn.get('cpu_seconds', 0):.1f} CPU s, {churn.get('passes', {}).get('ok', 0):.0f} "
            "passes",
            f"{scale.get('grouped_queries_per_poll', '-')} grouped, "
            f"{scale.get('per_object_queries_per_poll', '-')} per-object",
            f"{scale.get('cpu_seconds', '-')}",
            str(r.get("failover", {}).get("seconds_to_first_reconcile", "-")),
            str(r.get("failover", {}).get("seconds_to_changed_object_reconciled", "-")),
            f"{r.get('namespace_delete_seconds', '-')}",
        ])  # fmt: skip
    parts.append(table(
        ["N", "churn 10 %/min", "metrics queries per autoscale poll", "autoscale CPU s",
         "failover: s to first pass", "s to changed object", "namespace delete s"], later,
    ))  # fmt: skip
    return "\n\n".join(parts) + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in results]
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    series = (
        ("operator CPU seconds to all Ready", [r["to_ready"]["cpu_seconds"] for r in results]),
        ("operator peak memory (MiB)", [r["peak_rss_mib"] for r in results]),
        ("seconds to all Ready", [r["seconds_to_all_ready"] for r in results]),
    )
    for axis, (title, values) in zip(axes, series, strict=True):
        axis.plot(ns, values, "o-")
        axis.set_xscale("log")
        axis.set_xlabel("InferenceDeployments (N)")
        axis.set_title(title, fontsize=10)
        axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    print(report(results))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
