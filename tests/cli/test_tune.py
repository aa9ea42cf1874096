"""`kubeinfer tune`: the sweep's decisions as tables, the load generator's open loop against
a real (in-process) server, bad arguments, and two real sweeps end to end.

- Pure (`traffic`, `frontier`, `report`): request-size mixes and trace lines parsed or
  refused with what to change; a trace replayed past its end; Poisson arrivals; the grid
  refusing what `kubeinfer serve` would; the frontier (tables, and a property: no frontier
  point dominated, every other point dominated by one); the choice (the SLO met at the
  highest throughput, else the closest point, else the fewest failures); the cost of
  1,000 inferences by the operator's formula (`contract.cost`: the node for the window over
  the requests answered) and the report's line with its inputs; the printed block read
  back as a `BatchingPolicy`.
- The open loop charges a server that falls behind for the queue it builds (latency from
  when a request was due) and counts what is still unanswered after the drain as failed.
- Bad arguments: one line on stderr naming what to change, exit 2, nothing started.
- End to end (slow, real `kubeinfer serve` processes): an ONNX file built and swept in
  closed loop (text output: the block parses as a `BatchingPolicy`, the marked frontier is
  the measured points' frontier, a progress line per point with the time left); then the
  engine directory it built, replayed a trace in open loop with an SLO nothing meets
  (`--json`: exit 1, the closest point chosen and marked so, the cost from its figures).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.cli.main import main
from kubeinfer.cli.tune import perf
from kubeinfer.cli.tune.frontier import (
    Measurement,
    Setting,
    choose,
    default_max_batch_sizes,
    dominates,
    eta_seconds,
    meets_slo,
    pareto_frontier,
    sweep_grid,
)
from kubeinfer.cli.tune.load import EncodedRequest, run_open_loop
from kubeinfer.cli.tune.report import (
    Context,
    batching_block,
    economics,
    progress_line,
    text_report,
)
from kubeinfer.cli.tune.traffic import (
    Arrival,
    RowsMix,
    TrafficError,
    parse_rows_mix,
    parse_trace,
    poisson_arrivals,
    replay_trace,
)
from kubeinfer.contract.cost import PodUsage, window_cost
from kubeinfer.contract.runtime_config import BatchingPolicy
from pydantic import ValidationError

KUBEINFER = [sys.executable, "-m", "kubeinfer.cli.main"]


def point(
    rps: float,
    p99: float,
    errors: int = 0,
    delay: int = 0,
    size: int = 8,
    slots: int = 1,
    failure: str | None = None,
    rows_per_request: int = 1,
    per_cpu: float | None = None,
) -> Measurement:
    return Measurement(
        Setting(delay, size, slots),
        window_seconds=1.0,
        requests_per_second=rps,
        rows_per_second=rps * rows_per_request,
        errors=errors,
        p50_milliseconds=p99 / 2,
        p99_milliseconds=p99,
        requests_per_cpu_second=per_cpu,
        failure=failure,
    )


# --------------------------------------------------------------------------- traffic


@pytest.mark.parametrize(
    ("text", "rows", "shares"),
    [
        ("1", (1,), (1.0,)),
        ("1,8,32", (1, 8, 32), (1 / 3, 1 / 3, 1 / 3)),
        ("1:6,8:3,32:1", (1, 8, 32), (0.6, 0.3, 0.1)),
        (" 4:0.5 , 2:1.5", (4, 2), (0.25, 0.75)),
        ("16:2,2", (16, 2), (2 / 3, 1 / 3)),
    ],
)
def test_a_rows_mix_gives_each_size_its_share(text: str, rows: tuple, shares: tuple) -> None:
    mix = parse_rows_mix(text)
    assert mix.rows == rows
    assert mix.shares == pytest.approx(shares)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "at least 1 row"),
        ("eight", "not ROWS or ROWS:WEIGHT"),
        ("8:x", "not ROWS or ROWS:WEIGHT"),
        ("", "not ROWS or ROWS:WEIGHT"),
        ("8:0", "must be positive"),
        ("8:-1", "must be positive"),
        ("8:inf", "must be positive"),
        ("8:nan", "must be positive"),
        ("1,8,1", "listed twice"),
    ],
)
def test_a_rows_mix_that_makes_no_sense_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(TrafficError, match=says):
        parse_rows_mix(text)


def test_a_trace_is_read_in_any_order_and_blank_lines_are_skipped() -> None:
    text = '{"offsetSeconds": 0.5, "rows": 8}\n\n{"offsetSeconds": 0, "rows": 1}\n'
    assert parse_trace(text) == [Arrival(0.0, 1), Arrival(0.5, 8)]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"offsetSeconds": 0, "rows": 1}\nnot json', "line 2: not JSON"),
        ('{"offsetSeconds": 0, "rows": 1}\n{"offsetSeconds": 1}', "line 2: rows: Field required"),
        ('{"offsetSeconds": -1, "rows": 1}\n{"offsetSeconds": 1, "rows": 1}', "line 1: offset"),
        ('{"offsetSeconds": 0, "rows": 0}\n{"offsetSeconds": 1, "rows": 1}', "line 1: rows"),
        ('{"offsetSeconds": 0, "rows": "8"}\n{"offsetSeconds": 1, "rows": 1}', "line 1: rows"),
        ('{"offsetSeconds": 0, "row": 1}\n{"offsetSeconds": 1, "rows": 1}', "line 1: row"),
        ("[1, 2]\n[3, 4]", "line 1"),
        ('{"offsetSeconds": 0, "rows": 1}', "needs at least 2"),
        ("", "has 0 request"),
        ('{"offsetSeconds": 1, "rows": 1}\n{"offsetSeconds": 1, "rows": 2}', "same offset"),
    ],
)
def test_a_trace_that_cannot_be_replayed_is_refused_naming_the_line(text: str, says: str) -> None:
    with pytest.raises(TrafficError, match=says):
        parse_trace(text, "t.jsonl")


@pytest.mark.parametrize(
    ("until", "offsets"),
    [
        (0.4, [0.0]),
        (1.0, [0.0, 0.5]),
        (2.2, [0.0, 0.5, 1.0, 1.5, 2.0]),  # a period: the last offset plus the mean gap
    ],
)
def test_a_trace_shorter_than_the_point_plays_again_after_itself(
    until: float, offsets: list[float]
) -> None:
    replayed = replay_trace([Arrival(0.0, 1), Arrival(0.5, 4)], until)
    assert [a.offset_seconds for a in replayed] == pytest.approx(offsets)
    assert [a.rows for a in replayed] == [1, 4, 1, 4, 1][: len(offsets)]


def test_poisson_arrivals_come_at_the_rate_in_the_mix_and_repeat_with_their_seed() -> None:
    mix = RowsMix((1, 8), (0.75, 0.25))
    arrivals = poisson_arrivals(2000, 2.0, mix, np.random.default_rng(3))
    offsets = [a.offset_seconds for a in arrivals]
    assert abs(len(arrivals) - 4000) < 5 * math.sqrt(4000)
    assert offsets == sorted(offsets) and 0 <= offsets[0] and offsets[-1] < 2.0
    assert sum(a.rows == 1 for a in arrivals) / len(arrivals) == pytest.approx(0.75, abs=0.03)
    assert poisson_arrivals(2000, 2.0, mix, np.random.default_rng(3)) == arrivals
    with pytest.raises(TrafficError, match="--rate must be positive"):
        poisson_arrivals(0, 1.0, mix, np.random.default_rng(3))


# --------------------------------------------------------------------------- the grid


def test_the_grid_is_every_combination_queue_delay_first() -> None:
    grid = sweep_grid([1000, 0], [32, 8], [1])
    assert grid == [Setting(0, 8, 1), Setting(1000, 8, 1), Setting(0, 32, 1), Setting(1000, 32, 1)]


@pytest.mark.parametrize(
    ("delays", "sizes", "slots", "field"),
    [
        ([0], [0], [1], "max_batch_size"),
        ([0], [2048], [1], "max_batch_size"),
        ([-1], [8], [1], "max_queue_delay_microseconds"),
        ([2_000_000], [8], [1], "max_queue_delay_microseconds"),
        ([0], [8], [17], "execution_slots"),
    ],
)
def test_the_grid_refuses_what_kubeinfer_serve_would(
    delays: list[int], sizes: list[int], slots: list[int], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        sweep_grid(delays, sizes, slots)


@pytest.mark.parametrize(
    ("largest_request", "sizes"), [(1, [8, 32]), (8, [8, 32]), (16, [16, 32]), (64, [64])]
)
def test_the_default_batch_sizes_hold_the_largest_request(
    largest_request: int, sizes: list[int]
) -> None:
    assert default_max_batch_sizes(largest_request) == sizes


# --------------------------------------------------------------------------- the frontier


@pytest.mark.parametrize(
    ("points", "frontier"),
    [
        # throughput up, p99 down: a trade-off keeps both ends
        ([(100, 1.0), (200, 2.0), (150, 3.0)], [(100, 1.0), (200, 2.0)]),
        # one point better on both axes leaves the other off
        ([(100, 5.0), (200, 2.0)], [(200, 2.0)]),
        # equal throughput: only the better p99; equal p99: only the higher throughput
        ([(100, 2.0), (100, 3.0), (50, 2.0)], [(100, 2.0)]),
        # identical figures are both kept (nothing dominates the other)
        ([(100, 2.0), (100, 2.0)], [(100, 2.0), (100, 2.0)]),
        ([], []),
    ],
)
def test_the_frontier_keeps_the_points_nothing_beats_on_both_axes(
    points: list[tuple[float, float]], frontier: list[tuple[float, float]]
) -> None:
    measured = [point(rps, p99, delay=i) for i, (rps, p99) in enumerate(points)]
    got = pareto_frontier(measured)
    assert [(p.requests_per_second, p.p99_milliseconds) for p in got] == frontier


def test_a_point_that_failed_requests_is_never_on_the_frontier() -> None:
    fast_but_dropping = point(1000, 0.5, errors=3)
    broken = point(0, math.nan, failure="kubeinfer exited at start")
    fine = point(100, 5.0)
    assert pareto_frontier([fast_but_dropping, broken, fine]) == [fine]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 50), st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0]), st.integers(0, 1)
        ),
        max_size=12,
    )
)
def test_the_frontier_is_consistent_with_every_point(figures: list) -> None:
    measured = [point(r, p, errors=e, delay=i) for i, (r, p, e) in enumerate(figures)]
    frontier = pareto_frontier(measured)
    assert not any(dominates(a, b) for a in frontier for b in frontier)
    for p in measured:
        if p.succeeded and not any(p is f for f in frontier):
            assert any(dominates(f, p) for f in frontier)


# --------------------------------------------------------------------------- the choice


@pytest.mark.parametrize(
    ("points", "slo", "chosen", "meets"),
    [
        # the highest throughput within the SLO, not the lowest p99
        ([(100, 1.0), (300, 9.0), (500, 20.0)], 10, 1, True),
        # exactly the SLO meets it
        ([(100, 1.0), (300, 10.0)], 10, 1, True),
        # the same throughput: the lower p99
        ([(300, 9.0), (300, 4.0)], 10, 1, True),
        # none meets it: the lowest p99, however slow
        ([(500, 30.0), (100, 12.0)], 10, 1, False),
    ],
)
def test_the_choice_is_the_highest_throughput_that_meets_the_slo(
    points: list[tuple[float, float]], slo: float, chosen: int, meets: bool
) -> None:
    measured = [point(rps, p99, delay=i) for i, (rps, p99) in enumerate(points)]
    choice = choose(measured, slo)
    assert choice.point is measured[chosen]
    assert choice.meets_slo is meets
    assert meets_slo(measured[chosen], slo) is meets


def test_equal_figures_choose_the_smaller_setting() -> None:
    large = point(300, 4.0, delay=1000, size=32)
    small = point(300, 4.0, delay=0, size=32)
    assert choose([large, small], 10).point is small
    assert choose([small, large], 10).point is small


def test_a_point_that_failed_requests_never_meets_the_slo() -> None:
    dropping = point(900, 1.0, errors=1)
    fine = point(100, 8.0)
    assert choose([dropping, fine], 10).point is fine
    assert choose([dropping], 10).meets_slo is False


def test_when_every_point_failed_requests_the_fewest_failures_come_closest() -> None:
    many, few = point(100, 1.0, errors=50), point(100, 9.0, errors=1)
    choice = choose([many, few], 10)
    assert (choice.point, choice.meets_slo) == (few, False)
    assert "the fewest failed at 1 (1.0%)" in choice.reason


def test_with_nothing_measured_nothing_is_chosen() -> None:
    broken = point(0, math.nan, failure="kubeinfer exited at start")
    assert choose([broken], 10).point is None
    assert choose([], 10).point is None


@pytest.mark.parametrize(
    ("cost_per_hour", "requests_per_second", "cost"),
    [
        (3.6, 1000, 0.001),  # 0.001 per second of the node, 1000 requests in it
        (3.6, 10, 0.1),
        (0.5, 0, None),  # nothing answered: no figure
    ],
)
def test_the_cost_of_a_thousand_inferences(
    cost_per_hour: float, requests_per_second: float, cost: float | None
) -> None:
    """An inference is a request answered (4 rows each here), as the operator counts."""
    measured = point(requests_per_second, 4.0, rows_per_request=4)
    money = economics(measured, Context(10, "t", "e", "w", False, node_cost_per_hour=cost_per_hour))
    if cost is None:
        assert money.cost_per_thousand_inferences is None
    else:
        assert money.cost_per_thousand_inferences == pytest.approx(cost)
    # The operator's function itself, on the same inputs: the node for the window.
    same = window_cost([PodUsage(1.0, cost_per_hour, 1.0)], requests_per_second)
    assert money.cost == same


def test_the_economics_of_the_chosen_point() -> None:
    chosen = point(500, 4.0, rows_per_request=4, per_cpu=1000)
    cpu = Context(10, "t", "e", "w", gpu_engine=False, node_cost_per_hour=7.2)
    gpu = Context(10, "t", "e", "w", gpu_engine=True)
    on_cpu, on_gpu = economics(chosen, cpu), economics(chosen, gpu)
    assert on_cpu.requests_per_cpu_second == 1000  # 500 requests on half a core-second
    assert on_cpu.requests_per_gpu_second is None
    assert on_cpu.cost_per_thousand_inferences == pytest.approx(7.2 / 3600 / 500 * 1000)
    assert on_gpu.requests_per_gpu_second == 500
    assert on_gpu.cost_per_thousand_inferences is None


def test_the_report_says_the_cost_with_what_it_is_computed_from() -> None:
    chosen = point(500, 4.0, rows_per_request=4)
    choice = choose([chosen], 10)
    context = Context(10, "t", "e", "w", gpu_engine=False, node_cost_per_hour=7.2)
    text = text_report([chosen], [chosen], choice, context)
    assert (
        "1,000 inferences cost 0.004000: the node at 7.2 per node-hour for 1.0 s (serving "
        "only this) over the 500 inferences (requests answered) of the window"
    ) in text
    without = text_report([chosen], [chosen], choice, Context(10, "t", "e", "w", False))
    assert "1,000 inferences" not in without


@pytest.mark.parametrize("queue_size", [None, 64])
def test_the_printed_block_is_a_batching_policy_with_the_setting(queue_size: int | None) -> None:
    setting = Setting(1500, 16, 2)
    batching = yaml.safe_load(batching_block(setting, queue_size))["runtime"]["batching"]
    policy = BatchingPolicy.model_validate(batching)
    assert batching["policy"] == "Static"  # what the sweep measured, said in the block
    assert (
        policy.max_queue_delay_microseconds,
        policy.max_batch_size,
        policy.execution_slots,
        policy.max_queue_size,
    ) == (1500, 16, 2, queue_size or BatchingPolicy().max_queue_size)


def test_the_progress_line_says_the_figures_and_the_time_left() -> None:
    line = progress_line(3, 12, point(250, 4.0), 10, eta_seconds(3, 12, 30.0))
    assert line.startswith("[ 3/12] maxQueueDelayMicroseconds=0 maxBatchSize=8")
    assert "250 req/s, p99 4.00 ms (meets the SLO); ETA 1:30" in line
    broken = point(0, math.nan, failure="kubeinfer exited at start")
    assert "failed: kubeinfer exited at start" in progress_line(12, 12, broken, 10, 0.0)
    assert eta_seconds(0, 12, 0.0) is None


# --------------------------------------------------------------------------- the open loop


async def test_the_open_loop_charges_a_server_that_falls_behind_for_its_queue() -> None:
    """A server answering one request at a time, 20 ms each. Ten requests due at once:
    a closed loop would see 20 ms each, but counted from when they were due the last
    waited for the nine before it. Ten more due 50 ms before the window ends, with 50 ms
    of drain: the server cannot answer them all in time, and those it did not count as
    failed."""
    service_s = 0.02
    lock = asyncio.Lock()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"Content-Length: (\d+)", head)
                assert length is not None
                await reader.readexactly(int(length.group(1)))
                async with lock:
                    await asyncio.sleep(service_s)  # not a wait: the fake server's service time
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()  # the client left, or the test is over

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    raw = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    request = EncodedRequest(raw, 2, rows=3)
    schedule = [(0.0, 0)] * 10 + [(0.45, 0)] * 10
    async with server:
        result = await run_open_loop(
            "127.0.0.1", port, [request], schedule, 0.0, 0.5, drain_timeout_s=0.05
        )
    latencies = sorted(result.latencies_s)
    assert result.completed + result.errors == 20
    assert result.completed_rows == 3 * result.completed
    assert 10 < result.completed < 20, result
    assert latencies[0] < 2 * service_s
    assert latencies[-1] >= 10 * service_s  # the tenth of the first ten waited for nine
    assert "no answer within 0.05 s" in result.error_samples[0]


# --------------------------------------------------------------------------- bad arguments


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_mlp(tmp_path_factory.mktemp("tune") / "tiny.onnx")


def tune(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(["tune", *argv])
    except SystemExit as exit:  # argparse's own refusals
        code = int(exit.code or 0)
    return code, capsys.readouterr().err


def trace_file(directory: Path, lines: list[str]) -> Path:
    path = directory / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


SWEEP = ["--queue-delays-us", "0", "--max-batch-sizes", "8", "--execution-slots", "1"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--concurrency", "2"], "the following arguments are required: --slo-p99-ms"),
        (["--slo-p99-ms", "5"], "one of the arguments --concurrency --rate --trace is required"),
        (["--slo-p99-ms", "5", "--concurrency", "2", "--rate", "9"], "not allowed with"),
        (["--slo-p99-ms", "0", "--concurrency", "2"], "must be positive, not 0"),
        (["--slo-p99-ms", "5", "--concurrency", "2.5"], "'2.5' is not a number"),
        (["--slo-p99-ms", "5", "--rate", "-3"], "must be positive, not -3"),
        (
            ["--slo-p99-ms", "5", "--concurrency", "2", "--queue-delays-us", "a,b"],
            "not a comma-separated list of integers",
        ),
        (
            ["--slo-p99-ms", "5", "--concurrency", "2", "--max-batch-sizes", "0"],
            "max_batch_size: Input should be greater than or equal to 1 (a swept value)",
        ),
        (
            ["--slo-p99-ms", "5", "--concurrency", "2", "--execution-slots", "99"],
            "execution_slots: Input should be less than or equal to 16",
        ),
        (
            ["--slo-p99-ms", "5", "--concurrency", "2", "--rows", "1,64", *SWEEP],
            "requests of 64 rows need maxBatchSize >= 64, but --max-batch-sizes includes 8",
        ),
        (["--slo-p99-ms", "5", "--concurrency", "2", "--rows", "1:0"], "must be positive"),
        (
            ["--slo-p99-ms", "5", "--concurrency", "2", "--warmup-seconds", "-1"],
            "--warmup-seconds must be at least 0",
        ),
        (["--slo-p99-ms", "5", "--trace", "{trace}", "--rows", "8"], "--rows does not apply"),
        (["--slo-p99-ms", "5", "--trace", "{bad_trace}"], "trace.jsonl, line 2: rows"),
        (["--slo-p99-ms", "5", "--trace", "{missing}"], "cannot read the trace"),
        (["--slo-p99-ms", "5", "--rate", "9", "--precision", "int8"], "invalid choice: 'int8'"),
    ],
)
def test_bad_arguments_are_refused_with_one_line_saying_what_to_change(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    tiny_model: Path,
    argv: list[str],
    says: str,
) -> None:
    good = '{"offsetSeconds": 0, "rows": 1}'
    paths = {
        "trace": str(trace_file(tmp_path, [good, '{"offsetSeconds": 1, "rows": 2}'])),
        "missing": str(tmp_path / "nothing.jsonl"),
    }
    if "{bad_trace}" in argv:
        paths["bad_trace"] = str(trace_file(tmp_path, [good, '{"offsetSeconds": 1, "rows": 0}']))
    code, err = tune(capsys, str(tiny_model), *(a.format(**paths) for a in argv))
    assert code == 2
    assert says in err, err


def test_a_model_that_is_not_there_or_not_an_engine_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = tune(capsys, str(tmp_path / "none.onnx"), "--slo-p99-ms", "5", "--rate", "9")
    assert (code, err.strip()) == (
        2,
        f"kubeinfer tune: no model at {tmp_path / 'none.onnx'}: give an ONNX file or an "
        "engine directory",
    )
    code, err = tune(capsys, str(tmp_path), "--slo-p99-ms", "5", "--rate", "9")
    assert code == 2 and "is a directory but not an engine of a cache" in err
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_text("not a model")
    code, err = tune(capsys, str(not_onnx), "--slo-p99-ms", "5", "--rate", "9", *SWEEP)
    assert code == 2 and "the engine build failed" in err, err


# --------------------------------------------------------------------------- end to end


def table_rows(text: str) -> list[dict[str, str]]:
    """The points table of the text output, as dicts by column."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        for line in lines[2:]
    ]


