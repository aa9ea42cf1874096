"""`read_shadow_aggregates` on a real shadow: two serving `kubeinfer serve` processes
mirror every answered request (`--mirror-target-file`) to a real candidate serving the
same architecture with other weights, and a real Prometheus scrapes the serving pair.

Covers: every shadow query's PromQL, evaluated by Prometheus over both pods, gives the
same aggregates as the direct read of the same processes (the p99s included: buckets
summed over pods, then one interpolation), and both equal what the runtimes' own
`/v2/shadow` counted, summed over the pods (compared, candidate errors from requests
larger than the candidate's maxBatchSize, top-1 rows and agreements, the largest
difference); a digest with no series is all zeros and None from both sources; a serving
pod replaced mid-shadow (a new process, fresh counters, a new pod name) still counts in
Prometheus (`max_over_time` per series keeps the old pod's figures) and no longer in the
direct read, which sees the live pods only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.operator.metrics_sources.direct import DirectRead
from kubeinfer.operator.metrics_sources.prometheus import PrometheusSource
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.metrics_sources.shadow import read_shadow_aggregates
from kubeinfer.operator.state.shadow_readings import ShadowAggregates
from prometheus_harness import (
    PrometheusServer,
    RuntimeProcess,
    ScrapeTarget,
    http_get,
    infer,
    pod_object,
    running_prometheus,
    start_runtime,
)
from waiting import wait_for

pytestmark = pytest.mark.slow

SCOPE = Scope("shadow", "classifier")
PODS = ("classifier-runtime-6b7c8d9f5-b4b2c", "classifier-runtime-6b7c8d9f5-d7f4f")
REPLACEMENT = "classifier-runtime-6b7c8d9f5-x9z2q"
DIGEST = "sha256:" + "c" * 64
CANDIDATE_MAX_BATCH = 2
REQUESTS = (40, 25)  # per serving pod; every 4th has 3 rows: too many for the candidate
TIMEOUT = 2.0


def rows(i: int) -> int:
    return 3 if i % 4 == 3 else 1 + i % 2


@dataclass
class Shadow:
    """The serving processes (by pod name), the candidate, and how to start another."""

    model: Path
    flags: tuple[str, ...]
    started: datetime
    serving: dict[str, RuntimeProcess] = field(default_factory=dict)
    everything: list[RuntimeProcess] = field(default_factory=list)

    def start(self, pod: str) -> RuntimeProcess:
        process = start_runtime(self.model, "tiny", *self.flags)
        self.everything.append(process)
        self.serving[pod] = process
        return process

    def targets(self) -> list[ScrapeTarget]:
        return [ScrapeTarget(p.address, SCOPE.namespace, pod) for pod, p in self.serving.items()]

    def direct_read(self) -> DirectRead:
        pods = [pod_object(name, p.port) for name, p in self.serving.items()]

        async def list_pods(namespace: str, selector: str) -> list[dict]:
            assert (namespace, selector) == (SCOPE.namespace, SCOPE.label_selector)
            return pods

        return DirectRead(list_pods, TIMEOUT)


@pytest.fixture(scope="module")
def shadow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shadow]:
    directory = tmp_path_factory.mktemp("shadow")
    serving_model = build_tiny_mlp(directory / "serving.onnx", seed=0)
    candidate_model = build_tiny_mlp(directory / "candidate.onnx", seed=1)
    target = directory / "mirror.json"
    flags = ("--intra-op-threads", "1", "--mirror-target-file", str(target),
             "--mirror-poll-interval-milliseconds", "100")  # fmt: skip
    shadow = Shadow(serving_model, flags, datetime.now(UTC))
    try:
        candidate = start_runtime(
            candidate_model, "tiny", "--model-version", "2",
            "--max-batch-size", str(CANDIDATE_MAX_BATCH), "--intra-op-threads", "1",
        )  # fmt: skip
        shadow.everything.append(candidate)
        target.write_text(json.dumps({"target": {
            "url": f"http://{candidate.address}", "modelName": "tiny", "candidateVersion": "2",
            "candidateDigest": DIGEST, "trafficPercent": 100,
        }}))  # fmt: skip
        for pod in PODS:
            shadow.start(pod)
        yield shadow
    finally:
        for process in shadow.everything:
            process.stop()


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, shadow: Shadow
) -> Iterator[PrometheusServer]:
    with running_prometheus(shadow.targets(), tmp_path_factory.mktemp("prometheus")) as server:
        yield server


def shadow_status(process: RuntimeProcess) -> dict:
    status, body = http_get(process.port, "/v2/shadow")
    assert status == 200
    return json.loads(body)


def drive(prometheus: PrometheusServer, load: dict[RuntimeProcess, int]) -> list[dict]:
    """Real load, until every request's mirror is settled and Prometheus has scraped
    after it; returns each loaded process's /v2/shadow."""
    jobs = [(p, i) for p, n in load.items() for i in range(n)]
    with ThreadPoolExecutor(4) as pool:
        statuses = list(
            pool.map(lambda job: infer(job[0].port, "tiny", rows(job[1]), job[1]), jobs)
        )
    assert statuses == [200] * len(jobs)
    figures: list[dict] = []

    def settled() -> bool:
        figures[:] = [shadow_status(p) for p in load]
        return [sum(f["requests"].values()) for f in figures] == list(load.values())

    wait_for(settled, 20, lambda: f"the mirror to settle: {figures}")
    prometheus.wait_for_scrape_after(time.time())
    return figures


