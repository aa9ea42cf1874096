"""Triton's perf_analyzer, the load generator of `kubeinfer tune` and the benchmarks: the
command line of a load (pure), one run, and its CSV report read with the csv module.

A run offers the load, then measures it over three windows of `window_seconds` (its
stability check made loose, so the three come in turn on a busy machine too) and reports
their throughput and client-side latency percentiles; a warm-up run of the same load may
go first. It stops at the first request not answered 200, so a run either answered every
request or failed (`PerfAnalyzerFailed`, with perf_analyzer's words for the answer).

Loads: closed loop (`concurrency` requests in flight, each sent when the last returned),
open loop (`request_rate` with Poisson or constant gaps, or `intervals_file`: a schedule's
gaps in microseconds, replayed in a loop), sent asynchronously so that a slow server does
not hold the arrivals back (a latency counts from the send, which is on time unless
perf_analyzer itself falls behind: it warns of that on stderr). Every request carries
`rows` rows of the input data (one row per entry of `input_data`, used in turn). Wire
forms: HTTP with binary tensors or JSON, and gRPC. What it cannot send (requests of
several sizes in one run) is `kubeinfer.cli.tune.load`'s.
"""

from __future__ import annotations

import csv
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INSTALL = (
    "install Triton's perf_analyzer: `pip install perf-analyzer` (glibc 2.38 or newer), or "
    "on Debian 12 `make .venv/bin/perf_analyzer` in a kubeinfer checkout (it takes the "
    "same program from tritonclient 2.51.0's wheel)"
)
STABILITY_PERCENT = 1_000_000
"""perf_analyzer's stability check, made loose: three windows in turn are the measurement
(its default, 10 %, runs on until three agree, which a shared machine may never give)."""
MAX_WINDOWS = 10
"""Windows perf_analyzer may take (a window in which nothing was answered is not counted)."""


class PerfAnalyzerMissing(RuntimeError):
    """No perf_analyzer to run; the message says how to install it."""


class PerfAnalyzerFailed(RuntimeError):
    """perf_analyzer exited without a report: a request failed, or it could not start."""


def find_perf_analyzer() -> str:
    """perf_analyzer on PATH, else beside this interpreter (where `pip install
    perf-analyzer`, or the Makefile, puts it in a virtual environment)."""
    found = shutil.which("perf_analyzer")
    beside = Path(sys.executable).parent / "perf_analyzer"
    if found is None and os.access(beside, os.X_OK):
        found = str(beside)
    if found is None:
        raise PerfAnalyzerMissing(f"perf_analyzer was not found on PATH: {INSTALL}")
    return found


@dataclass(frozen=True)
class Target:
    """Where the load goes: `host:port` of the transport, the model, the wire form."""

    url: str
    model: str
    protocol: str = "http"
    """http or grpc."""
    tensor_format: str = "binary"
    """binary (Triton's binary tensor extension) or json, over HTTP."""


@dataclass(frozen=True)
class Load:
    """One of `concurrency`, `request_rate` or `intervals_file`, and the rows per request."""

    rows: int = 1
    concurrency: int | None = None
    request_rate: float | None = None
    distribution: str = "poisson"
    """The gaps of `request_rate`: poisson or constant."""
    intervals_file: Path | None = None


@dataclass(frozen=True)
class PerfResult:
    """What perf_analyzer measured over its windows; latencies at the client."""

    requests_per_second: float
    rows_per_second: float
    p50_milliseconds: float
    p90_milliseconds: float
    p95_milliseconds: float
    p99_milliseconds: float
    mean_milliseconds: float
    window_seconds: float
    """The span measured: three windows."""
    client_cpu_seconds: float
    """perf_analyzer's own CPU over its whole run (its start and warm-up included)."""


def input_data(rows: Sequence[Mapping[str, np.ndarray]]) -> dict[str, object]:
    """perf_analyzer's `--input-data` JSON: an entry per row, each input's values and
    shape without the batch axis (perf_analyzer stacks `rows` of them per request)."""
    return {
        "data": [
            {
                name: {"content": array.ravel().tolist(), "shape": list(array.shape)}
                for name, array in row.items()
            }
            for row in rows
        ]
    }


