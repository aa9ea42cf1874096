"""The autoscaler's signals for many objects from one real Prometheus: one grouped query per
signal per pass (`shared_reads`), whatever the number of objects, and each object's
figures exactly what its own per-object queries answer.

The pods are loopback exporters that Prometheus scrapes every 500 ms, one per pod,
labelled with a namespace and pod name as Kubernetes discovery labels them: OBJECTS
objects of two pods in two namespaces, one owner long enough that its pods' names are
cut, and decoys in the same namespace that must count for nobody (a shadow candidate's
pods, and pods of a Deployment whose name extends an owner's), with loads a hundred times
larger. Each pod exports requests in progress, GPU memory used and total, and a request
duration histogram growing at a steady rate, all different per pod. Queries are counted
twice: by the source's own counter (`Activity.metrics_queries`) and by Prometheus' own
count of requests to its query API.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.api.v1alpha1.inference_deployment import QueryOverrides
from kubeinfer.operator.metrics_sources.prometheus import PrometheusSource
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.metrics_sources.scaling import read_scaling_signals
from kubeinfer.operator.state.scaling_inputs import ScalingSignals
from kubeinfer.operator.telemetry.activity import Activity
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families
from prometheus_harness import PrometheusServer, ScrapeTarget, http_get, running_prometheus
from waiting import wait_for

pytestmark = pytest.mark.slow

OBJECTS = 40
LONG_OWNER = "a-model-name-long-enough-that-its-pod-names-get-cut"
BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GIB = 2**30
PASS_SECONDS = 30.0
NO_OVERRIDES = QueryOverrides()
SUFFIXES = ("x2x4z", "q8w7z")


@dataclass
class Pod:
    """What one pod exports: fixed gauges, and a histogram growing `rate` observations a
    second, each in bucket `bucket` (an index into BOUNDS, or +Inf past them)."""

    in_progress: float
    gpu_used: float
    bucket: int
    rate: float
    started: float = field(default_factory=time.time)

    def exposition(self) -> str:
        count = self.rate * (time.time() - self.started)
        name = series.REQUEST_DURATION.name
        lines = [
            f"# TYPE {series.REQUESTS_IN_PROGRESS.name} gauge",
            f'{series.REQUESTS_IN_PROGRESS.name}{{model="m"}} {self.in_progress}',
            f"# TYPE {series.GPU_MEMORY_USED.name} gauge",
            f'{series.GPU_MEMORY_USED.name}{{gpu="0"}} {self.gpu_used}',
            f"# TYPE {series.GPU_MEMORY_TOTAL.name} gauge",
            f'{series.GPU_MEMORY_TOTAL.name}{{gpu="0"}} {80 * GIB}',
            f"# TYPE {name} histogram",
        ]
        for i, bound in enumerate((*BOUNDS, float("inf"))):
            le = "+Inf" if i == len(BOUNDS) else repr(bound)
            lines.append(f'{name}_bucket{{model="m",le="{le}"}} {count if i >= self.bucket else 0}')
        lines += [f'{name}_count{{model="m"}} {count}', f'{name}_sum{{model="m"}} {count / 100}']
        return "\n".join(lines) + "\n"


def pod_names(owner: str, deployment_suffix: str = "runtime") -> list[str]:
    """Two pods as a ReplicaSet of `<owner>-<suffix>` names them, cut as Kubernetes cuts
    a generated name's base to 58 characters."""
    base = f"{owner}-{deployment_suffix}-7d9f8c6b5-"[:58]
    return [base + suffix for suffix in SUFFIXES]


def object_pods(index: int) -> list[Pod]:
    """Object `index`'s two pods: loads i and i + 0.5, GPUs (i % 7 + 1) and (i % 7 + 2)
    GiB of 80 in use, observations in different buckets at different rates."""
    return [
        Pod(index + 0.5 * j, (index % 7 + 1 + j) * GIB, (index + 3 * j) % len(BOUNDS), 1 + j)
        for j in range(2)
    ]


SCOPES = [Scope(f"fleet-{'ab'[i % 2]}", f"model-{i:05d}") for i in range(OBJECTS)]
LONG = Scope("fleet-a", LONG_OWNER)


@dataclass
class Fleet:
    prometheus: PrometheusServer
    pods: dict[tuple[str, str], Pod]


def serve(pod: Pod) -> ThreadingHTTPServer:
    """An exporter of `pod` on a loopback port, in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pod.exposition().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)  # Prometheus may stop mid-scrape as the module ends

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    pods: dict[tuple[str, str], Pod] = {}
    for index, scope in enumerate(SCOPES):
        pods.update(
            zip(
                ((scope.namespace, n) for n in pod_names(scope.owner)),
                object_pods(index),
                strict=True,
            )
        )
    pods.update(
        zip(((LONG.namespace, n) for n in pod_names(LONG.owner)), object_pods(100), strict=True)
    )
    decoys = [*pod_names("model-00000", "candidate"), *pod_names("model-00000", "runtime-extra")]
    pods.update(((SCOPES[0].namespace, name), Pod(1000, 79 * GIB, 8, 50)) for name in decoys)
    servers = [serve(pod) for pod in pods.values()]
    targets = [
        ScrapeTarget(f"127.0.0.1:{server.server_address[1]}", namespace, name)
        for server, (namespace, name) in zip(servers, pods, strict=True)
    ]
    try:
        with running_prometheus(targets, tmp_path_factory.mktemp("prometheus")) as prometheus:
            rated = f"count(rate({series.REQUEST_DURATION.name}_count[120s]))"
            wait_for(
                lambda: (
                    int(float((prometheus.query(rated) or [{"value": [0, 0]}])[0]["value"][1]))
                    == len(pods)
                ),
                60,
                "a rate for every pod (two scrapes of each)",
            )
            yield Fleet(prometheus, pods)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def query_api_requests(prometheus: PrometheusServer) -> float:
    """Requests Prometheus' instant query API has answered, by its own counter."""
    status, body = http_get(prometheus.port, "/metrics")
    assert status == 200
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "prometheus_http_requests_total"
        and sample.labels.get("handler") == "/api/v1/query"
    )


