"""`read_scaling_signals` against a real Prometheus scraping real runtimes, and the direct
read of the same runtimes.

Three kinds of pod, each in its own scope:
- `load`: two `kubeinfer serve` processes under real closed-loop load (a model with
  enough compute per row that batches take milliseconds, so requests queue behind the
  running batch): each pod has at most `CLIENTS` requests in progress, so both sources
  read a figure in (0, CLIENTS] while the load runs, and Prometheus saw
  `kubeinfer_requests_in_progress` above 0 on each pod at some scrape. Under load the
  sources read different instants (the last scrape, now); they are compared exactly at a
  quiet moment, after a scrape that followed the load: 0 from both.
- `held`: a fixed load, for exact agreement on figures other than 0: the Rust data plane
  serving the real ONNX Runtime engine in this process (`rust_served`) on a loopback port,
  its slot held at a gate and real HTTP requests queued behind it, so the server counts
  them in progress. Nothing moves while it is held, so Prometheus' last scrape and the
  direct read's scrape (both of the server's own /metrics) see the same state: pods of 1+3
  and 1+0 requests, 2.5 from both.
- `gpu`: a Rust runtime whose GPU memory gauges are set from fixed device readings as
  NVML's would set them (no GPU here): the ratio from both; the CPU pods' GPU figure is
  None, without error.

Also: overrides (a doubled load signal, a minimum instead of a maximum GPU ratio) are
what Prometheus answers and change nothing in the direct read; their placeholders reach
Prometheus as the values (a namespace with quotes and backslashes, the pod regex); a
broken override, and one answering several series, are `MetricsUnavailable` naming the
query and the field (and `ScalingSignals.error` through `read_scaling_signals`); a
stopped Prometheus gives signals with `error` and no figures, and the same Prometheus
back on its port (its TSDB kept) gives figures again.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.cli.demo.mlp_models import build_mlp, build_tiny_mlp
from kubeinfer.contract.runtime_config import BatchingPolicy, EngineSource, RuntimeConfig
from kubeinfer.operator.api.v1alpha1.inference_deployment import QueryOverrides
from kubeinfer.operator.metrics_sources.direct import DirectRead
from kubeinfer.operator.metrics_sources.prometheus import PrometheusSource
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.metrics_sources.scaling import read_scaling_signals, scaling_queries
from kubeinfer.operator.metrics_sources.source import MetricsSource, MetricsUnavailable
from kubeinfer.operator.state.scaling_inputs import ScalingSignals
from kubeinfer.runtime.engines.gpu_memory import GpuMemory
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from prometheus_harness import (
    PrometheusServer,
    RuntimeProcess,
    ScrapeTarget,
    infer,
    pod_object,
    running_prometheus,
    start_runtime,
)
from rust_served import RustServed, gpu_runtime, rust_served
from waiting import eventually, wait_for

pytestmark = pytest.mark.slow

LOAD = Scope("load", "busy")
LOAD_PODS = ("busy-runtime-7d9f8c6b5-x2x4z", "busy-runtime-7d9f8c6b5-q8w7z")
CLIENTS = 3  # per load pod, each sending its next request when the last is answered
ROWS = 64  # per request: a few milliseconds of compute on one core
HELD = Scope("held", "steady")
HELD_PODS = ("steady-runtime-5c4b2d29f-bcdfg", "steady-runtime-5c4b2d29f-hjklm")
HELD_QUEUED = (3, 0)  # behind one running request each: 4 and 1 requests, 2.5 per pod
GPU = Scope("gpu", "big")
GPU_POD = "big-runtime-6f5d4c7b2-bcdfg"
GPU_READINGS = (GpuMemory(0, "NVIDIA H100", 30 * 2**30, 80 * 2**30),
                GpuMemory(1, "NVIDIA H100", 52 * 2**30, 80 * 2**30))  # fmt: skip
NO_OVERRIDES = QueryOverrides()
TIMEOUT = 2.0


class HeldEngine:
    """The real engine, every slot's `run` waiting for `gate` first."""

    def __init__(self, engine: OnnxRuntimeEngine) -> None:
        self.engine = engine
        self.gate = threading.Event()
        self.running = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def create_slot(self) -> HeldSlot:
        return HeldSlot(self, self.engine.create_slot())


class HeldSlot:
    def __init__(self, owner: HeldEngine, slot: Any) -> None:
        self.owner, self.slot = owner, slot

    def input_views(self, rows: int, shape: Any = None) -> Any:
        return self.slot.input_views(rows, shape)

    def run(self, rows: int, shape: Any = None) -> Any:
        self.owner.running += 1
        assert self.owner.gate.wait(120), "the held batch was never released"
        return self.slot.run(rows, shape)

    def close(self) -> None:
        self.slot.close()