def command(
    binary: str,
    target: Target,
    load: Load,
    window_seconds: float,
    data: Path | str,
    report: Path,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> list[str]:
    """The command line of one run (its CSV report written to `report`); `data` is an
    `--input-data` JSON file, or `random` (perf_analyzer's own random values, each
    variable axis sized by `shapes`: input name -> item shape)."""
    line = [
        binary, "-m", target.model, "-u", target.url, "-i", target.protocol,
        "-b", str(load.rows), "--input-data", str(data),
        "--measurement-interval", str(max(1, round(window_seconds * 1000))),
        "--stability-percentage", str(STABILITY_PERCENT), "--max-trials", str(MAX_WINDOWS),
        "-f", str(report), "--verbose-csv",
    ]  # fmt: skip
    for name, shape in (shapes or {}).items():
        line += ["--shape", f"{name}:{','.join(map(str, shape))}"]
    if target.protocol == "http":
        line += ["--input-tensor-format", target.tensor_format]
        line += ["--output-tensor-format", target.tensor_format]
    if load.concurrency is not None:
        # An explicit end: a thread per client, however many (the default caps them at 16).
        line += ["--concurrency-range", f"{load.concurrency}:{load.concurrency}:1"]
    elif load.request_rate is not None:
        line += ["--async", "--request-rate-range", f"{load.request_rate:g}"]
        line += ["--request-distribution", load.distribution]
    elif load.intervals_file is not None:
        line += ["--async", "--request-intervals", str(load.intervals_file)]
    else:
        raise ValueError("a load is a concurrency, a request rate or a file of intervals")
    return line


def read_report(text: str, rows: int, window_seconds: float, cpu_seconds: float) -> PerfResult:
    """The run's figures from its `-f` CSV (a header, then a row; latencies in µs,
    throughput in inferences, that is rows, per second)."""
    measured = list(csv.DictReader(text.splitlines()))
    if len(measured) != 1:
        raise PerfAnalyzerFailed(f"perf_analyzer's report has {len(measured)} rows, not 1")
    row = measured[0]

    def ms(column: str) -> float:
        return float(row[column]) / 1000

    rows_per_second = float(row["Inferences/Second"])
    return PerfResult(
        requests_per_second=rows_per_second / rows,
        rows_per_second=rows_per_second,
        p50_milliseconds=ms("p50 latency"),
        p90_milliseconds=ms("p90 latency"),
        p95_milliseconds=ms("p95 latency"),
        p99_milliseconds=ms("p99 latency"),
        mean_milliseconds=ms("Avg latency"),
        window_seconds=3 * window_seconds,
        client_cpu_seconds=cpu_seconds,
    )


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_once(line: list[str], timeout_seconds: float) -> None:
    try:
        done = subprocess.run(line, capture_output=True, text=True, timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        raise PerfAnalyzerFailed(f"perf_analyzer ran past {timeout_seconds:g} s") from None
    if done.returncode != 0:
        said = [s.strip() for s in (done.stderr + done.stdout).splitlines() if s.strip()]
        errors = [s for s in said if "error" in s.lower()] or said[-3:]
        raise PerfAnalyzerFailed(f"perf_analyzer exited {done.returncode}: {errors[0]}")


def run(
    target: Target,
    load: Load,
    samples: Sequence[Mapping[str, np.ndarray]] | None,
    window_seconds: float,
    workdir: Path,
    warmup_seconds: float = 0.0,
    around: Callable[[], object] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> PerfResult:
    """A warm-up run (when `warmup_seconds` > 0, its three windows that long together),
    then the measured run of three `window_seconds` windows; `around` is called just
    before and just after the measured run (a server's snapshots). `samples` None sends
    perf_analyzer's random values instead (tensors too large for JSON; see `command`)."""
    binary = find_perf_analyzer()
    workdir.mkdir(parents=True, exist_ok=True)
    data: Path | str = "random"
    if samples is not None:
        data = workdir / "input-data.json"
        data.write_text(json.dumps(input_data(samples)))
    report = workdir / "report.csv"
    if warmup_seconds > 0:
        warm = warmup_seconds / 3
        _run_once(command(binary, target, load, warm, data, report, shapes), _timeout(warm))
    report.unlink(missing_ok=True)
    measured = command(binary, target, load, window_seconds, data, report, shapes)
    if around is not None:
        around()
    before = _children_cpu_seconds()
    _run_once(measured, _timeout(window_seconds))
    cpu = _children_cpu_seconds() - before
    if around is not None:
        around()
    return read_report(report.read_text(), load.rows, window_seconds, cpu)


def intervals(offsets_seconds: Sequence[float]) -> str:
    """`--request-intervals` of a schedule (offsets from its start, ascending): the gap
    before each request in whole microseconds, a line each (perf_analyzer loops it)."""
    gaps = np.diff(np.asarray([0.0, *offsets_seconds]))
    return "".join(f"{round(gap * 1e6)}\n" for gap in gaps)


def _timeout(window_seconds: float) -> float:
    return window_seconds * (MAX_WINDOWS + 2) + 60
