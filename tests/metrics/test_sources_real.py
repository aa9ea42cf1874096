"""Both metrics sources on real processes: a real Prometheus scraping real `kubeinfer serve`
processes (and a GPU exporter), and the direct read of the same processes.

Covers: the scope's PromQL selector picks exactly the owner's pods (not another owner's
whose name starts with ours, not the same pod name in another namespace); after real load,
request p99, queue depth and GPU memory ratio agree between Prometheus and the direct read
(the GPU gauges are a Rust runtime's, set from fixed device readings as NVML's would set
them, as no GPU is here: `rust_served.gpu_runtime`); a stopped Prometheus, a silent one, a
non-Prometheus server and a query Prometheus refuses each give one MetricsUnavailable in
time with a clear message; a pod that does not answer, a dead pod and a failing pod
listing make the direct read unavailable, naming the pod; `pods_lister` asks the real API
server for the scope's pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cluster_harness import restricted
from kopf import ConnectionInfo
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.operator.kube.client import KubeClient
from kubeinfer.operator.kube.gather import pods_lister
from kubeinfer.operator.metrics_sources import queries as q
from kubeinfer.operator.metrics_sources.direct import DirectRead
from kubeinfer.operator.metrics_sources.prometheus import PrometheusSource
from kubeinfer.operator.metrics_sources.promql import promql_string
from kubeinfer.operator.metrics_sources.queries import Query, Scope
from kubeinfer.operator.metrics_sources.source import MetricsUnavailable
from kubeinfer.runtime.engines.gpu_memory import GpuMemory
from ports import free_port
from prometheus_harness import (
    PrometheusServer,
    RuntimeProcess,
    ScrapeTarget,
    infer,
    pod_object,
    running_prometheus,
    start_runtime,
)
from rust_served import gpu_runtime

pytestmark = pytest.mark.slow

SCOPE = Scope("serving", "demo")
PODS = ("demo-runtime-7d9f8c6b5-x2x4z", "demo-runtime-7d9f8c6b5-q8w7z")
# Owner "demo-runtime-a": its pods' names start with "demo-runtime-" too.
IMPOSTOR = "demo-runtime-a-runtime-5c4b2d29f-zz9x8"
IMPOSTOR_SCOPE = Scope("serving", "demo-runtime-a")  # one pod: the first process again
GPU_SCOPE = Scope("gpu", "big")
# A 52-character owner (the longest the API allows): Kubernetes cuts its pods' generated
# names to 58 characters before the random 5.
LONG_SCOPE = Scope("long", "l" * 52)
LONG_POD = ("l" * 52 + "-runtime-7d9f8c6b5-")[:58] + "x2x4z"
GPU_POD = "big-runtime-6f5d4c7b2-bcdfg"
GPU_READINGS = (GpuMemory(0, "NVIDIA H100", 30 * 2**30, 80 * 2**30),
                GpuMemory(1, "NVIDIA H100", 52 * 2**30, 80 * 2**30))  # fmt: skip
TIMEOUT = 2.0


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RuntimeProcess]]:
    model = build_tiny_mlp(tmp_path_factory.mktemp("metrics-models") / "tiny.onnx")
    started: list[RuntimeProcess] = []
    try:
        for _ in PODS:
            started.append(start_runtime(model, "tiny", "--intra-op-threads", "1"))
        yield started
    finally:
        for runtime in started:
            runtime.stop()


@pytest.fixture(scope="module")
def gpu_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A Rust runtime's /metrics, its GPU memory gauges set from fixed readings: its port."""
    model = build_tiny_mlp(tmp_path_factory.mktemp("gpu-model") / "tiny.onnx")
    with gpu_runtime(model, "big", GPU_READINGS) as served:
        yield served.port


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, runtimes: list[RuntimeProcess], gpu_exporter: int
) -> Iterator[PrometheusServer]:
    first, second = runtimes
    targets = [
        ScrapeTarget(first.address, SCOPE.namespace, PODS[0]),
        ScrapeTarget(second.address, SCOPE.namespace, PODS[1]),
        ScrapeTarget(first.address, SCOPE.namespace, IMPOSTOR),
        ScrapeTarget(second.address, "elsewhere", PODS[0]),
        ScrapeTarget(f"127.0.0.1:{gpu_exporter}", GPU_SCOPE.namespace, GPU_POD),
        ScrapeTarget(f"127.0.0.1:{gpu_exporter}", LONG_SCOPE.namespace, LONG_POD),
    ]
    with running_prometheus(targets, tmp_path_factory.mktemp("prometheus")) as server:
        yield server


