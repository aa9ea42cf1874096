"""`read_quality_tallies` on a real Prometheus and the direct read of the same exporters:
small `prometheus_client` servers on loopback, one per serving pod, export the mirror's
quality series (role `quality`) with counts the test sets between scrapes, beside series
of a shadow and of another reference that must not count.

Covers: over one window, both sources give the same tallies, overall (rows, agreements,
the mean difference and KL divergence), per reference class and per slice, for a pod
that counted before the window and during it, a class and a slice first seen inside it,
a pod restarted inside it (its counters went down: it counts from zero), a pod new
inside it (all its counts), a pod gone inside it (its counts until it left), and a class
whose count is NaN (set aside with a sentence by both); a source that cannot answer
gives its reason and keeps the history.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.metrics_sources.direct import DirectRead
from kubeinfer.operator.metrics_sources.prometheus import PrometheusSource
from kubeinfer.operator.metrics_sources.quality import read_quality_tallies
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.state.quality_readings import (
    AgreementTally,
    QualityHistory,
    QualityReading,
    WindowTallies,
)
from ports import free_port
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_harness import (
    PrometheusServer,
    ScrapeTarget,
    pod_object,
    running_prometheus,
)

pytestmark = pytest.mark.slow

SCOPE = Scope("quality", "clf")
DIGEST = "sha256:" + "f" * 64
OTHER_DIGEST = "sha256:" + "e" * 64
A, B, C, D = (f"clf-runtime-6b7c8d9f5-{suffix}" for suffix in ("b4b2c", "d7f4f", "x9z2q", "k8m2n"))
WINDOW = 20
QUIET_SECONDS = 2.0
"""Nothing changes for this long after the first read: the window starts in there."""
TIMEOUT = 2.0
CLASS_FAMILIES = (series.SHADOW_CLASS_TOP1_ROWS, series.SHADOW_CLASS_TOP1_AGREEMENTS)
SLICE_FAMILIES = (series.SHADOW_SLICE_TOP1_ROWS, series.SHADOW_SLICE_TOP1_AGREEMENTS)


@dataclass
class Counts:
    """One mirror target's cumulative counters on one pod. Sums are dyadic fractions, so
    both sources' arithmetic is exact and the tallies compare equal."""

    rows: float = 0
    agreements: float = 0
    difference: tuple[float, float] = (0.0, 0)
    """(sum, requests) of the per-request largest |difference|."""
    kl: tuple[float, float] = (0.0, 0)
    classes: dict[str, tuple[float, float]] = field(default_factory=dict)
    slices: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(eq=False)  # a collector is registered by identity
class FakePod:
    """A pod's /metrics: its counts for the watch's reference, a shadow's and another
    reference's (which must never count), served on a loopback port."""

    name: str
    quality: Counts
    noise: Counts = field(
        default_factory=lambda: Counts(
            1000, 0, (64.0, 1), (8.0, 1), {"cat": (500, 0)}, {"eu": (500, 0)}
        )
    )
    port: int = 0
    _server: object = None

    def collect(self) -> Iterable[Metric]:
        targets = (
            (DIGEST, "quality", self.quality),
            (DIGEST, "shadow", self.noise),
            (OTHER_DIGEST, "quality", self.noise),
        )
        rows = CounterMetricFamily(series.SHADOW_TOP1_ROWS.name, "", labels=series.SHADOW_LABELS)
        agreements = CounterMetricFamily(
            series.SHADOW_TOP1_AGREEMENTS.name, "", labels=series.SHADOW_LABELS
        )
        difference = HistogramMetricFamily(
            series.SHADOW_ABS_DIFFERENCE.name, "", labels=series.SHADOW_LABELS
        )
        kl = HistogramMetricFamily(
            series.SHADOW_KL_DIVERGENCE.name, "", labels=series.SHADOW_LABELS
        )
        by = {}
        for family, label in ((series.SHADOW_CLASS_TOP1_ROWS, "reference_class"),
                              (series.SHADOW_CLASS_TOP1_AGREEMENTS, "reference_class"),
                              (series.SHADOW_SLICE_TOP1_ROWS, "slice"),
                              (series.SHADOW_SLICE_TOP1_AGREEMENTS, "slice")):  # fmt: skip
            by[family.name] = CounterMetricFamily(
                family.name, "", labels=(*series.SHADOW_LABELS, label)
            )
        for digest, role, counts in targets:
            labels = ["clf", "1", "1", digest, role]
            rows.add_metric(labels, counts.rows)
            agreements.add_metric(labels, counts.agreements)
            difference.add_metric(
                labels, [("+Inf", counts.difference[1])], sum_value=counts.difference[0]
            )
            kl.add_metric(labels, [("+Inf", counts.kl[1])], sum_value=counts.kl[0])
            for groups, (rows_family, agreements_family) in (
                (counts.classes, CLASS_FAMILIES), (counts.slices, SLICE_FAMILIES),
            ):  # fmt: skip
                for name, (group_rows, group_agreements) in groups.items():
                    by[rows_family.name].add_metric([*labels, name], group_rows)
                    by[agreements_family.name].add_metric([*labels, name], group_agreements)
        return [rows, agreements, difference, kl, *by.values()]

    def start(self) -> FakePod:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self.port = free_port()
        self._server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def target(self) -> ScrapeTarget:
        return ScrapeTarget(f"127.0.0.1:{self.port}", SCOPE.namespace, self.name)


