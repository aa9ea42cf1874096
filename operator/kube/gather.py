"""One reconcile pass's whole gather step: the children (`children.read_children`), then
exactly the signals the decision reads beyond them, as `reconcile.reads` declares them
for those children, so the decisions get one complete `ObservedState`.

A running shadow's aggregates, the load and the quality watch's tallies come from the
metrics source the controller owns (Prometheus, or the pods' own /metrics); the runtime
pods (serving and shadow candidate) are listed from the API, for their container
statuses (where a runtime that cannot start says why) and for the autoscaler's count;
the GPU nodes come from the controller's one list of them; the PodMonitor is read where
the cluster serves PodMonitors. Which candidate's aggregates are read comes from the
object's own stored status, read in the same GET as its spec. Nothing is read that the
declaration does not name.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.kube.cache import Lister
from kubeinfer.operator.kube.children import read_children, read_pod_monitor
from kubeinfer.operator.kube.client import POD, KubeObject
from kubeinfer.operator.kube.cost_reads import CostInputs, read_cost
from kubeinfer.operator.metrics_sources.direct import ListPods
from kubeinfer.operator.metrics_sources.factory import MetricsSources
from kubeinfer.operator.metrics_sources.quality import read_quality_tallies
from kubeinfer.operator.metrics_sources.queries import Scope
from kubeinfer.operator.metrics_sources.scaling import read_scaling_signals
from kubeinfer.operator.metrics_sources.shadow import read_shadow_aggregates
from kubeinfer.operator.metrics_sources.source import MetricsSource, MetricsUnavailable
from kubeinfer.operator.metrics_sources.wake import read_wake_signals
from kubeinfer.operator.reconcile.reads import Reads, runtime_deployments, signals_to_read
from kubeinfer.operator.rollout.shadow import ShadowQuery
from kubeinfer.operator.state import names
from kubeinfer.operator.state.activator_view import ActivatorView
from kubeinfer.operator.state.gpu_nodes import GpuNode
from kubeinfer.operator.state.known_answers import AnswerReadings
from kubeinfer.operator.state.observed import ObservedState
from kubeinfer.operator.state.quality_readings import QualityHistory
from kubeinfer.operator.state.scaling_inputs import ScalingHistory, ServingPods
from kubeinfer.operator.state.serving_pods import serving_pods
from kubeinfer.operator.state.shadow_readings import ShadowReading

logger = logging.getLogger(__name__)


def pods_lister(client: Lister) -> ListPods:
    """The direct metrics read's `ListPods`, over the operator's API client."""

    async def list_pods(namespace: str, label_selector: str) -> Sequence[Mapping[str, Any]]:
        return await client.list(POD, namespace, label_selector)

    return list_pods


async def gather(
    client: Lister,
    sources: MetricsSources,
    body: dict[str, Any],
    spec: InferenceDeploymentSpec,
    history: ScalingHistory,
    pod_monitors: bool,
    now: datetime,
    quality_history: QualityHistory | None = None,
    gpu_nodes: Callable[[], Awaitable[tuple[GpuNode, ...]]] | None = None,
    answers: Callable[[], Awaitable[AnswerReadings]] | None = None,
    cost: CostInputs | None = None,
    activator: Callable[[], Awaitable[ActivatorView]] | None = None,
) -> ObservedState:
    """Everything one pass decides from, for the InferenceDeployment in `body` (whose
    `spec` is already parsed): its children, then what `signals_to_read` names of the
    shadow's aggregates, the pods, the load and the autoscaler's `history`, the quality
    watch's window (with the direct read's `quality_history`, returned updated in the
    observed state), the GPU nodes (`gpu_nodes`), the serving pods' known answers
    (`answers`: the controller's, which keeps their schedule), with minReplicas 0 the
    wake signals (the activator's view from `activator`, shared by all passes) and the PodMonitor
    (`pod_monitors`: the cluster serves them and the settings allow them), and where the
    settings price nodes the cost's reads (`cost`: its settings, the shared node list and
    the window's memory, returned updated in the observed state). Every read of
    objects goes through
    `client`: the API, or the operator's cache of its watches."""
    children = await read_children(client, body, spec)
    cost_settings = cost.settings if cost is not None else None
    observed = replace(children, pod_monitors_available=pod_monitors, cost_settings=cost_settings)
    wanted = signals_to_read(observed, now)
    owner = observed.owner
    source = sources.for_object(spec.monitoring.prometheus.url)
    scope = Scope(owner.namespace, owner.name)
    update: dict[str, object] = {}
    if wanted.shadow is not None:
        update["shadow"] = await _read_shadow(source, scope, wanted.shadow, now)
    update.update(await _read_pods(client, observed, wanted, now))
    if wanted.serving_pods:
        update["scaling_history"] = history
    if wanted.scaling_signals:
        update["scaling_signals"] = await read_scaling_signals(
            source, scope, spec.monitoring.queries, now
        )
    if wanted.wake_signals:
        counted = update.get("serving_pods")
        at_zero = isinstance(counted, ServingPods) and counted.desired == 0
        view = await activator() if activator is not None else ActivatorView(error="not read")
        route = (owner.namespace, names.service_name(owner.name))
        update["wake_signals"] = await read_wake_signals(
            source, scope, spec.autoscaling, at_zero, view, route, now
        )
    if wanted.quality is not None:
        window = wanted.quality
        update["quality"], update["quality_history"] = await read_quality_tallies(
            source, scope, window.reference_digest, window.seconds, now,
            quality_history or QualityHistory(),
        )  # fmt: skip
    if wanted.gpu_nodes and gpu_nodes is not None:
        update["gpu_nodes"] = await gpu_nodes()
    if wanted.answers and answers is not None:
        update["answers"] = await answers()
    if wanted.cost is not None and cost is not None:
        update.update(await read_cost(client, source, observed, wanted.cost, cost, now))
    if wanted.pod_monitor:
        update["pod_monitor"] = await read_pod_monitor(client, owner)
    return replace(observed, **update)  # type: ignore[arg-type]


async def _read_pods(
    client: Lister, observed: ObservedState, wanted: Reads, now: datetime
) -> dict[str, object]:
    """The runtime pods and the candidate's as `wanted` asks, and the serving pods counted
    from the runtime ones (on a mixed fleet, against what its Deployments ask)."""
    owner = observed.owner
    update: dict[str, object] = {}
    pods: list[KubeObject] = []
    if wanted.runtime_pods:
        selector = names.selector_string(names.runtime_selector(owner.name))
        pods = await client.list(POD, owner.namespace, selector)
        update["runtime_pods"] = _by_name(pods)
    if wanted.candidate_pods:
        selector = names.selector_string(names.candidate_selector(owner.name))
        update["candidate_pods"] = _by_name(await client.list(POD, owner.namespace, selector))
    if wanted.serving_pods:
        counted = serving_pods(pods, observed.deployment, now)
        if observed.deployment is None:  # a fleet's pods: what its Deployments ask
            runtimes = runtime_deployments(observed)
            asked = sum(int((d.get("spec") or {}).get("replicas") or 0) for d in runtimes)
            counted = replace(counted, desired=asked)
        update["serving_pods"] = counted
    return update


def _by_name(pods: list[KubeObject]) -> tuple[KubeObject, ...]:
    return tuple(sorted(pods, key=lambda pod: pod["metadata"]["name"]))


async def _read_shadow(
    source: MetricsSource, scope: Scope, query: ShadowQuery, now: datetime
) -> ShadowReading:
    """The running candidate's aggregates; a source that cannot answer is a reading with
    the reason, which the verdict waits on."""
    try:
        aggregates = await read_shadow_aggregates(
            source, scope, query.candidate_digest, query.started, now
        )
    except MetricsUnavailable as error:
        logger.info(
            "Shadow metrics unavailable: InferenceDeployment=%s/%s error=%s",
            scope.namespace, scope.owner, error,
        )  # fmt: skip
        return ShadowReading(None, f"{source.description}: {error}")
    return ShadowReading(aggregates)
