"""The autoscaler's trace replay as a table: a recorded burst (idle, 8x the load for 5
minutes, idle) replayed through `recommend` against simulated pods that take 30, 60 or
120 s to become ready, with and without startup awareness (countStartingPods).

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/autoscaling_trace_replay.py [--json]
        [--max-queue 64] [--burst-factor 8] [--max-replicas 32] [--pass-offset 7]

The model (tests/support/scaling_simulation.py, which
tests/operator/scaling/test_scaling_trace_replay.py checks): open-loop arrivals of 16
requests/s (one pod at its target queue depth of 8), 128/s during the burst; each ready
pod serves 20 requests/s at 0.5 s each, and queues at
most --max-queue more (beyond, requests are refused, as the runtime's bounded admission
does); the autoscaler reads queued plus in-flight requests over the ready pods, every 15 s
(the operator's resync), with the HPA's default policies. Columns: pods needed (the count
at target during the burst); time from the burst's start until that many are ready;
the most pods ever set, and that over needed (overshoot); direction changes of the count;
time from the burst's end back to minReplicas; the share of the burst's requests refused;
pod-minutes spent over the 25 minutes replayed.

Without arguments it prints the main table (queues of 64 per pod, ~3 s of a pod's work),
then two cases where awareness cannot help: the runtime's default 1024-deep queues (the
first reading of the burst is mostly backlog and already calls for maxReplicas) and a 16x
burst (more than a reading of saturated pods can tell).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from scaling_simulation import STARTUPS, Outcome, burst_setup, replay


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f} s"


def row(startup: float, aware: bool, outcome: Outcome) -> dict[str, object]:
    return {
        "startup_seconds": startup,
        "startup_awareness": aware,
        "needed": outcome.needed,
        "time_to_capacity_seconds": outcome.time_to_capacity_seconds,
        "peak_replicas": outcome.peak_replicas,
        "overshoot": round(outcome.overshoot, 3),
        "direction_changes": outcome.direction_changes,
        "back_to_min_seconds": outcome.back_to_min_seconds,
        "refused_share": round(outcome.refused_share, 4),
        "pod_minutes": round(outcome.pod_minutes, 1),
    }


def table(title: str, rows: list[dict[str, object]]) -> str:
    header = (
        f"{'startup':>8} {'awareness':>9} {'needed':>6} {'to capacity':>11} {'peak':>4} "
        f"{'overshoot':>9} {'dir. changes':>12} {'back to min':>11} {'refused':>7} "
        f"{'pod-min':>7}"
    )
    lines = [title, header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['startup_seconds']:>6.0f} s {'on' if r['startup_awareness'] else 'off':>9} "
            f"{r['needed']:>6} {_seconds(r['time_to_capacity_seconds']):>11} "  # type: ignore[arg-type]
            f"{r['peak_replicas']:>4} {r['overshoot']:>9.2f} {r['direction_changes']:>12} "
            f"{_seconds(r['back_to_min_seconds']):>11} "  # type: ignore[arg-type]
            f"{100 * r['refused_share']:>6.1f}% {r['pod_minutes']:>7.0f}"  # type: ignore[operator]
        )
    return "\n".join(lines)


def run(**variant: float) -> list[dict[str, object]]:
    return [
        row(startup, aware, replay(burst_setup(startup, aware, **variant)))  # type: ignore[arg-type]
        for startup in STARTUPS
        for aware in (False, True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--max-queue", type=int, help="requests queued per pod at most")
    parser.add_argument("--burst-factor", type=float, help="the burst's load over idle")
    parser.add_argument("--max-replicas", type=int, help="the autoscaler's maxReplicas")
    parser.add_argument("--pass-offset", type=float, help="seconds from a 15 s mark to a pass")
    args = parser.parse_args()
    chosen = {
        key: value
        for key, value in (
            ("max_queue_per_pod", args.max_queue),
            ("burst_factor", args.burst_factor),
            ("max_replicas", args.max_replicas),
            ("pass_offset_seconds", args.pass_offset),
        )
        if value is not None
    }
    if chosen:
        cases = {"Trace replay (" + ", ".join(f"{k}={v}" for k, v in chosen.items()) + ")": chosen}
    else:
        cases = {
            "Trace replay: 8x burst for 5 min, queues of 64 per pod, maxReplicas 32": {},
            "Deep queues (the runtime's default maxQueueSize 1024)": {"max_queue_per_pod": 1024},
            "A 16x burst (queues of 64 per pod)": {"burst_factor": 16.0},
        }
    results = {title: run(**variant) for title, variant in cases.items()}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print("\n\n".join(table(title, rows) for title, rows in results.items()))


if __name__ == "__main__":
    main()
