"""The quality verdict on simulated traffic: how often it alarms on traffic that has not
drifted, and how long it takes to name a class that has.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/quality_verdict_simulation.py [--windows 2000]
        [--seeds 100] [--seed 0]

The traffic: 10 reference classes with uneven shares and per-class build baselines
(two of them below minClassAgreement, as quantisation can leave a class), and 4 slices
drawn independently of the class. Requests arrive as a Poisson process; samplePercent
5 of them are compared; each compared request agrees with the reference with its class's
probability. The verdict runs with minSamples 100, minTop1Agreement 0.94,
minClassAgreement 0.93 (0.95 where a row says so) and a false-alarm budget of 0.01; the
mean absolute difference is not simulated (its check is a point estimate).

(a) False alarms: independent windows of windowSeconds 600, every class at its true
baseline, judged with no previous verdict; the share of windows that alarm is the share
of evaluations that would (a sliding window's evaluations have the same distribution,
only correlated). Rows: the settings above; every group exactly on its threshold (the
floors raised to 1, so each group's threshold is its baseline: the worst case for the
budget), corrected and uncorrected (each test at the whole budget); the same with
baselines measured on a calibration set of 2000 rows, with and without their row counts.

(b) Time to detect: one class (10 % of traffic, baseline 0.97) falls at t = 0 to a lower
agreement; a full window of healthy traffic precedes it; the verdict is evaluated every
15 s on the last windowSeconds, each evaluation given the previous verdict; the time is
from the fall to the first evaluation that names the class (capped at three windows).

(c) Why the exact test and not Wilson's bound: for one group truly at its threshold, the
probability that its upper bound falls below it (a false alarm of that one test), summed
exactly over every outcome, against the per-test level it was asked for.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass, replace

import numpy as np
from kubeinfer.operator.api.v1alpha1.enums import QualityGroupKind as GroupKind
from kubeinfer.operator.api.v1alpha1.enums import QualityState
from kubeinfer.operator.quality.bounds import exact_bounds, one_sided_z
from kubeinfer.operator.quality.verdict import (
    BaselineAgreement,
    QualityBaseline,
    QualityThresholds,
    QualityVerdict,
    judge_quality,
)
from kubeinfer.operator.state.quality_readings import (
    AgreementTally,
    QualityGroup,
    WindowTallies,
)

CLASS_SHARES = np.array([0.20, 0.15, 0.12, 0.10, 0.10, 0.09, 0.08, 0.06, 0.06, 0.04])
CLASS_BASELINES = np.array([0.99, 0.98, 0.97, 0.97, 0.97, 0.96, 0.95, 0.94, 0.92, 0.90])
CLASSES = [f"class-{i}" for i in range(len(CLASS_SHARES))]
SLICE_SHARES = np.array([0.50, 0.25, 0.15, 0.10])
SLICES = ["tenant-a", "tenant-b", "tenant-c", "other"]
DRIFTING_CLASS = 3  # 10 % of traffic, baseline 0.97
SAMPLE_PERCENT = 5.0
EVALUATION_SECONDS = 15
THRESHOLDS = QualityThresholds(
    min_samples=100,
    min_top1_agreement=0.94,
    min_class_agreement=0.93,
    max_mean_absolute_difference=1.0,
    false_alarm_budget=0.01,
)
ON_THRESHOLD = replace(THRESHOLDS, min_top1_agreement=1.0, min_class_agreement=1.0)
CALIBRATION_ROWS = 2000


def exact_baseline() -> QualityBaseline:
    overall = float(CLASS_SHARES @ CLASS_BASELINES)
    return QualityBaseline(
        BaselineAgreement(overall),
        {
            name: BaselineAgreement(float(b))
            for name, b in zip(CLASSES, CLASS_BASELINES, strict=True)
        },
    )


def measured_baseline(rng: np.random.Generator, with_rows: bool) -> QualityBaseline:
    """The build's report on CALIBRATION_ROWS in-distribution rows: a noisy estimate."""
    rows = rng.multinomial(CALIBRATION_ROWS, CLASS_SHARES)
    agreements = rng.binomial(rows, CLASS_BASELINES)

    def figure(k: int, n: int) -> BaselineAgreement:
        return BaselineAgreement(k / n, n if with_rows else None)

    return QualityBaseline(
        figure(int(agreements.sum()), CALIBRATION_ROWS),
        {
            name: figure(int(k), int(n))
            for name, k, n in zip(CLASSES, agreements, rows, strict=True)
            if n > 0
        },
    )