@pytest.fixture(scope="module")
def mirrored(prometheus: PrometheusServer, shadow: Shadow) -> list[dict]:
    load = dict(zip(shadow.serving.values(), REQUESTS, strict=True))
    return drive(prometheus, load)


async def read_both(prometheus: PrometheusServer, shadow: Shadow, digest: str = DIGEST):
    now = datetime.now(UTC)
    return (
        await read_shadow_aggregates(
            PrometheusSource(prometheus.url, TIMEOUT), SCOPE, digest, shadow.started, now
        ),
        await read_shadow_aggregates(shadow.direct_read(), SCOPE, digest, shadow.started, now),
    )


async def test_both_sources_read_what_the_runtimes_counted(
    prometheus: PrometheusServer, shadow: Shadow, mirrored: list[dict]
) -> None:
    from_prometheus, direct = await read_both(prometheus, shadow)
    too_large = sum(1 for n in REQUESTS for i in range(n) if rows(i) > CANDIDATE_MAX_BATCH)
    expected = ShadowAggregates(
        compared=sum(f["requests"]["compared"] for f in mirrored),
        mismatches=sum(f["mismatches"] for f in mirrored),
        dropped=sum(f["requests"]["dropped"] for f in mirrored),
        candidate_errors=too_large,
        timeouts=sum(f["requests"]["timeout"] for f in mirrored),
        max_abs_difference=max(f["maxAbsDifference"] for f in mirrored),
        top1_rows=sum(f["top1"]["rows"] for f in mirrored),
        top1_agreements=sum(f["top1"]["agreements"] for f in mirrored),
    )
    assert expected.compared == sum(REQUESTS) - too_large  # nothing dropped or late here
    assert expected.top1_rows > expected.top1_agreements > 0  # other weights: some disagree
    for aggregates in (from_prometheus, direct):
        p99s = aggregates.serving_p99_seconds, aggregates.candidate_p99_seconds
        assert all(p is not None and 0 < p < 1 for p in p99s), p99s
        assert replace(aggregates, serving_p99_seconds=None, candidate_p99_seconds=None) == expected
    assert direct.serving_p99_seconds == pytest.approx(from_prometheus.serving_p99_seconds)
    assert direct.candidate_p99_seconds == pytest.approx(from_prometheus.candidate_p99_seconds)


async def test_a_candidate_without_series_reads_as_nothing_yet(
    prometheus: PrometheusServer, shadow: Shadow, mirrored: list[dict]
) -> None:
    nothing = await read_both(prometheus, shadow, "sha256:" + "d" * 64)
    assert nothing == (ShadowAggregates(), ShadowAggregates())


async def test_a_replaced_pod_still_counts_in_prometheus_only(
    prometheus: PrometheusServer, shadow: Shadow, mirrored: list[dict]
) -> None:
    """Runs last: it replaces the second serving pod."""
    before, _ = await read_both(prometheus, shadow)
    shadow.serving.pop(PODS[1]).stop()
    replacement = shadow.start(REPLACEMENT)
    prometheus.reload(shadow.targets())
    (fresh,) = drive(prometheus, {replacement: 12})
    from_prometheus, direct = await read_both(prometheus, shadow)
    assert fresh["requests"]["compared"] > 0
    assert from_prometheus.compared == before.compared + fresh["requests"]["compared"]
    kept = mirrored[0]["requests"]["compared"]
    assert direct.compared == kept + fresh["requests"]["compared"]
    assert from_prometheus.top1_rows == before.top1_rows + fresh["top1"]["rows"]
