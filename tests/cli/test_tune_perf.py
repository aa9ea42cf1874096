"""`kubeinfer.cli.tune.perf`: Triton's perf_analyzer as the load generator.

- Pure: the command line of each load and wire form, the input data and intervals files,
  its CSV report read with the csv module (per request and per row, microseconds to
  milliseconds), a report that is not one row refused.
- Against a real `kubeinfer serve` (slow): perf_analyzer drives it in a closed loop over
  HTTP with binary tensors, HTTP with JSON and gRPC, and at a Poisson rate; each run's
  figures exist and agree with themselves and with the server's own count of what it
  answered over the run (never a verdict on speed); a request the server refuses ends the
  run with the server's words.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.cli.tune import perf
from kubeinfer.cli.tune.server import HOST, ServerProcess, ServerSpec, free_port
from kubeinfer.cli.tune.server_side import between, snapshot

HTTP = perf.Target("127.0.0.1:8000", "m")


@pytest.mark.parametrize(
    ("target", "load", "expected"),
    [
        (HTTP, perf.Load(concurrency=8),
         ["-i http -b 1 ", "--input-tensor-format binary --output-tensor-format binary",
          "--concurrency-range 8:8:1"]),
        (perf.Target("h:1", "m", "grpc"), perf.Load(rows=4, concurrency=32),
         ["-i grpc -b 4 ", "--concurrency-range 32:32:1"]),
        (perf.Target("h:1", "m", "http", "json"), perf.Load(request_rate=250.5),
         ["--input-tensor-format json", "--async --request-rate-range 250.5 "
          "--request-distribution poisson"]),
        (HTTP, perf.Load(request_rate=10, distribution="constant"),
         ["--request-distribution constant"]),
        (HTTP, perf.Load(intervals_file=Path("gaps.txt")),
         ["--async --request-intervals gaps.txt"]),
    ],
)  # fmt: skip
def test_each_load_and_wire_form_has_its_command_line(
    target: perf.Target, load: perf.Load, expected: list[str]
) -> None:
    line = perf.command("pa", target, load, 0.5, Path("d.json"), Path("r.csv"))
    assert line[:5] == ["pa", "-m", "m", "-u", target.url]
    joined = " ".join(line) + " "
    for fragment in [*expected, "--measurement-interval 500 ", "-f r.csv --verbose-csv"]:
        assert fragment in joined
    assert "--input-data d.json" in joined
    assert ("tensor-format" in joined) == (target.protocol == "http")


def test_random_values_size_each_variable_axis_by_its_shape() -> None:
    load = perf.Load(rows=2, concurrency=4)
    line = perf.command("pa", HTTP, load, 1.0, "random", Path("r"), {"ids": [128], "x": [3, 4]})
    joined = " ".join(line)
    assert "--input-data random" in joined
    assert "--shape ids:128" in joined and "--shape x:3,4" in joined


def test_a_load_must_say_how_requests_are_sent() -> None:
    with pytest.raises(ValueError, match="a concurrency, a request rate or a file"):
        perf.command("pa", HTTP, perf.Load(), 1.0, Path("d"), Path("r"))


def test_the_input_data_has_a_row_per_entry_without_the_batch_axis() -> None:
    rows = [{"x": np.arange(4, dtype=np.float32).reshape(2, 2), "n": np.array([7])}]
    assert perf.input_data(rows) == {
        "data": [{"x": {"content": [0.0, 1.0, 2.0, 3.0], "shape": [2, 2]},
                  "n": {"content": [7], "shape": [1]}}]
    }  # fmt: skip


def test_a_schedule_becomes_the_gaps_before_each_request_in_microseconds() -> None:
    assert perf.intervals([0.001, 0.001, 0.0025, 1.0]) == "1000\n0\n1500\n997500\n"


REPORT = (
    "Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,"
    "p95 latency,p99 latency,Avg latency,request/response,response wait\n"
    "4,8451.75,29,0,1424,2188,3172,11103,1886,29,1849\n"
)


def test_the_report_is_read_per_request_and_per_row() -> None:
    result = perf.read_report(REPORT, rows=4, window_seconds=0.5, cpu_seconds=1.25)
    assert result.rows_per_second == 8451.75
    assert result.requests_per_second == pytest.approx(8451.75 / 4)
    assert (result.p50_milliseconds, result.p90_milliseconds, result.p95_milliseconds,
            result.p99_milliseconds, result.mean_milliseconds) == pytest.approx(
        (1.424, 2.188, 3.172, 11.103, 1.886))  # fmt: skip
    assert result.window_seconds == 1.5 and result.client_cpu_seconds == 1.25
    with pytest.raises(perf.PerfAnalyzerFailed, match="has 0 rows, not 1"):
        perf.read_report(REPORT.splitlines()[0], 1, 1.0, 0.0)


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    work = tmp_path_factory.mktemp("perf")
    model = build_tiny_mlp(work / "tiny.onnx")
    port, grpc_port = free_port(), free_port()
    spec = ServerSpec(
        "kubeinfer",
        [str(Path(perf.sys.executable)), "-m", "kubeinfer.cli", "serve", "--onnx", str(model),
         "--model-name", "tiny", "--host", HOST, "--port", str(port),
         "--grpc-port", str(grpc_port), "--max-batch-size", "8", "--max-queue-size", "64"],
        port, "tiny", metrics_url=f"http://{HOST}:{port}/metrics",
    )  # fmt: skip
    with ServerProcess(spec, work, ready_timeout_s=120) as server:
        yield server, grpc_port, work


SAMPLES = [{"input": row} for row in np.random.default_rng(3).standard_normal((8, 16))]


def drive(served: tuple, wire: str, load: perf.Load) -> tuple[perf.PerfResult, list]:
    """perf_analyzer's run of `load` over `wire`, and the server's snapshots around it."""
    server, grpc_port, work = served
    pid, url = server.process.pid, server.spec.metrics_url
    target = (
        perf.Target(f"{HOST}:{grpc_port}", "tiny", "grpc")
        if wire == "grpc"
        else perf.Target(f"{HOST}:{server.spec.port}", "tiny", "http", wire)
    )
    marks: list = []
    result = perf.run(
        target, load, SAMPLES, 0.3, work / wire, warmup_seconds=0.3,
        around=lambda: marks.append(snapshot([pid], url, "tiny")),
    )  # fmt: skip
    return result, marks


@pytest.mark.slow
@pytest.mark.parametrize(
    ("wire", "load"),
    [
        ("binary", perf.Load(rows=2, concurrency=4)),
        ("json", perf.Load(concurrency=4)),
        ("grpc", perf.Load(rows=3, concurrency=4)),
        ("binary", perf.Load(request_rate=150, distribution="poisson")),
    ],
)
def test_perf_analyzer_drives_kubeinfer_serve_and_its_figures_agree(
    perf_analyzer: str, served: tuple, wire: str, load: perf.Load
) -> None:
    result, marks = drive(served, wire, load)
    assert result.requests_per_second > 0
    assert result.rows_per_second == pytest.approx(result.requests_per_second * load.rows)
    assert 0 < result.p50_milliseconds <= result.p90_milliseconds <= result.p95_milliseconds
    assert result.p95_milliseconds <= result.p99_milliseconds
    assert result.client_cpu_seconds > 0 and result.window_seconds == pytest.approx(0.9)
    side = between(*marks)
    assert load.rows <= side.mean_batch_rows <= 8


@pytest.mark.slow
@pytest.mark.parametrize(
    ("wire", "load"),
    [("binary", perf.Load(rows=2, concurrency=4)), ("grpc", perf.Load(rows=3, concurrency=4))],
)
def test_the_servers_own_count_agrees_with_perf_analyzers(
    perf_analyzer: str, served: tuple, wire: str, load: perf.Load
) -> None:
    result, marks = drive(served, wire, load)
    side = between(*marks)
    # The server answered at least what perf_analyzer counted in its windows (it also
    # answered the requests before and after them).
    assert side.answered >= 0.9 * result.requests_per_second * result.window_seconds
    assert side.requests_per_cpu_second > 0


@pytest.mark.slow
def test_a_refused_request_ends_the_run_with_the_servers_words(
    perf_analyzer: str, tmp_path: Path
) -> None:
    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    port = free_port()
    spec = ServerSpec(
        "kubeinfer",
        [str(Path(perf.sys.executable)), "-m", "kubeinfer.cli", "serve", "--onnx", str(model),
         "--model-name", "tiny", "--host", HOST, "--port", str(port)],
        port, "tiny",
    )  # fmt: skip
    with ServerProcess(spec, tmp_path, ready_timeout_s=120):
        target = perf.Target(f"{HOST}:{port}", "tiny")
        with pytest.raises(perf.PerfAnalyzerFailed) as failed:  # rows past maxBatchSize
            perf.run(target, perf.Load(rows=64, concurrency=1), SAMPLES, 0.2, tmp_path)
    assert "perf_analyzer exited" in str(failed.value)
    assert "had error: input 'input': shape [64, 16]" in str(failed.value), failed.value
