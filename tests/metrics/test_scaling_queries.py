"""The autoscaler's queries, pure: `queue_depth_per_replica` in both forms, the placeholders
of `spec.monitoring.queries` overrides, and which PromQL `scaling_queries` binds.

Covers: the PromQL form sums each pod's queued and in-flight series before averaging
over pods (so the `+` matches per pod, whatever other labels the series carry); the
direct form over real expositions of the runtime's registry is the mean over the pods
that export both metrics; `$namespace`/`${pods}` become the escaped contents of a
double-quoted string, other `$` words stay, `$$` is one `$`; an override replaces the
PromQL and names its field, never the direct read's form; without overrides the built-in
PromQL is bound and the p99 gets its window.
"""

from __future__ import annotations

import pytest
from kubeinfer.operator.api.v1alpha1.inference_deployment import QueryOverrides
from kubeinfer.operator.metrics import queries as q
from kubeinfer.operator.metrics.promql import substitute_placeholders
from kubeinfer.operator.metrics.queries import Scope
from kubeinfer.operator.metrics.samples import PodSamples, parse_exposition
from kubeinfer.operator.metrics.scaling import P99_WINDOW_SECONDS, scaling_queries
from kubeinfer.runtime.metrics import RuntimeMetrics
from prometheus_client import generate_latest

SCOPE = Scope("serving", "demo")


def pod(name: str, queued: int, running: int, *, model: str = "m") -> PodSamples:
    """One pod's scrape of the runtime's own registry, with its batcher's gauges set."""
    metrics = RuntimeMetrics(model, "1")
    metrics.queue_depth(queued)
    metrics.inflight_requests(running)
    return parse_exposition(name, generate_latest(metrics.registry).decode())


def test_queue_depth_per_replica_sums_each_pod_then_averages() -> None:
    selector = SCOPE.promql_labels({})
    assert q.QUEUE_DEPTH_PER_REPLICA.bind(SCOPE).promql == (
        f"avg(sum by (namespace, pod) (kubeinfer_queue_depth{{{selector}}}) + "
        f"sum by (namespace, pod) (kubeinfer_inflight_requests{{{selector}}}))"
    )
    reduce = q.QUEUE_DEPTH_PER_REPLICA.bind(SCOPE).reduce
    assert reduce([pod("a", 3, 1), pod("b", 0, 1), pod("c", 0, 0)]) == pytest.approx(5 / 3)
    assert reduce([]) is None


def test_a_pod_missing_one_series_is_left_out_as_promqls_plus_leaves_it() -> None:
    without_inflight = "\n".join(
        line
        for line in generate_latest(RuntimeMetrics("m", "1").registry).decode().splitlines()
        if "kubeinfer_inflight_requests" not in line
    )
    old = parse_exposition("old", without_inflight + "\n")
    reduce = q.QUEUE_DEPTH_PER_REPLICA.bind(SCOPE).reduce
    assert reduce([pod("a", 2, 2), old]) == 4
    assert reduce([old]) is None


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ('x{namespace="$namespace",pod=~"$pods"}', 'x{namespace="a\\"b\\\\c",pod=~"p\\\\.q"}'),
        ('x{pod=~"${pods}"}', 'x{pod=~"p\\\\.q"}'),
        ("$podsx $other $$pods", "$podsx $other $pods"),
    ],
)
def test_placeholders_become_escaped_string_contents(template: str, expected: str) -> None:
    assert substitute_placeholders(template, namespace='a"b\\c', pods="p\\.q") == expected


def test_overrides_replace_the_promql_and_name_their_field() -> None:
    overrides = QueryOverrides(
        queue_depth_per_replica='2 * avg(kubeinfer_queue_depth{pod=~"$pods"})',
        gpu_memory_used_ratio='max(my_ratio{namespace="$namespace"})',
    )
    depth, gpu, p99 = scaling_queries(SCOPE, overrides)
    assert depth.promql == f'2 * avg(kubeinfer_queue_depth{{pod=~"{SCOPE.pod_regex}"}})'
    assert depth.overridden_by == "spec.monitoring.queries.queueDepthPerReplica"
    assert depth.label == (
        "queue_depth_per_replica (PromQL of spec.monitoring.queries.queueDepthPerReplica)"
    )
    assert gpu.promql == 'max(my_ratio{namespace="serving"})'
    assert gpu.overridden_by == "spec.monitoring.queries.gpuMemoryUsedRatio"
    assert (p99.name, p99.overridden_by) == ("request_p99_seconds", "")
    # The direct read's form is the built-in one.
    pods = [pod("a", 3, 1), pod("b", 0, 1)]
    assert depth.reduce(pods) == q.QUEUE_DEPTH_PER_REPLICA.bind(SCOPE).reduce(pods) == 2.5


def test_without_overrides_the_built_in_queries_are_bound() -> None:
    bound = scaling_queries(SCOPE, QueryOverrides(), p99_window_seconds=45)
    assert bound == [
        q.QUEUE_DEPTH_PER_REPLICA.bind(SCOPE),
        q.GPU_MEMORY_USED_RATIO.bind(SCOPE),
        q.REQUEST_P99.bind(SCOPE, window_seconds=45),
    ]
    assert all(query.overridden_by == "" for query in bound)
    assert f"[{P99_WINDOW_SECONDS}s]" in scaling_queries(SCOPE, QueryOverrides())[2].promql