def infer_body(rows: int) -> dict[str, Any]:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [rows, 16],
                        "data": [0.5] * (rows * 16)}]}  # fmt: skip


def post(served: RustServed, rows: int) -> int:
    body = json.dumps(infer_body(rows)).encode()
    return served.request("POST", served.infer_path, body, timeout=900)[0]


@contextmanager
def held_runtimes(model: Path, queued: Sequence[int]) -> Iterator[list[int]]:
    """Per entry, the Rust data plane on a loopback port, its engine held at the gate,
    with one 4-row request running and `queued` 1-row requests behind it, all sent over
    HTTP from threads; yields the ports. Requests wait up to 10 minutes in the queue (no
    deadline passes while the module's tests run)."""
    engines: list[HeldEngine] = []
    requests: list[Future[int]] = []
    with ExitStack() as stack:
        pool = stack.enter_context(ThreadPoolExecutor(len(queued) + sum(queued)))
        try:
            ports = []
            for count in queued:
                engine = HeldEngine(OnnxRuntimeEngine(model, max_batch_size=32, intra_op_threads=1))
                engines.append(engine)
                stack.callback(engine.engine.close)
                config = RuntimeConfig(
                    model_name="tiny", engine=EngineSource(onnx_path=str(model)),
                    host="127.0.0.1", batching=BatchingPolicy(
                        execution_slots=1, default_timeout_milliseconds=600_000
                    ),
                )  # fmt: skip
                served = stack.enter_context(rust_served(config, engine))
                requests.append(pool.submit(post, served, 4))
                wait_for(lambda e=engine: e.running == 1, what="the held batch", every=0.002)
                requests.extend(pool.submit(post, served, 1) for _ in range(count))
                wait_for(lambda s=served, n=count: s.queued() == n, what=f"{count} queued",
                         every=0.002)  # fmt: skip
                assert served.in_progress() == count + 1, "not all counted in progress"
                ports.append(served.port)
            yield ports
        finally:
            for engine in engines:
                engine.gate.set()
            statuses = [request.result(timeout=30) for request in requests]
            assert statuses == [200] * len(requests), statuses


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("scaling-models")
    return {
        # 16 inputs, three 1024-wide layers: ~4 MFLOP a row, small JSON requests.
        "heavy": build_mlp(directory / "heavy.onnx", 16, (1024, 1024, 1024), 10),
        "tiny": build_tiny_mlp(directory / "tiny.onnx"),
    }


@pytest.fixture(scope="module")
def runtimes(models: dict[str, Path]) -> Iterator[list[RuntimeProcess]]:
    started: list[RuntimeProcess] = []
    try:
        for _ in LOAD_PODS:
            started.append(
                start_runtime(models["heavy"], "heavy", "--intra-op-threads", "1",
                              "--max-batch-size", str(ROWS * CLIENTS))
            )  # fmt: skip
        yield started
    finally:
        for runtime in started:
            runtime.stop()


@pytest.fixture(scope="module")
def held(models: dict[str, Path]) -> Iterator[list[int]]:
    with held_runtimes(models["tiny"], HELD_QUEUED) as ports:
        yield ports


@pytest.fixture(scope="module")
def gpu_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A Rust runtime's /metrics, its GPU memory gauges set from fixed readings: its port."""
    model = build_tiny_mlp(tmp_path_factory.mktemp("gpu-model") / "tiny.onnx")
    with gpu_runtime(model, "big", GPU_READINGS) as served:
        yield served.port


def all_targets(
    runtimes: list[RuntimeProcess], held: list[int], gpu_port: int
) -> list[ScrapeTarget]:
    addresses = [r.address for r in runtimes] + [f"127.0.0.1:{port}" for port in held]
    pods = [(LOAD, pod) for pod in LOAD_PODS] + [(HELD, pod) for pod in HELD_PODS]
    return [
        *(ScrapeTarget(address, scope.namespace, pod)
          for address, (scope, pod) in zip(addresses, pods, strict=True)),
        ScrapeTarget(f"127.0.0.1:{gpu_port}", GPU.namespace, GPU_POD),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory,
    runtimes: list[RuntimeProcess],
    held: list[int],
    gpu_exporter: int,
) -> Iterator[PrometheusServer]:
    targets = all_targets(runtimes, held, gpu_exporter)
    with running_prometheus(targets, tmp_path_factory.mktemp("prometheus")) as server:
        server.wait_for_scrape_after(time.time())
        yield server