def draw_cells(
    rng: np.random.Generator, compared: int, class_agreements: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Compared requests and their agreements per (class, slice) cell."""
    cells = rng.multinomial(compared, np.outer(CLASS_SHARES, SLICE_SHARES).ravel())
    cells = cells.reshape(len(CLASS_SHARES), len(SLICE_SHARES))
    return cells, rng.binomial(cells, class_agreements[:, None])


def tallies_of(cells: np.ndarray, agreements: np.ndarray) -> WindowTallies:
    def tally(n: np.integer | int, k: np.integer | int) -> AgreementTally:
        return AgreementTally(int(n), int(k))

    by_class = {
        name: tally(n, k)
        for name, n, k in zip(CLASSES, cells.sum(1), agreements.sum(1), strict=True)
        if n > 0
    }
    by_slice = {
        name: tally(n, k)
        for name, n, k in zip(SLICES, cells.sum(0), agreements.sum(0), strict=True)
        if n > 0
    }
    return WindowTallies(tally(cells.sum(), agreements.sum()), by_class, by_slice)


def alarms(verdict: QualityVerdict) -> bool:
    return verdict.state == QualityState.DRIFTING


@dataclass
class FalseAlarmRow:
    setting: str
    rate: int
    compared_per_window: float
    alarms: int
    windows: int
    mean_tests: float


def false_alarm_rows(windows: int, seed: int) -> list[FalseAlarmRow]:
    rows = []
    for rate in (50, 200):
        compared_mean = rate * 600 * SAMPLE_PERCENT / 100
        settings = {
            "floors 0.94 / 0.93, exact baselines": 0,
            "every group on its threshold, exact baselines": 0,
            "every group on its threshold, uncorrected": 0,
            "on its threshold, baselines from 2000 rows (counts given)": 0,
            "on its threshold, baselines from 2000 rows (taken as exact)": 0,
        }
        names = list(settings)
        tests = 0
        rng = np.random.default_rng([seed, rate])
        exact = exact_baseline()
        for _ in range(windows):
            compared = int(rng.poisson(compared_mean))
            tallies = tallies_of(*draw_cells(rng, compared, CLASS_BASELINES))
            settings[names[0]] += alarms(judge_quality(THRESHOLDS, exact, tallies))
            worst = judge_quality(ON_THRESHOLD, exact, tallies)
            settings[names[1]] += alarms(worst)
            tests += worst.tests
            uncorrected = replace(ON_THRESHOLD, false_alarm_budget=0.01 * max(1, worst.tests))
            settings[names[2]] += alarms(judge_quality(uncorrected, exact, tallies))
            for name, with_rows in ((names[3], True), (names[4], False)):
                baseline = measured_baseline(rng, with_rows)
                settings[name] += alarms(judge_quality(ON_THRESHOLD, baseline, tallies))
        rows += [
            FalseAlarmRow(name, rate, compared_mean, count, windows, tests / windows)
            for name, count in settings.items()
        ]
    return rows


@dataclass
class DetectionRow:
    rate: int
    dropped_to: float
    min_class_agreement: float
    window_seconds: int
    detection_seconds: list[float]
    cap_seconds: int


def time_to_detect(
    rate: int,
    dropped_to: float,
    thresholds: QualityThresholds,
    window_seconds: int,
    seed: int,
    cap_seconds: int,
) -> float | None:
    """Seconds from the class's fall to the first verdict naming it; None past the cap."""
    rng = np.random.default_rng(seed)
    baseline = exact_baseline()
    buckets = window_seconds // EVALUATION_SECONDS
    compared_mean = rate * EVALUATION_SECONDS * SAMPLE_PERCENT / 100
    shape = (buckets, len(CLASS_SHARES), len(SLICE_SHARES))
    cells, agreements = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    for bucket in range(buckets):  # a full window of healthy traffic before the fall
        cells[bucket], agreements[bucket] = draw_cells(
            rng, int(rng.poisson(compared_mean)), CLASS_BASELINES
        )
    dropped = CLASS_BASELINES.copy()
    dropped[DRIFTING_CLASS] = dropped_to
    target = QualityGroup(GroupKind.CLASS, CLASSES[DRIFTING_CLASS])
    previous = judge_quality(thresholds, baseline, tallies_of(cells.sum(0), agreements.sum(0)))
    for step in range(1, cap_seconds // EVALUATION_SECONDS + 1):
        slot = step % buckets
        cells[slot], agreements[slot] = draw_cells(rng, int(rng.poisson(compared_mean)), dropped)
        tallies = tallies_of(cells.sum(0), agreements.sum(0))
        previous = judge_quality(thresholds, baseline, tallies, previous.memory)
        if any(judgement.group == target for judgement in previous.drifting):
            return float(step * EVALUATION_SECONDS)
    return None


def detection_rows(seeds: int, seed: int) -> list[DetectionRow]:
    cases = [
        (50, 0.80, 0.93, 600),
        (200, 0.80, 0.93, 600),
        (200, 0.80, 0.93, 300),
        (50, 0.90, 0.93, 600),
        (200, 0.90, 0.93, 600),
        (200, 0.90, 0.95, 600),
        (50, 0.90, 0.95, 1800),
    ]
    rows = []
    for rate, dropped_to, min_class, window_seconds in cases:
        thresholds = replace(THRESHOLDS, min_class_agreement=min_class)
        cap = 3 * window_seconds
        times = [
            time_to_detect(rate, dropped_to, thresholds, window_seconds, seed * 100_000 + s, cap)
            for s in range(seeds)
        ]
        found = [t for t in times if t is not None]
        rows.append(
            DetectionRow(
                rate,
                dropped_to,
                min_class,
                window_seconds,
                found + [float("inf")] * (len(times) - len(found)),
                cap,
            )
        )
    return rows


def wilson_upper(successes: int, trials: int, z: float) -> float:
    p, z2 = successes / trials, z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    return centre + z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials**2)) / (1 + z2 / trials)


