"""The autoscaler's queries, pure: `requests_in_progress_per_replica` in both forms, the
placeholders of `spec.monitoring.queries` overrides, and which PromQL `scaling_queries` binds.

Covers: the PromQL form sums each pod's `kubeinfer_requests_in_progress` series before
averaging over pods (so a pod counts once, whatever other labels its series carry); the
direct form over expositions of the runtime's series (rendered from the contract:
`contract_exposition`) is the same mean over the pods, and reads neither of the
scheduler's gauges; a pod without the series (a
runtime from before it) is left out of the mean as PromQL's `avg` leaves it out;
`$namespace`/`${pods}` become the escaped contents of a double-quoted string, other `$`
words stay, `$$` is one `$`; an override replaces the PromQL and names its field, never
the direct read's form; without overrides the built-in PromQL is bound and the p99 gets
its window.
"""

from __future__ import annotations

import pytest
from contract_exposition import ContractExposition
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.api.v1alpha1.inference_deployment import QueryOverrides
from kubeinfer.operator.metrics_sources import queries as q
from kubeinfer.operator.metrics_sources.promql import substitute_placeholders
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.metrics_sources.samples import PodSamples, parse_exposition
from kubeinfer.operator.metrics_sources.scaling import (
    P99_WINDOW_SECONDS,
    checked_signals,
    scaling_queries,
)

SCOPE = Scope("serving", "demo")


def exposition(
    in_progress: int, *, answered: int = 0, queued: int = 0, running: int = 0, model: str = "m"
) -> str:
    """A scrape of a runtime after `in_progress + answered` requests started and
    `answered` of them finished; the scheduler's gauges at `queued`/`running`."""
    pod = ContractExposition(model)
    pod.set(series.REQUESTS_IN_PROGRESS, in_progress)
    for _ in range(answered):
        pod.answered(0.001)
    pod.set(series.QUEUE_DEPTH, queued)
    pod.set(series.INFLIGHT_REQUESTS, running)
    return pod.text()


def pod(name: str, in_progress: int, **batcher: int) -> PodSamples:
    return parse_exposition(name, exposition(in_progress, **batcher))


def test_requests_in_progress_per_replica_sums_each_pod_then_averages() -> None:
    selector = SCOPE.promql_labels({})
    assert q.REQUESTS_IN_PROGRESS_PER_REPLICA.bind(SCOPE).promql == (
        f"avg(sum by (namespace, pod) (kubeinfer_requests_in_progress{{{selector}}}))"
    )
    reduce = q.REQUESTS_IN_PROGRESS_PER_REPLICA.bind(SCOPE).reduce
    # The batcher's gauges see only part of what is in progress (none of what runs inline
    # or waits on the event loop); the signal reads the in-progress gauge alone.
    busy = pod("a", 4, answered=2, queued=1, running=1)
    assert reduce([busy, pod("b", 1), pod("c", 0, answered=5)]) == pytest.approx(5 / 3)
    assert reduce([]) is None


def test_a_pods_series_are_summed_before_the_mean_over_pods() -> None:
    """Two series in one pod (other label values) are one pod of their sum, not two."""
    two = PodSamples("two", pod("two", 2).samples + pod("two", 1, model="n").samples)
    reduce = q.REQUESTS_IN_PROGRESS_PER_REPLICA.bind(SCOPE).reduce
    assert reduce([two, pod("one", 1)]) == 2  # (2 + 1 + 1) / 2 pods


def test_a_pod_without_the_series_is_left_out_as_promqls_avg_leaves_it() -> None:
    """A runtime from before `kubeinfer_requests_in_progress` (a rollout in progress)."""
    without = "\n".join(
        line for line in exposition(0).splitlines() if "kubeinfer_requests_in_progress" not in line
    )
    old = parse_exposition("old", without + "\n")
    assert old.samples  # its other series are there
    reduce = q.REQUESTS_IN_PROGRESS_PER_REPLICA.bind(SCOPE).reduce
    assert reduce([pod("a", 4), old]) == 4
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
        requests_in_progress_per_replica='2 * avg(kubeinfer_requests_in_progress{pod=~"$pods"})',
        gpu_memory_used_ratio='max(my_ratio{namespace="$namespace"})',
    )
    depth, gpu, p99 = scaling_queries(SCOPE, overrides)
    assert depth.promql == f'2 * avg(kubeinfer_requests_in_progress{{pod=~"{SCOPE.pod_regex}"}})'
    assert depth.overridden_by == "spec.monitoring.queries.requestsInProgressPerReplica"
    assert depth.label == (
        "requests_in_progress_per_replica "
        "(PromQL of spec.monitoring.queries.requestsInProgressPerReplica)"
    )
    assert gpu.promql == 'max(my_ratio{namespace="serving"})'
    assert gpu.overridden_by == "spec.monitoring.queries.gpuMemoryUsedRatio"
    assert (p99.name, p99.overridden_by) == ("request_p99_seconds", "")
    # The direct read's form is the built-in one.
    pods = [pod("a", 4), pod("b", 1)]
    assert depth.reduce(pods) == q.REQUESTS_IN_PROGRESS_PER_REPLICA.bind(SCOPE).reduce(pods) == 2.5


def test_without_overrides_the_built_in_queries_are_bound() -> None:
    bound = scaling_queries(SCOPE, QueryOverrides(), p99_window_seconds=45)
    assert bound == [
        q.REQUESTS_IN_PROGRESS_PER_REPLICA.bind(SCOPE),
        q.GPU_MEMORY_USED_RATIO.bind(SCOPE),
        q.REQUEST_P99.bind(SCOPE, window_seconds=45),
    ]
    assert all(query.overridden_by == "" for query in bound)
    assert f"[{P99_WINDOW_SECONDS}s]" in scaling_queries(SCOPE, QueryOverrides())[2].promql


@pytest.mark.parametrize(
    ("readings", "kept", "said"),
    [
        ((2.0, 0.5, 0.1), (2.0, 0.5, 0.1), []),
        ((2.0, 40.0, 0.1), (2.0, None, 0.1), ["GPU memory used ratio of 40, which must be 0..1"]),
        ((-1.0, 0.5, 0.1), (None, 0.5, 0.1), ["requests in progress per replica of -1"]),
        (
            (float("inf"), None, None),
            (None, None, None),
            ["requests in progress per replica of inf"],
        ),
        ((1.0, float("nan"), -0.5), (1.0, None, None), ["ratio of nan", "(seconds) of -0.5"]),
        ((None, None, None), (None, None, None), []),
    ],
    ids=["sane", "ratio-above-one", "negative-depth", "infinite", "nan-and-negative", "unread"],
)
def test_readings_outside_their_range_are_set_aside_and_said(
    readings: tuple, kept: tuple, said: list[str]
) -> None:
    signals = checked_signals(*readings, "Prometheus at http://p:9090")
    assert (signals.requests_in_progress_per_replica, signals.gpu_memory_used_ratio,
            signals.p99_seconds) == kept  # fmt: skip
    assert len(signals.set_aside) == len(said)
    for note, words in zip(signals.set_aside, said, strict=True):
        assert words in note and note.startswith("Prometheus at http://p:9090 gave")
    assert signals.error == ""
