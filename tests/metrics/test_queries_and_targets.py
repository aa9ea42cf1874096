"""The pure parts of the metrics source: the pod-name regex, PromQL binding, the direct
read's reductions, where pods are scraped, the shadow window and the source choice.

Covers: the regex of an owner matches every pod name Kubernetes can generate for its
runtime Deployment (long names cut to 58 characters included) and no pod of any other
owner (a property over DNS-label owners up to the API's 52 characters); a windowed or
per-candidate query refuses to bind without its window or digest; the reductions over an
exposition of the runtime's series (rendered from the contract, `contract_exposition`:
sum and max by exact labels, a GPU ratio with a zero total skipped, a p99 of buckets
summed over pods); pod targets from Pod objects
(ready or not, no IP, the port found by name in any container, IPv6); the window covers
the shadow's age plus the margin; the factory prefers the object's Prometheus, then the
operator's, then the direct read.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from contract_exposition import ContractExposition
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeinfer.contract import metric_series as series
from kubeinfer.contract.metric_series import histogram_quantile
from kubeinfer.operator.metrics_sources import queries as q
from kubeinfer.operator.metrics_sources.direct import DirectRead
from kubeinfer.operator.metrics_sources.factory import MetricsSources
from kubeinfer.operator.metrics_sources.pods import PodTarget, metrics_targets
from kubeinfer.operator.metrics_sources.prometheus import PrometheusSource
from kubeinfer.operator.metrics_sources.promql import deployment_pod_regex
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.metrics_sources.samples import parse_exposition, quantile_of
from kubeinfer.operator.metrics_sources.shadow import WINDOW_MARGIN_SECONDS, shadow_window_seconds
from kubeinfer.operator.metrics_sources.source import MetricsUnavailable
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.runtime.engines.gpu_memory import GpuMemory
from prometheus_harness import pod_object

ALPHANUMERIC = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' safe alphabet for generated names
S = f"[{ALPHANUMERIC}]"
LABEL_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-"


@st.composite
def owners(draw: st.DrawFn, min_size: int = 1, max_size: int = 52) -> str:
    """InferenceDeployment names: DNS labels of 1 to 52 characters, every length alike."""
    size = draw(st.integers(min_size, max_size))
    middle = draw(st.text(LABEL_CHARS, min_size=max(0, size - 2), max_size=max(0, size - 2)))
    ends = draw(st.text(LABEL_CHARS[:-1], min_size=min(size, 2), max_size=min(size, 2)))
    return ends[0] + middle + ends[1:]


@st.composite
def owner_and_other(draw: st.DrawFn) -> tuple[str, str]:
    """An owner and another owner, often one whose pod names share a prefix with its own:
    itself extended (`demo-x`, `demo-runtime-x`), or cut short."""
    owner = draw(owners())
    other = draw(
        st.one_of(
            owners(),
            owners(max_size=20).map(lambda tail: f"{owner}-{tail}"[:52].rstrip("-")),
            owners(max_size=20).map(lambda tail: f"{owner}-runtime-{tail}"[:52].rstrip("-")),
            st.just(f"{owner}-runtime"[:52].rstrip("-")),
            st.integers(1, 51).map(lambda n: owner[:n].rstrip("-")),
        )
    )
    return owner, other or "x"


def generated_pod_name(owner: str, template_hash: str, suffix: str) -> str:
    """What Kubernetes names a pod of Deployment `<owner>-runtime`: the ReplicaSet is
    `<deployment>-<hash>`, its pods `generateName` it, cut to 58 characters, + 5."""
    base = f"{owner}-runtime-{template_hash}-"[:58]
    return base + suffix


hashes = st.text(ALPHANUMERIC, min_size=1, max_size=10)
suffixes = st.text(ALPHANUMERIC, min_size=5, max_size=5)


@settings(max_examples=500, deadline=None)
@given(owners=owner_and_other(), template_hash=hashes, suffix=suffixes)
def test_pod_regex_matches_the_owners_pods_and_no_other(
    owners: tuple[str, str], template_hash: str, suffix: str
) -> None:
    owner, other = owners
    regex = re.compile(Scope("ns", owner).pod_regex)  # the RE2 subset Python shares
    assert regex.fullmatch(generated_pod_name(owner, template_hash, suffix))
    if other != owner:
        assert not regex.fullmatch(generated_pod_name(other, template_hash, suffix))


def test_pod_regex_of_a_long_owner_expects_the_cut_name() -> None:
    assert deployment_pod_regex("a" * 52 + "-runtime") == "a" * 52 + f"-runti{S}{{5}}"
    assert deployment_pod_regex("a" * 40 + "-runtime") == (
        "a" * 40 + f"-runtime-(?:{S}{{1,8}}-{S}{{5}}|{S}{{14}})"
    )
    assert deployment_pod_regex("my.model-runtime") == rf"my\.model-runtime-{S}{{1,10}}-{S}{{5}}"


def test_queries_bind_only_with_their_arguments() -> None:
    scope = Scope("ns", "demo")
    with pytest.raises(ValueError, match="needs a window"):
        q.REQUEST_P99.bind(scope)
    with pytest.raises(ValueError, match="needs a candidate_digest"):
        q.SHADOW_COMPARED.bind(scope, window_seconds=60)
    bound = q.SHADOW_DROPPED.bind(scope, window_seconds=90, candidate_digest="sha256:ab")
    assert bound.promql == (
        'sum(max_over_time(kubeinfer_shadow_requests_total{namespace="ns",'
        f'pod=~"demo-runtime-{S}{{1,10}}-{S}{{5}}",outcome="dropped",'
        'candidate_digest="sha256:ab",role="shadow"}[90s]))'
    )
    assert q.QUEUE_DEPTH.bind(scope).promql.startswith("sum(kubeinfer_queue_depth{")
    assert set(q.NAMED_QUERIES) >= {query.name for query in q.SHADOW_QUERIES}


def exposition(model: str, readings: tuple[GpuMemory, ...], latencies: list[float]) -> str:
    pod = ContractExposition(model)
    pod.gpu_memory(readings)
    for seconds in latencies:
        pod.answered(seconds)
    pod.set(series.QUEUE_DEPTH, len(latencies))
    return pod.text()


def test_reductions_over_real_expositions() -> None:
    pods = [
        parse_exposition("a", exposition("m", (GpuMemory(0, "g", 10, 100),), [0.001] * 90)),
        parse_exposition("b", exposition("m", (GpuMemory(0, "g", 5, 0),
                                                GpuMemory(1, "g", 30, 100)), [0.3] * 10)),
    ]  # fmt: skip
    scope = Scope("ns", "demo")
    assert q.QUEUE_DEPTH.bind(scope).reduce(pods) == 100
    assert q.GPU_MEMORY_USED_RATIO.bind(scope).reduce(pods) == pytest.approx(0.3)  # 5/0 skipped
    assert (
        q.SHADOW_COMPARED.bind(scope, window_seconds=1, candidate_digest="x").reduce(pods) is None
    )
    p99 = q.REQUEST_P99.bind(scope, window_seconds=60).reduce(pods)
    # 100 observations: 90 in (0.0005, 0.001], 10 in (0.2, 0.5]; rank 99 is 9/10 into the latter.
    assert p99 == pytest.approx(0.2 + 0.3 * 9 / 10)
    assert p99 == histogram_quantile(
        0.99, [(0.001, 90), (0.2, 90), (0.5, 100), (float("inf"), 100)]
    )
    assert quantile_of(pods, 0.99, "kubeinfer_request_duration_seconds", {"model": "n"}) is None


def ready_pod(name: str, **changes: object) -> dict:
    pod = pod_object(name, 8000)
    pod["status"].update(changes)
    return pod


def test_targets_are_the_ready_pods_http_ports() -> None:
    sidecar_first = pod_object("c", 8000)
    sidecar_first["spec"]["containers"].insert(
        0, {"name": "proxy", "ports": [{"name": "admin", "containerPort": 9901}]}
    )
    pods = [
        ready_pod("b"),
        pod_object("x", 8000, ready=False),
        pod_object("y", 8000, ready=False, ip=None),
        sidecar_first,
        ready_pod("a", podIP="fd00::7"),
    ]
    assert metrics_targets(pods) == [
        PodTarget("a", "http://[fd00::7]:8000/metrics"),
        PodTarget("b", "http://127.0.0.1:8000/metrics"),
        PodTarget("c", "http://127.0.0.1:8000/metrics"),
    ]


def test_a_ready_pod_that_cannot_be_addressed_is_unavailable() -> None:
    with pytest.raises(MetricsUnavailable, match="pod p is ready but has no IP yet"):
        metrics_targets([pod_object("p", 8000, ip=None)])
    unnamed = pod_object("q", 8000)
    unnamed["spec"]["containers"][0]["ports"][0]["name"] = "web"
    with pytest.raises(MetricsUnavailable, match="pod q has no container port named 'http'"):
        metrics_targets([unnamed])


def test_the_window_covers_the_shadow_and_a_margin() -> None:
    started = datetime(2026, 1, 1, tzinfo=UTC)
    assert shadow_window_seconds(started, started) == WINDOW_MARGIN_SECONDS
    later = started + timedelta(seconds=100.2)
    assert shadow_window_seconds(started, later) == 101 + WINDOW_MARGIN_SECONDS


async def test_the_source_is_the_objects_prometheus_then_the_operators_then_the_pods() -> None:
    async def list_pods(namespace: str, selector: str) -> list[dict]:
        return []

    plain = MetricsSources(OperatorSettings(), list_pods)
    with_default = MetricsSources(
        OperatorSettings(metrics={"prometheus_url": "http://prometheus.monitoring:9090"}), list_pods
    )
    own = with_default.for_object("http://mine:9090/")
    assert isinstance(own, PrometheusSource) and own.url == "http://mine:9090"
    default = with_default.for_object(None)
    assert isinstance(default, PrometheusSource)
    assert default.description == "Prometheus at http://prometheus.monitoring:9090"
    direct = plain.for_object(None)
    assert isinstance(direct, DirectRead)
    assert direct.timeout_seconds == OperatorSettings().metrics.timeout_seconds
    # Made once, kept: one session per Prometheus (and one direct reader) per operator.
    assert with_default.for_object("http://mine:9090") is own
    assert with_default.for_object(None) is default and plain.for_object(None) is direct
    await with_default.close()
    await plain.close()
    assert with_default.for_object(None) is not default, "closed sources are not handed out"
