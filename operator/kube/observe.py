"""One reconcile pass's whole gather step: the children (`gather.gather_children`), then
what the pure decisions need beyond the objects themselves, so the decisions get one
complete `ObservedState`. A running shadow's aggregates and an autoscaled object's load
come from the metrics source the reconciler owns (Prometheus, or the pods' own
/metrics); the serving pods are counted from the API; the runtime pods (serving and
shadow candidate) are listed for their container statuses, where a runtime that cannot
start says why; the PodMonitor is read where the cluster serves PodMonitors. Which
candidate's aggregates are read comes from the object's own stored status, read in the
same GET as its spec.

Nothing is read that the decision will not use: an object without a shadow, without
autoscaling, without PodMonitors and whose Deployments are settled (every pod updated
and ready) costs no extra request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.api.v1alpha1.gpu_fleet import in_fleet_mode
from kubeinfer.operator.kube.cache import Lister
from kubeinfer.operator.kube.client import POD, POD_MONITOR, KubeObject
from kubeinfer.operator.kube.gather import gather_children
from kubeinfer.operator.metrics.direct import ListPods
from kubeinfer.operator.metrics.factory import MetricsSources
from kubeinfer.operator.metrics.quality import read_quality_tallies
from kubeinfer.operator.metrics.queries import Scope
from kubeinfer.operator.metrics.scaling import read_scaling_signals
from kubeinfer.operator.metrics.shadow import read_shadow_aggregates
from kubeinfer.operator.metrics.source import MetricsSource, MetricsUnavailable
from kubeinfer.operator.quality.report import window_to_read
from kubeinfer.operator.rollout.shadow import ShadowQuery, metrics_query
from kubeinfer.operator.state import names
from kubeinfer.operator.state.gpu_nodes import GpuNode
from kubeinfer.operator.state.quality_readings import QualityHistory
from kubeinfer.operator.state.runtime_failures import unsettled
from kubeinfer.operator.state.scaling_inputs import ScalingHistory
from kubeinfer.operator.state.serving_pods import serving_pods
from kubeinfer.operator.state.shadow_readings import ShadowReading
from kubeinfer.operator.state.snapshot import ObservedState, OwnerRef

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
) -> ObservedState:
    """Everything one pass decides from, for the InferenceDeployment in `body` (whose
    `spec` is already parsed): its children, the shadow's aggregates, the load and the
    pods, the autoscaler's `history`, the quality watch's window (with the direct read's
    `quality_history`, returned updated in the observed state) and the PodMonitor (when
    `pod_monitors`: the cluster serves them and the settings allow them). Every read of
    objects goes through `client`: the API, or the operator's cache of its watches."""
    observed = await gather_children(client, body, spec)
    owner = observed.owner
    source = sources.for_object(observed.spec.monitoring.prometheus.url)
    scope = Scope(owner.namespace, owner.name)
    update: dict[str, object] = {"pod_monitors_available": pod_monitors}
    query = metrics_query(observed.status.candidate)
    if query is not None:
        update["shadow"] = await _read_shadow(source, scope, query, now)
    # The serving Deployment, or a mixed GPU fleet's (one per product; `decide_fleet`).
    runtimes = [d for d in (observed.deployment, *observed.product_deployments) if d]
    autoscaled = observed.spec.autoscaling.enabled and bool(runtimes)
    update.update(await _read_pods(client, observed, runtimes, autoscaled, now))
    if autoscaled:
        update["scaling_history"] = history
    objective = observed.spec.slo.p99_latency_milliseconds is not None
    if autoscaled or (objective and runtimes):
        update["scaling_signals"] = await read_scaling_signals(
            source, scope, observed.spec.monitoring.queries, now
        )
    update.update(await _read_quality(source, scope, observed, quality_history, now))
    if gpu_nodes is not None and in_fleet_mode(observed.spec):
        update["gpu_nodes"] = await gpu_nodes()
    if pod_monitors:
        update["pod_monitor"] = await _read_pod_monitor(client, owner)
    return replace(observed, **update)  # type: ignore[arg-type]


async def _read_pods(
    client: Lister,
    observed: ObservedState,
    runtimes: list[KubeObject],
    autoscaled: bool,
    now: datetime,
) -> dict[str, object]:
    """The runtime pods, listed when the autoscaler counts them or a Deployment has not
    settled (a pod that cannot start says why in its container statuses), the shadow
    candidate's when its Deployment has not settled, and the serving pods counted."""
    owner = observed.owner
    update: dict[str, object] = {}
    if autoscaled or any(unsettled(deployment) for deployment in runtimes):
        selector = names.selector_string(names.runtime_selector(owner.name))
        pods = await client.list(POD, owner.namespace, selector)
        update["runtime_pods"] = _by_name(pods)
    if unsettled(observed.candidate_deployment):
        selector = names.selector_string(names.candidate_selector(owner.name))
        update["candidate_pods"] = _by_name(await client.list(POD, owner.namespace, selector))
    if autoscaled:
        counted = serving_pods(pods, observed.deployment, now)
        if observed.deployment is None:  # a fleet's pods: what its Deployments ask
            asked = sum(int((d.get("spec") or {}).get("replicas") or 0) for d in runtimes)
            counted = replace(counted, desired=asked)
        update["serving_pods"] = counted
    return update


async def _read_quality(
    source: MetricsSource,
    scope: Scope,
    observed: ObservedState,
    quality_history: QualityHistory | None,
    now: datetime,
) -> dict[str, object]:
    """The quality watch's tallies over the window its stored status asks for, once the
    reference engine exists; nothing when there is no window to read yet."""
    reference_digest = _engine_digest(observed.reference_configmap)
    if not (observed.spec.quality_watch.enabled and reference_digest):
        return {}
    window = window_to_read(
        observed.spec.quality_watch,
        observed.status.quality_watch,
        _engine_digest(observed.configmap),
        now,
    )
    if window is None:
        return {}
    quality, history = await read_quality_tallies(
        source, scope, reference_digest, window, now, quality_history or QualityHistory()
    )
    return {"quality": quality, "quality_history": history}


async def _read_pod_monitor(client: Lister, owner: OwnerRef) -> KubeObject | None:
    """The runtime's PodMonitor, found by its name among the children's labels, and only
    when this object owns it (by the uid in its ownerReferences); otherwise None."""
    found = await client.list(POD_MONITOR, owner.namespace, names.children_selector(owner.name))
    name = names.runtime_name(owner.name)
    return next((m for m in found if m["metadata"]["name"] == name and _owned(m, owner.uid)), None)


def _engine_digest(configmap: KubeObject | None) -> str | None:
    """The engine a runtime ConfigMap names (its annotation), or None."""
    annotations = ((configmap or {}).get("metadata") or {}).get("annotations") or {}
    digest = annotations.get(names.ANNOTATION_ENGINE_DIGEST)
    return digest if isinstance(digest, str) and digest else None


def _by_name(pods: list[KubeObject]) -> tuple[KubeObject, ...]:
    return tuple(sorted(pods, key=lambda pod: pod["metadata"]["name"]))


def _owned(obj: dict, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


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