def bound_false_alarm(trials: int, truth: float, level: float, exact: bool) -> float:
    """P(upper bound < truth) for Binomial(trials, truth), summed over every outcome."""
    z = one_sided_z(level)
    total = 0.0
    for k in range(trials + 1):
        upper = exact_bounds(k, trials, level).upper if exact else wilson_upper(k, trials, z)
        if upper < truth:
            total += math.exp(
                math.lgamma(trials + 1)
                - math.lgamma(k + 1)
                - math.lgamma(trials - k + 1)
                + k * math.log(truth)
                + (trials - k) * math.log1p(-truth)
            )
    return total


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def seconds(value: float, cap: int) -> str:
    return f"> {cap}" if value == float("inf") else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=2000, help="windows per false-alarm row")
    parser.add_argument("--seeds", type=int, default=100, help="runs per detection row")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    started = time.monotonic()

    print("(a) False alarms on in-distribution traffic, windowSeconds 600, samplePercent 5\n")
    print("| setting | req/s | compared per window | tests per evaluation | alarms | rate |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in false_alarm_rows(arguments.windows, arguments.seed):
        print(
            f"| {row.setting} | {row.rate} | {row.compared_per_window:.0f} | "
            f"{row.mean_tests:.1f} | {row.alarms} of {row.windows} | "
            f"{row.alarms / row.windows:.4f} |"
        )

    print(
        "\n(b) Time to name a class (10 % of traffic, baseline 0.97) that falls at t = 0; "
        f"samplePercent 5, evaluated every {EVALUATION_SECONDS} s, "
        f"{arguments.seeds} runs each\n"
    )
    print(
        "| req/s | falls to | minClassAgreement | windowSeconds | class samples per window "
        "| median s | p95 s | named within the cap |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in detection_rows(arguments.seeds, arguments.seed):
        class_samples = (
            row.rate * row.window_seconds * SAMPLE_PERCENT / 100 * CLASS_SHARES[DRIFTING_CLASS]
        )
        named = sum(1 for t in row.detection_seconds if t != float("inf"))
        print(
            f"| {row.rate} | {row.dropped_to:.2f} | {row.min_class_agreement:.2f} | "
            f"{row.window_seconds} | {class_samples:.0f} | "
            f"{seconds(statistics.median_low(row.detection_seconds), row.cap_seconds)} | "
            f"{seconds(percentile(row.detection_seconds, 0.95), row.cap_seconds)} | "
            f"{named} of {len(row.detection_seconds)} (cap {row.cap_seconds} s) |"
        )
    print(
        "\n(c) One test's false-alarm probability over its level (1 = exactly the level; "
        "above 1: more alarms than asked for)\n"
    )
    print("| samples | true agreement | per-test level | Wilson | exact (Clopper-Pearson) |")
    print("|---:|---:|---:|---:|---:|")
    for trials in (100, 500, 2000):
        for truth in (0.95, 0.99):
            for level in (0.01, 0.01 / 15):
                wilson = bound_false_alarm(trials, truth, level, exact=False) / level
                exact = bound_false_alarm(trials, truth, level, exact=True) / level
                print(f"| {trials} | {truth} | {level:.5f} | {wilson:.2f} | {exact:.2f} |")
    print(f"\n{time.monotonic() - started:.0f} s of simulation")


if __name__ == "__main__":
    main()