@pytest.fixture(scope="module")
def direct(runtimes: list[RuntimeProcess], held: list[int], gpu_exporter: int) -> DirectRead:
    """The direct read; the API it lists pods from answers by label selector."""
    pods = {
        LOAD.label_selector: [
            pod_object(pod, r.port) for pod, r in zip(LOAD_PODS, runtimes, strict=True)
        ],
        HELD.label_selector: [
            pod_object(pod, port) for pod, port in zip(HELD_PODS, held, strict=True)
        ],
        GPU.label_selector: [pod_object(GPU_POD, gpu_exporter)],
    }

    async def list_pods(namespace: str, selector: str) -> list[dict]:
        return pods.get(selector, [])

    return DirectRead(list_pods, TIMEOUT)


P99_WINDOW_SECONDS = 60


async def signals(
    source: MetricsSource, scope: Scope, overrides: QueryOverrides = NO_OVERRIDES
) -> ScalingSignals:
    return await read_scaling_signals(
        source, scope, overrides, datetime.now(UTC), P99_WINDOW_SECONDS
    )


def windowless(read: ScalingSignals) -> ScalingSignals:
    """The figures alone, without the window the p99 covers (only Prometheus has one)."""
    return replace(read, p99_window_seconds=None)


async def test_under_load_both_sources_read_requests_in_progress(
    prometheus: PrometheusServer, direct: DirectRead, runtimes: list[RuntimeProcess]
) -> None:
    source = PrometheusSource(prometheus.url, TIMEOUT)
    stop = threading.Event()

    def client(port: int, seed: int) -> int:
        sent = 0
        while not stop.is_set():
            assert infer(port, "heavy", ROWS, seed + sent) == 200
            sent += 1
        return sent

    jobs = [(r.port, 1000 * i) for i, r in enumerate(runtimes * CLIENTS)]
    in_progress_now = f"kubeinfer_requests_in_progress{{{LOAD.promql_labels({})}}} > 0"
    readings: list[tuple[ScalingSignals, ScalingSignals]] = []
    seen_in_progress: set[str] = set()  # pods Prometheus saw with requests in progress
    with ThreadPoolExecutor(len(jobs)) as pool:
        clients = [pool.submit(client, port, seed) for port, seed in jobs]

        async def read_under_load() -> bool:
            """A reading after a fresh scrape: every pod seen busy, both sources' readings
            with requests in progress and a p99."""
            await asyncio.to_thread(prometheus.wait_for_scrape_after, time.time())
            reading = (await signals(source, LOAD), await signals(direct, LOAD))
            readings.append(reading)
            seen_in_progress.update(
                series["metric"]["pod"] for series in prometheus.query(in_progress_now)
            )
            return seen_in_progress == set(LOAD_PODS) and all(
                s.requests_in_progress_per_replica and s.p99_seconds for s in reading
            )

        try:
            await eventually(read_under_load, 15, lambda: f"a reading under load: {readings}",
                             every=0)  # fmt: skip
        finally:
            stop.set()
        sent = [c.result() for c in clients]
    assert min(sent) > 0
    for reading in readings:
        for s in reading:
            assert s.error == "" and s.gpu_memory_used_ratio is None  # CPU pods: no GPU
            assert s.requests_in_progress_per_replica is not None
            assert 0 <= s.requests_in_progress_per_replica <= CLIENTS
    from_prometheus, from_pods = readings[-1]
    assert (
        from_prometheus.requests_in_progress_per_replica
        and from_pods.requests_in_progress_per_replica
    )
    assert from_prometheus.p99_seconds and from_pods.p99_seconds
    # A quiet moment: every request answered, then a scrape; both read the same 0.
    await asyncio.to_thread(prometheus.wait_for_scrape_after, time.time())
    quiet = (await signals(source, LOAD), await signals(direct, LOAD))
    assert [s.requests_in_progress_per_replica for s in quiet] == [0, 0]


async def test_a_fixed_load_reads_the_same_from_both_sources(
    prometheus: PrometheusServer, direct: DirectRead
) -> None:
    from_prometheus = await signals(PrometheusSource(prometheus.url, TIMEOUT), HELD)
    from_pods = await signals(direct, HELD)
    expected = ScalingSignals(requests_in_progress_per_replica=2.5)  # (1 + 3 + 1 + 0) / 2
    # Prometheus' p99 covers its window; the direct read's, the time since each pod started.
    assert (from_prometheus.p99_window_seconds, from_pods.p99_window_seconds) == (
        P99_WINDOW_SECONDS,
        None,
    )
    assert windowless(from_prometheus) == from_pods == expected