@pytest.fixture(scope="module")
def loaded(prometheus: PrometheusServer, runtimes: list[RuntimeProcess]) -> float:
    """Real requests after a first scrape of every target (so rate() sees the histograms
    start from zero), then a scrape after the load; returns the wall time it started."""
    began = time.time()
    prometheus.wait_for_scrape_after(began)
    first, second = runtimes
    jobs = [(first.port, i) for i in range(120)] + [(second.port, 1000 + i) for i in range(50)]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda job: infer(job[0], "tiny", 1 + job[1] % 4, job[1]), jobs))
    assert statuses == [200] * len(jobs)
    prometheus.wait_for_scrape_after(time.time())
    return began


def direct_read(pods: dict[str, list[dict]]) -> DirectRead:
    """A direct read whose API answers `pods` by label selector."""

    async def list_pods(namespace: str, selector: str) -> list[dict]:
        return pods.get(selector, [])

    return DirectRead(list_pods, TIMEOUT)


def assert_same(direct: tuple, from_prometheus: tuple) -> None:
    """Equal figures (None where both found nothing); floats to rounding."""
    assert [v is None for v in direct] == [v is None for v in from_prometheus]
    assert [v for v in direct if v is not None] == pytest.approx(
        [v for v in from_prometheus if v is not None], rel=1e-9, abs=1e-12
    )


def live_pods(runtimes: list[RuntimeProcess], gpu_port: int) -> dict[str, list[dict]]:
    """What the API answers, by label selector."""
    return {
        SCOPE.label_selector: [
            pod_object(name, r.port) for name, r in zip(PODS, runtimes, strict=True)
        ],
        IMPOSTOR_SCOPE.label_selector: [pod_object(IMPOSTOR, runtimes[0].port)],
        GPU_SCOPE.label_selector: [pod_object(GPU_POD, gpu_port)],
    }


def test_scope_selects_exactly_the_owners_pods(prometheus: PrometheusServer, loaded: float) -> None:
    selected = prometheus.query(f"count by (namespace, pod) (up{{{SCOPE.promql_labels({})}}})")
    assert sorted(series["metric"]["pod"] for series in selected) == sorted(PODS)
    assert {series["metric"]["namespace"] for series in selected} == {SCOPE.namespace}
    selected = prometheus.query(f"count by (pod) (up{{{IMPOSTOR_SCOPE.promql_labels({})}}})")
    assert [series["metric"]["pod"] for series in selected] == [IMPOSTOR]
    selected = prometheus.query(f"count by (pod) (up{{{LONG_SCOPE.promql_labels({})}}})")
    assert [series["metric"]["pod"] for series in selected] == [LONG_POD]


@pytest.mark.parametrize("value", ['a"b', "back\\slash", "new\nline", "sha256:" + "0" * 64])
def test_label_values_reach_prometheus_unchanged(prometheus: PrometheusServer, value: str) -> None:
    (series,) = prometheus.query(f'label_replace(vector(1), "v", {promql_string(value)}, "", "")')
    assert series["metric"]["v"] == value


async def test_general_queries_agree(
    prometheus: PrometheusServer, runtimes: list[RuntimeProcess], gpu_exporter: int, loaded: float
) -> None:
    """Request p99 over a one-pod scope: rate() extrapolates each pod's series to the
    window's end by that pod's own scrape phase, so across pods PromQL weights them a
    little apart from the cumulative counts; within one pod the factor is common and the
    figures are equal (summing buckets over pods is proven exact by the shadow p99s)."""
    now = datetime.now(UTC)
    window = int(time.time() - loaded) + 30  # every observation is inside the rate window
    bound = [
        q.REQUEST_P99.bind(IMPOSTOR_SCOPE, window_seconds=window),
        q.QUEUE_DEPTH.bind(SCOPE),
        q.GPU_MEMORY_USED_RATIO.bind(SCOPE),
        q.GPU_MEMORY_USED_RATIO.bind(GPU_SCOPE),
        q.QUEUE_DEPTH.bind(GPU_SCOPE),
    ]
    from_prometheus = await PrometheusSource(prometheus.url, TIMEOUT).evaluate(bound, now)
    direct = await direct_read(live_pods(runtimes, gpu_exporter)).evaluate(bound, now)
    p99, depth, no_gpu, gpu_ratio, gpu_depth = from_prometheus
    assert p99 is not None and 0 < p99 < 10
    assert (depth, no_gpu, gpu_depth) == (0, None, 0)
    assert gpu_ratio == pytest.approx(52 / 80)
    assert_same(direct, from_prometheus)


async def test_a_stopped_prometheus_is_unavailable_at_once(tmp_path: Path) -> None:
    with running_prometheus([], tmp_path) as server:
        url = server.url
    source = PrometheusSource(url, TIMEOUT)
    with pytest.raises(MetricsUnavailable) as error:
        await source.evaluate([q.QUEUE_DEPTH.bind(SCOPE)], datetime.now(UTC))
    # Refused, not timed out: unavailable at once.
    assert str(error.value) == "query queue_depth failed: cannot connect (Connection refused)"
    assert source.description == f"Prometheus at {url}"


