"""The children of an InferenceDeployment, read fresh: the part of the `ObservedState`
that is what exists (the gather step, `kube.gather`, adds what is read beyond them).

Children are found by their labels (one LIST per kind, in parallel, or one look into the
operator's cache of its watches, `kube.cache`) and kept only when
an ownerReference points at this InferenceDeployment's uid, so an unrelated object that
happens to carry the labels is never adopted. A child that is missing is simply absent
(None or an empty tuple): absence is an observation, not an error.
"""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.kube.cache import Lister
from kubeinfer.operator.kube.client import (
    CONFIGMAP,
    DEPLOYMENT,
    ENDPOINT_SLICE,
    JOB,
    PDB,
    POD,
    POD_MONITOR,
    PVC,
    SERVICE,
    KubeObject,
)
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import (
    ObservedState,
    OwnerRef,
    owner_ref_from_body,
    stored_status,
)


def owned_by(obj: KubeObject, uid: str) -> bool:
    """Whether an ownerReference of `obj` points at the uid of the InferenceDeployment."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def is_controller_slice(obj: KubeObject, owner: str) -> bool:
    """Whether `obj` is a slice of `owner`'s Service that Kubernetes' controllers keep:
    the EndpointSlice controller's, or the mirroring controller's copy of its Endpoints."""
    labels = obj.get("metadata", {}).get("labels") or {}
    return labels.get(names.LABEL_SERVICE_NAME) == names.service_name(owner) and labels.get(
        names.LABEL_SLICE_MANAGED_BY
    ) in (names.SLICE_CONTROLLER, names.SLICE_MIRROR)


def _named(objects: list[KubeObject], name: str) -> KubeObject | None:
    """The owned object of that name: children are told apart by their deterministic
    names (a kind may have several: the serving and the candidate Deployment)."""
    return next((o for o in objects if o["metadata"]["name"] == name), None)


async def read_children(
    client: Lister, body: dict[str, Any], spec: InferenceDeploymentSpec
) -> ObservedState:
    """Reads every child of the InferenceDeployment in `body` and its build Jobs' pods,
    through `client`: the API, or the operator's cache of its watches (`kube.cache`)."""
    owner = owner_ref_from_body(body)
    selector = names.children_selector(owner.name)
    kinds = [PVC, CONFIGMAP, DEPLOYMENT, SERVICE, JOB, PDB]
    if spec.autoscaling.enabled and spec.autoscaling.min_replicas == 0:
        kinds.append(ENDPOINT_SLICE)  # the activator's, while at zero
    # One after another: from the cache each answers at once, and a task each would cost
    # more than the reading; from the API, a pass has its slot's one request at a time.
    listed = [await client.list(kind, owner.namespace, selector) for kind in kinds]
    pvcs, configmaps, deployments, services, jobs, budgets, *more = (
        [o for o in objects if owned_by(o, owner.uid)] for objects in listed
    )
    slices = more[0] if more else []
    # The EndpointSlice controller's slices of the object's Service carry its labels, and
    # are owned by the Service: found by their service-name label.
    service_slices = [
        o for o in (listed[6] if len(listed) > 6 else []) if is_controller_slice(o, owner.name)
    ]
    jobs.sort(key=lambda o: o["metadata"]["name"])
    pods: list[KubeObject] = []
    if jobs:
        # By the labels the operator gives every build pod's template, not the Job
        # controller's: it labels pods `batch.kubernetes.io/job-name` only since 1.27 and
        # `job-name` before (engine_state matches a pod to its Job by either).
        pods = await client.list(POD, owner.namespace, names.build_pods_selector(owner.name))
        pods.sort(key=lambda o: o["metadata"]["name"])
    runtime, candidate = names.runtime_name(owner.name), names.candidate_name(owner.name)
    reference = names.reference_name(owner.name)
    return ObservedState(
        owner=owner,
        spec=spec,
        status=stored_status(body),
        pvc=_named(pvcs, names.cache_claim_name(owner.name)),
        configmap=_named(configmaps, runtime),
        deployment=_named(deployments, runtime),
        service=_named(services, names.service_name(owner.name)),
        jobs=tuple(jobs),
        job_pods=tuple(pods),
        candidate_configmap=_named(configmaps, candidate),
        candidate_deployment=_named(deployments, candidate),
        candidate_service=_named(services, candidate),
        mirror_configmap=_named(configmaps, names.mirror_name(owner.name)),
        reference_configmap=_named(configmaps, reference),
        reference_deployment=_named(deployments, reference),
        reference_service=_named(services, reference),
        backend_service=_named(services, names.backend_service_name(owner.name)),
        activator_slice=_named(slices, names.activator_slice_name(owner.name)),
        service_slices=tuple(sorted(service_slices, key=lambda o: o["metadata"]["name"])),
        annotations=dict(body["metadata"].get("annotations") or {}),
        disruption_budget=_named(budgets, runtime),
        product_configmaps=_of_products(configmaps),
        product_deployments=_of_products(deployments),
    )


def _of_products(objects: list[KubeObject]) -> tuple[KubeObject, ...]:
    """A mixed GPU fleet's runtime children (one per GPU product), by name."""
    found = [o for o in objects if names.LABEL_GPU_PRODUCT in (o["metadata"].get("labels") or {})]
    return tuple(sorted(found, key=lambda o: o["metadata"]["name"]))


async def read_pod_monitor(client: Lister, owner: OwnerRef) -> KubeObject | None:
    """The runtime's PodMonitor, found by its name among the children's labels, and only
    when this object owns it (by the uid in its ownerReferences); otherwise None."""
    found = await client.list(POD_MONITOR, owner.namespace, names.children_selector(owner.name))
    name = names.runtime_name(owner.name)
    return next(
        (m for m in found if m["metadata"]["name"] == name and owned_by(m, owner.uid)), None
    )