async def read_all(
    source: PrometheusSource, scopes: Sequence[Scope], now: datetime,
    overrides: dict[Scope, QueryOverrides] | None = None,
) -> list[ScalingSignals]:  # fmt: skip
    """Every scope's signals at `now`, all at once, as the operator's passes overlap."""
    overrides = overrides or {}
    return list(
        await asyncio.gather(
            *(read_scaling_signals(source, s, overrides.get(s, NO_OVERRIDES), now) for s in scopes)
        )
    )


def expected(index: int) -> tuple[float, float]:
    """Object `index`'s load per replica and GPU ratio, from what its pods export."""
    return index + 0.25, (index % 7 + 2) / 80


def test_one_grouped_query_per_signal_gives_every_object_its_own_figures(fleet: Fleet) -> None:
    scopes = [*SCOPES, LONG]
    now = datetime.now(UTC)
    own = Activity()
    per_object = PrometheusSource(fleet.prometheus.url, 10, own)
    reference = asyncio.run(read_all(per_object, scopes, now))
    assert own.metrics_queries == Counter({"prometheus": 3 * len(scopes)})

    activity = Activity()
    shared = PrometheusSource(fleet.prometheus.url, 10, activity, PASS_SECONDS)
    before = query_api_requests(fleet.prometheus)
    signals = asyncio.run(read_all(shared, scopes, now))
    assert query_api_requests(fleet.prometheus) - before == 3
    assert activity.metrics_queries == Counter({"prometheus_grouped": 3})

    for index, (mine, theirs) in enumerate(zip(signals, reference, strict=True)):
        assert not mine.error and not mine.set_aside, mine
        expected_load, expected_ratio = expected(index if index < OBJECTS else 100)
        assert mine.requests_in_progress_per_replica == expected_load
        assert mine.gpu_memory_used_ratio == pytest.approx(expected_ratio, rel=1e-12)
        assert mine.p99_seconds is not None and 0 < mine.p99_seconds <= BOUNDS[-1]
        assert mine.requests_in_progress_per_replica == theirs.requests_in_progress_per_replica
        assert mine.gpu_memory_used_ratio == pytest.approx(theirs.gpu_memory_used_ratio, rel=1e-12)
        assert mine.p99_seconds == pytest.approx(theirs.p99_seconds, rel=1e-9)
        assert mine.p99_window_seconds == theirs.p99_window_seconds
    per_object.close()
    shared.close()


def test_a_pass_is_shared_by_later_readers_and_the_next_pass_asks_again(fleet: Fleet) -> None:
    activity = Activity()
    source = PrometheusSource(fleet.prometheus.url, 10, activity, PASS_SECONDS)
    now = datetime.now(UTC)

    async def passes() -> list[list[ScalingSignals]]:
        first = await read_all(source, SCOPES[:10], now)
        same_pass = await read_all(source, SCOPES[10:], now + timedelta(seconds=PASS_SECONDS / 2))
        counted = Counter(activity.metrics_queries)
        following = await read_all(source, SCOPES, now + timedelta(seconds=PASS_SECONDS))
        assert counted == Counter({"prometheus_grouped": 3})
        return [first + same_pass, following]

    one, two = asyncio.run(passes())
    assert activity.metrics_queries == Counter({"prometheus_grouped": 6})
    assert [s.requests_in_progress_per_replica for s in one] == [
        expected(i)[0] for i in range(OBJECTS)
    ]
    assert [s.requests_in_progress_per_replica for s in two] == [
        s.requests_in_progress_per_replica for s in one
    ]
    source.close()


def test_an_override_keeps_its_own_query_and_the_rest_stay_shared(fleet: Fleet) -> None:
    doubled = QueryOverrides.model_validate({
        "requestsInProgressPerReplica": "2 * avg(sum by (namespace, pod) ("
        f'{series.REQUESTS_IN_PROGRESS.name}{{namespace="$namespace",pod=~"$pods"}}))'
    })  # fmt: skip
    activity = Activity()
    source = PrometheusSource(fleet.prometheus.url, 10, activity, PASS_SECONDS)
    signals = asyncio.run(read_all(source, SCOPES, datetime.now(UTC), {SCOPES[3]: doubled}))
    assert activity.metrics_queries == Counter({"prometheus_grouped": 3, "prometheus": 1})
    assert signals[3].requests_in_progress_per_replica == 2 * expected(3)[0]
    assert signals[3].gpu_memory_used_ratio == pytest.approx(expected(3)[1], rel=1e-12)
    assert signals[4].requests_in_progress_per_replica == expected(4)[0]
    source.close()


def test_a_failed_grouped_query_is_asked_again_by_the_next_reader() -> None:
    activity = Activity()
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", 5, activity, PASS_SECONDS)
    now = datetime.now(UTC)

    async def two_reads() -> tuple[list[ScalingSignals], list[ScalingSignals]]:
        first = await read_all(source, SCOPES[:5], now)
        return first, await read_all(source, SCOPES[:5], now + timedelta(seconds=1))

    first, second = asyncio.run(two_reads())
    for signals in (*first, *second):
        assert "(shared by every object) failed: cannot connect" in signals.error
        assert signals.requests_in_progress_per_replica is None
    # The five readers of each pass waited on one query per signal; a failure is not kept.
    assert activity.metrics_queries == Counter({"prometheus_grouped": 6})
    source.close()