async def test_gpu_memory_comes_from_the_runtimes_exporter(
    prometheus: PrometheusServer, direct: DirectRead
) -> None:
    from_prometheus = await signals(PrometheusSource(prometheus.url, TIMEOUT), GPU)
    from_pods = await signals(direct, GPU)
    assert windowless(from_prometheus) == from_pods
    assert from_prometheus.gpu_memory_used_ratio == pytest.approx(52 / 80)
    assert from_prometheus.requests_in_progress_per_replica == 0 and from_prometheus.error == ""


async def test_overrides_are_prometheus_only(
    prometheus: PrometheusServer, direct: DirectRead
) -> None:
    doubled = QueryOverrides(
        requests_in_progress_per_replica=(
            '2 * avg(sum by (pod) (kubeinfer_requests_in_progress{namespace="$namespace",'
            'pod=~"${pods}"}))'
        ),
        gpu_memory_used_ratio=(
            'min(kubeinfer_gpu_memory_used_bytes{namespace="$namespace",pod=~"$pods"}'
            ' / kubeinfer_gpu_memory_total_bytes{namespace="$namespace",pod=~"$pods"})'
        ),
    )
    source = PrometheusSource(prometheus.url, TIMEOUT)
    held_from_prometheus = await signals(source, HELD, doubled)
    assert held_from_prometheus.requests_in_progress_per_replica == 5.0
    assert (await signals(direct, HELD, doubled)).requests_in_progress_per_replica == 2.5
    gpu_from_prometheus = await signals(source, GPU, doubled)
    assert gpu_from_prometheus.gpu_memory_used_ratio == pytest.approx(30 / 80)
    assert (await signals(direct, GPU, doubled)).gpu_memory_used_ratio == pytest.approx(52 / 80)


async def test_placeholders_reach_prometheus_as_the_values(prometheus: PrometheusServer) -> None:
    odd = Scope('it"s\\odd', "steady")
    (query, *_) = scaling_queries(
        odd, QueryOverrides(requests_in_progress_per_replica='label_replace(vector(1), "v", '
                                                    '"$namespace $pods", "", "")'),
    )  # fmt: skip
    (series,) = prometheus.query(query.promql)
    assert series["metric"]["v"] == f"{odd.namespace} {odd.pod_regex}"
    (query, *_) = scaling_queries(
        HELD, QueryOverrides(requests_in_progress_per_replica='count(up{namespace="$namespace",'
                                                     'pod=~"$pods"})'),
    )  # fmt: skip
    assert prometheus.query(query.promql)[0]["value"][1] == str(len(HELD_PODS))


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("avg(kubeinfer_requests_in_progress{", r"HTTP 400: .*unexpected end of input"),
        (
            'kubeinfer_requests_in_progress{namespace="$namespace"}',
            r"2 series came back, expected one",
        ),
    ],
)
async def test_a_broken_override_is_unavailable_naming_its_field(
    prometheus: PrometheusServer, direct: DirectRead, override: str, reason: str
) -> None:
    overrides = QueryOverrides(requests_in_progress_per_replica=override)
    source = PrometheusSource(prometheus.url, TIMEOUT)
    named = (
        r"query requests_in_progress_per_replica \(PromQL of "
        r"spec\.monitoring\.queries\.requestsInProgressPerReplica\) failed: "
    )
    with pytest.raises(MetricsUnavailable, match=f"^{named}{reason}"):
        await source.evaluate(scaling_queries(HELD, overrides), datetime.now(UTC))
    read = await signals(source, HELD, overrides)
    figures = (read.requests_in_progress_per_replica, read.gpu_memory_used_ratio, read.p99_seconds)
    assert figures == (None, None, None)
    assert read.error.startswith(f"Prometheus at {prometheus.url}: ")
    assert "spec.monitoring.queries.requestsInProgressPerReplica" in read.error
    assert (await signals(direct, HELD, overrides)).requests_in_progress_per_replica == 2.5


async def test_a_stopped_prometheus_is_an_error_and_back_gives_figures_again(
    prometheus: PrometheusServer,
) -> None:
    source = PrometheusSource(prometheus.url, TIMEOUT)
    assert windowless(await signals(source, HELD)) == ScalingSignals(
        requests_in_progress_per_replica=2.5
    )
    prometheus.stop()
    try:
        down = await signals(source, HELD)
    finally:
        prometheus.start()  # its TSDB kept the held pods' last scrapes: figures at once
    figures = (down.requests_in_progress_per_replica, down.gpu_memory_used_ratio, down.p99_seconds)
    assert figures == (None, None, None)
    # Whichever of the three queries failed first.
    assert re.fullmatch(
        rf"Prometheus at {re.escape(prometheus.url)}: query \w+ failed: "
        r"cannot connect \(Connection refused\)",
        down.error,
    ), down.error
    assert windowless(await signals(source, HELD)) == ScalingSignals(
        requests_in_progress_per_replica=2.5
    )