@dataclass
class Cluster:
    """The pods as the API lists them and Prometheus scrapes them."""

    pods: dict[str, FakePod]

    async def list_pods(self, namespace: str, selector: str) -> list[dict]:
        assert (namespace, selector) == (SCOPE.namespace, SCOPE.label_selector)
        return [pod_object(name, pod.port) for name, pod in self.pods.items()]

    def targets(self) -> list[ScrapeTarget]:
        return [pod.target for pod in self.pods.values()]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    pods = {
        A: Counts(100, 90, (2.0, 50), (1.0, 50), {"cat": (60, 55)},
                  {"eu": (70, 62), "other": (30, 28)}),
        B: Counts(40, 30, (1.0, 20), (0.5, 20), {"cat": (40, 30)}, {"eu": (40, 30)}),
        D: Counts(10, 10, (0.5, 5), (0.0, 5), {"cat": (10, 10)}, {"other": (10, 10)}),
    }  # fmt: skip
    cluster = Cluster({name: FakePod(name, counts).start() for name, counts in pods.items()})
    try:
        yield cluster
    finally:
        for pod in cluster.pods.values():
            pod.stop()


@pytest.fixture
def prometheus(tmp_path: Path, cluster: Cluster) -> Iterator[PrometheusServer]:
    with running_prometheus(cluster.targets(), tmp_path) as server:
        yield server


def wait_until(moment: datetime) -> None:
    # not a wait: the tally window's time passes
    time.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()))


async def test_both_sources_tally_the_same_window(
    prometheus: PrometheusServer, cluster: Cluster
) -> None:
    prometheus.wait_for_scrape_after(time.time())
    direct = DirectRead(cluster.list_pods, TIMEOUT)
    history = QualityHistory()
    first = datetime.now(UTC)
    _, history = await read_quality_tallies(direct, SCOPE, DIGEST, WINDOW, first, history)
    wait_until(first + timedelta(seconds=QUIET_SECONDS))
    changed = time.time()

    # A pod that leaves inside the window: its counts until it left are read, then it goes.
    gone = cluster.pods[D]
    gone.quality = Counts(16, 13, (0.75, 8), (0.25, 8), {"cat": (16, 13)}, {"other": (16, 13)})
    prometheus.wait_for_scrape_after(time.time())
    _, history = await read_quality_tallies(
        direct, SCOPE, DIGEST, WINDOW, datetime.now(UTC), history
    )
    del cluster.pods[D]
    gone.stop()

    # A counts on, with a class and a slice new inside the window; B restarted; C is new.
    cluster.pods[A].quality = Counts(
        130, 110, (3.5, 64), (1.5, 64), {"cat": (70, 62), "dog": (20, 13)},
        {"eu": (90, 77), "other": (40, 33)},
    )  # fmt: skip
    cluster.pods[B].quality = Counts(
        12, 9, (0.25, 6), (0.125, 6), {"cat": (12, 9)}, {"eu": (12, 9)}
    )
    new = Counts(
        8, 8, (0.125, 4), (0.0625, 4), {"cat": (8, 8), "bad": (float("nan"), 0)}, {"us": (8, 8)}
    )
    cluster.pods[C] = FakePod(C, new).start()
    prometheus.reload(cluster.targets())
    prometheus.wait_for_scrape_after(time.time(), timeout=30)
    settled = time.time()

    wait_until(first + timedelta(seconds=WINDOW))
    now = datetime.now(UTC)
    start = now.timestamp() - WINDOW
    assert first.timestamp() <= start < changed - 0.3, "the window must start while nothing changed"
    assert settled < now.timestamp()
    from_prometheus, _ = await read_quality_tallies(
        PrometheusSource(prometheus.url, TIMEOUT), SCOPE, DIGEST, WINDOW, now, QualityHistory()
    )
    direct_reading, history = await read_quality_tallies(
        direct, SCOPE, DIGEST, WINDOW, now, history
    )
    await direct.close()

    # A grew 30/20, B counts 12/9 since its restart, C all of its 8/8, D grew 6/3 and left.
    rows, requests = 30 + 12 + 8 + 6, 14 + 6 + 4 + 3
    expected = WindowTallies(
        AgreementTally(
            rows, 20 + 9 + 8 + 3,
            absolute_difference_sum=(1.5 + 0.25 + 0.125 + 0.25) / requests * rows,
            kl_divergence_sum=(0.5 + 0.125 + 0.0625 + 0.25) / requests * rows,
        ),
        {"cat": AgreementTally(10 + 12 + 8 + 6, 7 + 9 + 8 + 3), "dog": AgreementTally(20, 13)},
        {"eu": AgreementTally(20 + 12, 15 + 9), "other": AgreementTally(10 + 6, 5 + 3),
         "us": AgreementTally(8, 8)},
    )  # fmt: skip
    for reading in (from_prometheus, direct_reading):
        assert reading.error == ""
        assert reading.window == expected
        assert len(reading.set_aside) == 1
        assert "class 'bad'" in reading.set_aside[0] and "nan rows" in reading.set_aside[0]
    assert from_prometheus.covered_seconds == WINDOW
    assert WINDOW <= (direct_reading.covered_seconds or 0) < WINDOW + QUIET_SECONDS


async def test_a_source_that_cannot_answer_keeps_the_history() -> None:
    history = QualityHistory(DIGEST)
    silent = PrometheusSource(f"http://127.0.0.1:{free_port()}", TIMEOUT)
    reading, kept = await read_quality_tallies(
        silent, SCOPE, DIGEST, WINDOW, datetime.now(UTC), history
    )
    silent.close()
    assert kept is history
    assert reading.window is None
    assert reading.error.startswith(f"Prometheus at {silent.url}: query quality_")
    assert "cannot connect" in reading.error
    assert reading == QualityReading(error=reading.error)
    assert asyncio.iscoroutinefunction(read_quality_tallies)