def figures(row: dict[str, str]) -> Measurement:
    return point(
        float(row["req/s"]),
        float(row["p99 ms"]),
        errors=int(row["failed"]),
        delay=int(row["queue delay µs"]),
        size=int(row["max batch"]),
        slots=int(row["slots"]),
    )


def sweep_json(*argv: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = subprocess.run(
        [*KUBEINFER, "tune", *argv, "--json"], capture_output=True, text=True, timeout=180
    )
    return done, (json.loads(done.stdout) if done.stdout.strip() else {})


def consistent(p: dict, rows_per_request: float | None = None) -> None:
    """What a point measured exists and agrees with itself: every request answered,
    p50 <= p99, rows per request as sent, the server's own figures present."""
    assert p["failed"] == 0 and p["failure"] is None, (p["failure"], p["errorSample"])
    assert p["requestsPerSecond"] > 0 and 0 < p["p50Milliseconds"] <= p["p99Milliseconds"]
    if rows_per_request is not None:
        assert p["rowsPerSecond"] == pytest.approx(p["requestsPerSecond"] * rows_per_request)
    assert p["requestsPerCpuSecond"] > 0 and p["loadCpuSeconds"] > 0
    assert 1 <= p["meanBatchRows"] <= p["maxBatchSize"]  # the server's own histogram


@pytest.mark.slow
def test_a_tiny_sweep_end_to_end_from_onnx_then_from_its_engine(
    perf_analyzer: str, tmp_path: Path
) -> None:
    """perf_analyzer drives the single-size traffic (closed loop, then a replayed trace),
    our own client a trace of several sizes."""
    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    cache = tmp_path / "cache"
    common = ["--duration-seconds", "1.5", "--warmup-seconds", "0.3", "--execution-slots", "1"]
    built = subprocess.run(
        [*KUBEINFER, "tune", str(model), "--cache", str(cache), "--slo-p99-ms", "1000",
         "--concurrency", "2", "--rows", "2", "--queue-delays-us", "0,1000",
         "--max-batch-sizes", "8", *common],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    progress = [line for line in built.stderr.splitlines() if line.startswith("[")]
    assert [line[:5] for line in progress] == ["[1/2]", "[2/2]"], built.stderr
    assert "ETA" in progress[0] and "req/s, p99" in progress[1]

    rows = table_rows(built.stdout)
    assert [(r["queue delay µs"], r["max batch"], r["slots"]) for r in rows] == [
        ("0", "8", "1"),
        ("1000", "8", "1"),
    ]
    measured = [figures(r) for r in rows]
    assert all(p.succeeded for p in measured)
    assert all(float(r["rows/s"]) == pytest.approx(2 * float(r["req/s"]), abs=1) for r in rows)
    marked = [p for p, r in zip(measured, rows, strict=True) if "frontier" in r[""]]
    # The table's figures are rounded, which can make two points tie; so, soundly under
    # rounding: no marked point is beaten on both axes, every other one is matched by one.
    assert marked
    for f in marked:
        assert not any(
            q.requests_per_second > f.requests_per_second
            and q.p99_milliseconds < f.p99_milliseconds
            for q in measured
        )
    for p in measured:
        assert any(
            f.requests_per_second >= p.requests_per_second
            and f.p99_milliseconds <= p.p99_milliseconds
            for f in marked
        )

    block = built.stdout.split("\nruntime:\n", 1)[1].split("\n\n", 1)[0]
    policy = BatchingPolicy.model_validate(
        yaml.safe_load("runtime:\n" + block)["runtime"]["batching"]
    )
    best = max(measured, key=lambda p: p.requests_per_second)  # both meet a 1 s SLO
    assert (policy.max_queue_delay_microseconds, policy.max_batch_size) == (
        best.setting.max_queue_delay_microseconds,
        8,
    )
    assert "requests per CPU-second" in built.stdout

    # The engine it built, served from its cache directory, under a replayed trace of one
    # size (perf_analyzer), with an SLO no point can meet.
    engine_dir = next((cache / "engines").iterdir())
    trace = trace_file(
        tmp_path, [json.dumps({"offsetSeconds": i / 200, "rows": 3}) for i in range(100)]
    )
    replayed, report = sweep_json(
        str(engine_dir), "--slo-p99-ms", "0.001", "--trace", str(trace), "--queue-delays-us",
        "0,500", "--max-batch-sizes", "4", "--node-cost-per-hour", "3.6", *common,
    )  # fmt: skip
    assert replayed.returncode == 1, replayed.stderr
    assert report["meetsSlo"] is False and "no point has p99 <= 0.001 ms" in report["reason"]
    points = report["points"]
    assert len(points) == 2
    for p in points:
        consistent(p, rows_per_request=3)
        # 200 requests/s offered: what arrived was answered (a loose bound: a busy machine
        # moves the windows' edges, not the schedule)
        assert 100 < p["requestsPerSecond"] < 300, p
    closest = min(points, key=lambda p: p["p99Milliseconds"])
    chosen = report["choice"]
    assert chosen["p99Milliseconds"] == closest["p99Milliseconds"]
    assert BatchingPolicy.model_validate(chosen["batching"]).max_batch_size == 4
    assert chosen["costPerThousandInferences"] == pytest.approx(
        3.6 / 3600 / chosen["requestsPerSecond"] * 1000
    )
    assert chosen["requestsPerGpuSecond"] is None  # an ONNX Runtime engine, on CPU
    as_measured = [
        point(p["requestsPerSecond"], p["p99Milliseconds"], delay=p["maxQueueDelayMicroseconds"])
        for p in points
    ]
    on_frontier = {p.setting.max_queue_delay_microseconds for p in pareto_frontier(as_measured)}
    assert {p["maxQueueDelayMicroseconds"] for p in report["frontier"]} == on_frontier
    assert {p["maxQueueDelayMicroseconds"] for p in points if p["onFrontier"]} == on_frontier

    # A trace of several sizes: kubeinfer's own client sends it.
    mixed = trace_file(
        tmp_path, [json.dumps({"offsetSeconds": i / 200, "rows": 1 + i % 3}) for i in range(100)]
    )
    done, report = sweep_json(
        str(engine_dir), "--slo-p99-ms", "1000", "--trace", str(mixed), "--queue-delays-us",
        "0", "--max-batch-sizes", "4", *common,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [own] = report["points"]
    consistent(own)
    assert own["rowsPerSecond"] == pytest.approx(2 * own["requestsPerSecond"], rel=0.1)
    assert abs(own["requestsPerSecond"] - 200) <= 2  # every arrival due in the window answered


def test_without_perf_analyzer_tune_says_how_to_install_it_and_starts_nothing(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny_model: Path,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(perf.sys, "executable", str(tmp_path / "python"))
    code, err = tune(capsys, str(tiny_model), "--slo-p99-ms", "5", "--concurrency", "2", *SWEEP)
    assert code == 2
    assert "perf_analyzer was not found on PATH: install Triton's perf_analyzer" in err
    assert "pip install perf-analyzer" in err and "make .venv/bin/perf_analyzer" in err
    assert not (tmp_path / "cache").exists()
