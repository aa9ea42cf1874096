"""Carries out a `Decision`: server-side apply of children, deletes, the status, events.

Which children to write is the pure core's decision (`Decision.apply` holds only the
missing or changed ones); this module only performs it, in the order given. The status is
written with a JSON patch guarded by a `resourceVersion` test, replacing the whole
status at once (never a merge-patch of the conditions list); a conflict means someone
wrote in between, and the pass is retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus
from kubeinfer.operator.kube.client import (
    INFERENCE_DEPLOYMENT,
    RESOURCES,
    ApiError,
    JsonPatch,
    KubeClient,
    KubeObject,
)
from kubeinfer.operator.state import names
from kubeinfer.operator.state.decision import Event
from kubeinfer.operator.state.observed import ObservedState, OwnerRef

REPORTING_COMPONENT = "kubeinfer-operator"

logger = logging.getLogger(__name__)


def observed_children(observed: ObservedState) -> set[tuple[str, str]]:
    """(kind, name) of every observed child that can be deleted."""
    slots = [
        ("PersistentVolumeClaim", observed.pvc),
        ("ConfigMap", observed.configmap),
        ("ConfigMap", observed.candidate_configmap),
        ("ConfigMap", observed.mirror_configmap),
        ("Deployment", observed.deployment),
        ("Deployment", observed.candidate_deployment),
        ("Service", observed.service),
        ("Service", observed.candidate_service),
        ("Service", observed.backend_service),
        ("Deployment", observed.reference_deployment),
        ("Service", observed.reference_service),
        ("ConfigMap", observed.reference_configmap),
        *(("Deployment", d) for d in observed.product_deployments),
        *(("ConfigMap", c) for c in observed.product_configmaps),
        ("EndpointSlice", observed.activator_slice),
        *(("EndpointSlice", s) for s in observed.service_slices),
        ("PodMonitor", observed.pod_monitor),
        ("PodDisruptionBudget", observed.disruption_budget),
        *(("Job", job) for job in observed.jobs),
    ]
    # Items of a LIST carry no kind of their own, so the slot names it.
    live = {(kind, o["metadata"]["name"]) for kind, o in slots if o is not None}
    if any(mirrored(s) for s in observed.service_slices):  # the Endpoints it copies exist
        live.add(("Endpoints", names.service_name(observed.owner.name)))
    return live


def mirrored(slice_: KubeObject) -> bool:
    """A slice the mirroring controller copied from its Service's Endpoints."""
    labels = slice_["metadata"].get("labels") or {}
    return labels.get(names.LABEL_SLICE_MANAGED_BY) == names.SLICE_MIRROR


async def apply_children(client: KubeClient, children: Iterable[KubeObject]) -> int:
    """Server-side applies each child, in order; returns how many were written."""
    written = 0
    for child in children:
        await client.apply(child)
        written += 1
    return written


async def delete_children(
    client: KubeClient, targets: Iterable[tuple[str, str]], observed: ObservedState
) -> int:
    """Deletes the (kind, name) children that exist; returns how many were deleted."""
    live = observed_children(observed)
    deleted = 0
    for kind, name in targets:
        if (kind, name) in live:
            deleted += await client.delete(RESOURCES[kind], observed.owner.namespace, name)
    return deleted


def status_document(status: InferenceDeploymentStatus) -> dict[str, Any]:
    """The status as the API stores it (camelCase, unset fields left out)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


async def patch_status(
    client: KubeClient, owner: OwnerRef, status: InferenceDeploymentStatus, resource_version: str
) -> KubeObject:
    """Replaces the status if the object is still at `resource_version`. A failed test
    (422) or a conflict (409) is raised as a 409, which the handlers retry soon."""
    operations: JsonPatch = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/status", "value": status_document(status)},
    ]
    try:
        return await client.json_patch(
            INFERENCE_DEPLOYMENT, owner.namespace, owner.name, operations, subresource="status"
        )
    except ApiError as error:
        # The resourceVersion `test` failed (a 422 naming no field): someone wrote first,
        # a conflict to retry. A 422 with causes is a status the schema refuses: no retry
        # can fix it, so it is raised as it is.
        if error.status == 409 or (error.status == 422 and not error.causes):
            raise ApiError(409, "Conflict", f"status not written: {error.message}") from None
        raise


def event_object(owner: OwnerRef, event: Event, now: datetime) -> KubeObject:
    """A core/v1 Event about the InferenceDeployment (what `kubectl describe` lists)."""
    timestamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{owner.name}.", "namespace": owner.namespace},
        "involvedObject": {
            "apiVersion": INFERENCE_DEPLOYMENT.api_version,
            "kind": INFERENCE_DEPLOYMENT.kind,
            "name": owner.name,
            "namespace": owner.namespace,
            "uid": owner.uid,
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:1024],
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "firstTimestamp": timestamp,
        "lastTimestamp": timestamp,
        "count": 1,
    }


async def post_events(
    client: KubeClient, owner: OwnerRef, events: Iterable[Event], now: datetime
) -> None:
    """Posts the events, all at once (each is an object of its own: their order is their
    timestamps', not their arrival's); they are helpful but auxiliary, so a refusal is
    logged, not raised (the status, already written, is the record)."""
    await asyncio.gather(*(_post_event(client, owner, event, now) for event in events))


async def _post_event(client: KubeClient, owner: OwnerRef, event: Event, now: datetime) -> None:
    try:
        await client.create(event_object(owner, event, now))
    except ApiError as error:
        logger.warning(
            "Event not posted: InferenceDeployment=%s/%s reason=%s error=%s",
            owner.namespace,
            owner.name,
            event.reason,
            error,
        )
