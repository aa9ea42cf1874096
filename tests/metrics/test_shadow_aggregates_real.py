"""`read_shadow_aggregates` on a real shadow: two serving `kubeinfer serve` processes
mirror every answered request (`--mirror-target-file`) to a real candidate serving the
same architecture with other weights, and a real Prometheus scrapes the serving pair.

Covers: every shadow query's PromQL, evaluated by Prometheus over both pods, gives the
same aggregates as the direct read of the same processes (the p99s included: buckets
summed over pods, then one interpolation), and both equal what the runtimes' own
`/v2/shadow` counted, summed over the pods (compared, candidate errors from requests
larger than the candidate's maxBatchSize, top-1 rows and agreements, the largest
difference); a digest with no series is all zeros and None from both sources.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from kubeinfer.operator.metrics.direct import DirectRead
from kubeinfer.operator.metrics.prometheus import PrometheusSource
from kubeinfer.operator.metrics.queries import Scope
from kubeinfer.operator.metrics.shadow import read_shadow_aggregates
from kubeinfer.operator.rollout.aggregates import ShadowAggregates
from kubeinfer.runtime.demo_models import build_tiny_mlp
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

pytestmark = pytest.mark.slow

SCOPE = Scope("shadow", "classifier")
PODS = ("classifier-runtime-6b7c8d9f5-b4b2c", "classifier-runtime-6b7c8d9f5-d7f4f")
DIGEST = "sha256:" + "c" * 64
CANDIDATE_MAX_BATCH = 2
REQUESTS = (40, 25)  # per serving pod; every 4th has 3 rows: too many for the candidate
TIMEOUT = 2.0


def rows(i: int) -> int:
    return 3 if i % 4 == 3 else 1 + i % 2


@pytest.fixture(scope="module")
def shadow(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[RuntimeProcess], datetime]]:
    directory = tmp_path_factory.mktemp("shadow")
    serving_model = build_tiny_mlp(directory / "serving.onnx", seed=0)
    candidate_model = build_tiny_mlp(directory / "candidate.onnx", seed=1)
    started = datetime.now(UTC)
    processes: list[RuntimeProcess] = []
    try:
        candidate = start_runtime(
            candidate_model, "tiny", "--model-version", "2",
            "--max-batch-size", str(CANDIDATE_MAX_BATCH), "--intra-op-threads", "1",
        )  # fmt: skip
        processes.append(candidate)
        target = directory / "mirror.json"
        target.write_text(json.dumps({"target": {
            "url": f"http://{candidate.address}", "modelName": "tiny", "candidateVersion": "2",
            "candidateDigest": DIGEST, "trafficPercent": 100,
        }}))  # fmt: skip
        flags = ("--intra-op-threads", "1", "--mirror-target-file", str(target),
                 "--mirror-poll-interval-milliseconds", "100")  # fmt: skip
        serving = [start_runtime(serving_model, "tiny", *flags) for _ in PODS]
        processes.extend(serving)
        yield serving, started
    finally:
        for process in processes:
            process.stop()


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, shadow: tuple[list[RuntimeProcess], datetime]
) -> Iterator[PrometheusServer]:
    serving, _ = shadow
    targets = [
        ScrapeTarget(process.address, SCOPE.namespace, pod)
        for process, pod in zip(serving, PODS, strict=True)
    ]
    with running_prometheus(targets, tmp_path_factory.mktemp("prometheus")) as server:
        yield server


def shadow_status(process: RuntimeProcess) -> dict:
    status, body = http_get(process.port, "/v2/shadow")
    assert status == 200
    return json.loads(body)


@pytest.fixture(scope="module")
def mirrored(
    prometheus: PrometheusServer, shadow: tuple[list[RuntimeProcess], datetime]
) -> list[dict]:
    """Real load on both serving pods, until every request's mirror is settled and
    Prometheus has scraped after it; returns each pod's /v2/shadow."""
    serving, _ = shadow
    jobs = [(p, i) for p, n in zip(serving, REQUESTS, strict=True) for i in range(n)]
    with ThreadPoolExecutor(4) as pool:
        statuses = list(
            pool.map(lambda job: infer(job[0].port, "tiny", rows(job[1]), job[1]), jobs)
        )
    assert statuses == [200] * len(jobs)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        figures = [shadow_status(p) for p in serving]
        if [sum(f["requests"].values()) for f in figures] == list(REQUESTS):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"mirror did not settle: {figures}")
    prometheus.wait_for_scrape_after(time.time())
    return figures


def direct_read(serving: list[RuntimeProcess]) -> DirectRead:
    pods = [pod_object(name, p.port) for name, p in zip(PODS, serving, strict=True)]

    async def list_pods(namespace: str, selector: str) -> list[dict]:
        assert (namespace, selector) == (SCOPE.namespace, SCOPE.label_selector)
        return pods

    return DirectRead(list_pods, TIMEOUT)


async def test_both_sources_read_what_the_runtimes_counted(
    prometheus: PrometheusServer,
    shadow: tuple[list[RuntimeProcess], datetime],
    mirrored: list[dict],
) -> None:
    serving, started = shadow
    now = datetime.now(UTC)
    from_prometheus = await read_shadow_aggregates(
        PrometheusSource(prometheus.url, TIMEOUT), SCOPE, DIGEST, started, now
    )
    direct = await read_shadow_aggregates(direct_read(serving), SCOPE, DIGEST, started, now)

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
        p99s = aggregates.primary_p99_seconds, aggregates.candidate_p99_seconds
        assert all(p is not None and 0 < p < 1 for p in p99s), p99s
        assert replace(aggregates, primary_p99_seconds=None, candidate_p99_seconds=None) == expected
    assert direct.primary_p99_seconds == pytest.approx(from_prometheus.primary_p99_seconds)
    assert direct.candidate_p99_seconds == pytest.approx(from_prometheus.candidate_p99_seconds)


async def test_a_candidate_without_series_reads_as_nothing_yet(
    prometheus: PrometheusServer,
    shadow: tuple[list[RuntimeProcess], datetime],
    mirrored: list[dict],
) -> None:
    serving, started = shadow
    now = datetime.now(UTC)
    other = "sha256:" + "d" * 64
    for source in (PrometheusSource(prometheus.url, TIMEOUT), direct_read(serving)):
        assert (
            await read_shadow_aggregates(source, SCOPE, other, started, now) == ShadowAggregates()
        )