async def test_a_silent_prometheus_times_out() -> None:
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        source = PrometheusSource(url, 0.5)
        with pytest.raises(MetricsUnavailable, match=r"no answer within 0\.5 s$"):
            await source.evaluate([q.QUEUE_DEPTH.bind(SCOPE)] * 3, datetime.now(UTC))
        # The three were asked at once, not one after another's timeout: all three had
        # connected when the first timed out.
        listener.setblocking(False)
        connected = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                listener.accept()[0].close()
                connected += 1
        assert connected == 3


async def test_error_answers_are_unavailable_with_the_reason(
    prometheus: PrometheusServer, runtimes: list[RuntimeProcess]
) -> None:
    now = datetime.now(UTC)
    not_prometheus = PrometheusSource(f"http://{runtimes[0].address}", TIMEOUT)
    no_route = r"query queue_depth failed: HTTP 404: no route GET /api/v1/query$"
    with pytest.raises(MetricsUnavailable, match=no_route):
        await not_prometheus.evaluate([q.QUEUE_DEPTH.bind(SCOPE)], now)
    broken = Query("broken", SCOPE, "sum(kubeinfer_queue_depth", lambda pods: None)
    with pytest.raises(MetricsUnavailable, match=r"query broken failed: HTTP 400: .*unclosed"):
        await PrometheusSource(prometheus.url, TIMEOUT).evaluate([broken], now)


async def test_a_pod_that_does_not_answer_makes_the_read_unavailable(
    runtimes: list[RuntimeProcess],
) -> None:
    pods = [pod_object(name, r.port) for name, r in zip(PODS, runtimes, strict=True)]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        silent = pod_object("demo-runtime-7d9f8c6b5-sxlnt", listener.getsockname()[1])
        dead = pod_object("demo-runtime-7d9f8c6b5-d4d2b", free_port())
        source = DirectRead(lambda ns, sel: _answer([*pods, silent, dead]), 0.5)
        with pytest.raises(MetricsUnavailable) as error:
            await source.evaluate([q.QUEUE_DEPTH.bind(SCOPE)], datetime.now(UTC))
    message = str(error.value)
    assert "pod demo-runtime-7d9f8c6b5-sxlnt did not answer" in message
    assert "within 0.5 s" in message
    assert "pod demo-runtime-7d9f8c6b5-d4d2b could not be read" in message
    assert PODS[0] not in message and PODS[1] not in message
    # Only ready pods are read: the same dead pod, not ready, is left out.
    dead_not_ready = {**dead, "status": {**dead["status"], "conditions": []}}
    source = DirectRead(lambda ns, sel: _answer([*pods, dead_not_ready]), 0.5)
    assert (await source.evaluate([q.QUEUE_DEPTH.bind(SCOPE)], datetime.now(UTC))) == (0,)


async def test_a_failing_pod_listing_is_unavailable() -> None:
    async def list_pods(namespace: str, selector: str) -> list[dict]:
        raise ConnectionError("API server unreachable")

    with pytest.raises(MetricsUnavailable) as error:
        await DirectRead(list_pods, 0.5).evaluate([q.QUEUE_DEPTH.bind(SCOPE)], datetime.now(UTC))
    assert str(error.value) == (
        f"listing the pods {SCOPE.label_selector} in namespace serving failed: "
        "API server unreachable"
    )


async def test_pods_lister_asks_the_api_for_the_scopes_pods(local_cluster) -> None:  # type: ignore[no-untyped-def]
    namespace = local_cluster.new_namespace("pods-lister")
    kube = local_cluster.admin(namespace)
    labels = dict(part.split("=") for part in SCOPE.label_selector.split(","))
    for name, pod_labels in (("in-scope", labels), ("other", {"app": "other"})):
        kube.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": pod_labels},
            "spec": {"containers": [restricted({"name": "c", "image": "example.com/unpulled:1"})]},
        })  # fmt: skip
    pki = local_cluster.cluster.pki
    connection = ConnectionInfo(
        server=local_cluster.server, ca_path=str(pki.ca_cert),
        certificate_path=str(pki.admin_cert), private_key_path=str(pki.admin_key),
    )  # fmt: skip
    try:
        async with KubeClient(connection) as client:
            listed = await pods_lister(client)(namespace, SCOPE.label_selector)
    finally:
        local_cluster.admin().delete("v1", "namespaces", namespace, namespace=None)
    assert [pod["metadata"]["name"] for pod in listed] == ["in-scope"]


async def _answer(pods: list[dict]) -> list[dict]:
    await asyncio.sleep(0)  # not a wait: one loop turn, as an awaited lister answers
    return pods
