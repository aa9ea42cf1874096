"""The children that route an object with autoscaling.minReplicas 0 through the activator
while it has no serving pod. Pure.

The activator pods live in the operator's namespace, which no Service selector of another
namespace can reach, so the object's Service is switched as Knative switches a revision's:
while at zero it selects nothing, and an EndpointSlice the operator writes for it lists
the activator pods' addresses; the activator forwards what it held to the `-backend`
Service, which always selects the serving pods. The EndpointSlice controller does nothing
for a Service without a selector, not even drop the pods it listed, and the Endpoints
controller leaves its Endpoints, which the mirroring controller then copies into a slice:
the passes at zero delete both (only what they observe). Once a serving pod is ready
the Service selects the pods again (the controller lists them), and the activator's slice
is deleted one pass later, when the Service read back has its selector: both slices serve
for that pass, so there is no instant without an endpoint.

The route table the activator reads (`route`) is the operator's to write, one entry per
object with minReplicas 0 (`kube.activator.RouteTable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.reconcile.child_meta import finish_child
from kubeinfer.operator.reconcile.desired import HTTP_PORT, build_service
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import KubeObject, ObservedState


@dataclass(frozen=True)
class ActivatorRouting:
    """What this pass does with the activator for one object."""

    through_activator: bool
    """The object's Service selects no pod; its traffic goes to the activator."""

    children: tuple[KubeObject, ...]
    """The pass' children as they route: with the backend Service and, while needed, the
    activator's EndpointSlice."""

    deletions: tuple[tuple[str, str], ...]
    """(kind, name) of what goes: the slice once the Service selects pods again, the
    backend Service once minReplicas is above 0."""


def scales_to_zero(observed: ObservedState) -> bool:
    scaling = observed.spec.autoscaling
    return scaling.enabled and scaling.min_replicas == 0


def _selects_pods(service: KubeObject | None) -> bool:
    return service is None or bool((service.get("spec") or {}).get("selector"))


def routing(
    observed: ObservedState,
    children: list[KubeObject],
    replicas: int,
    ready: int,
    addresses: tuple[str, ...],
    settings: OperatorSettings,
) -> ActivatorRouting:
    """`children` as they route for a pass that sets the serving pods to `replicas`, with
    `ready` serving pods ready and the ready activator pods at `addresses`: the object's
    Service selecting no pod while the activator holds its traffic, the backend Service
    and the activator's slice added."""
    owner, spec = observed.owner, observed.spec
    backend = names.backend_service_name(owner.name)
    slice_name = names.activator_slice_name(owner.name)
    service_name = names.service_name(owner.name)
    service = next(
        (c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == service_name),
        None,
    )
    if not scales_to_zero(observed) or service is None:
        gone = [("Service", backend)] if observed.backend_service else []
        if observed.activator_slice:
            gone.append(("EndpointSlice", slice_name))
        return ActivatorRouting(False, tuple(children), tuple(gone))
    version = service["metadata"]["labels"][names.LABEL_VERSION]
    held_by_activator = not _selects_pods(observed.service)
    through = replicas == 0 or (held_by_activator and ready == 0)
    routed = list(children)
    backend_service = build_service(owner, version, grpc_port=spec.runtime.grpc_port, name=backend)
    # The activator asks each pod's readiness itself (every 100 ms while it holds), so its
    # Service lists a pod as soon as it has an address, not once the kubelet's probe, the
    # EndpointSlice controller and kube-proxy have each seen it ready: seconds of a cold
    # start. A pod not ready (starting, held off by its known answers, draining) refuses
    # an inference with 503 and Retry-After, which the activator sends again.
    backend_service["spec"]["publishNotReadyAddresses"] = True
    deletions: list[tuple[str, str]] = []
    if through:
        # Applied in this order: the backend Service and the slice to the activator
        # first, then the Service stops selecting pods, and only then are the pods
        # removed, so no request finds the Service without an endpoint.
        at = routed.index(service)
        routed[at : at + 1] = [
            backend_service,
            activator_slice(observed, addresses, settings, version),
            build_service(owner, version, grpc_port=spec.runtime.grpc_port, selects_pods=False),
        ]
        runtime = [c for c in routed if c["kind"] == "Deployment"]
        routed = [c for c in routed if c["kind"] != "Deployment"] + runtime
        # Kubernetes' controllers do nothing more for a Service without a selector, not
        # even remove the pods they listed: its slices go (after the writes), and its
        # Endpoints, which the mirroring controller would copy into a slice again.
        deletions += [("EndpointSlice", s["metadata"]["name"]) for s in observed.service_slices]
        if observed.service_slices:
            deletions.append(("Endpoints", service_name))
    else:
        routed.append(backend_service)
        if held_by_activator:
            routed.append(activator_slice(observed, addresses, settings, version))
        elif observed.activator_slice:
            deletions.append(("EndpointSlice", slice_name))
    return ActivatorRouting(through, tuple(routed), tuple(deletions))


def activator_slice(
    observed: ObservedState, addresses: tuple[str, ...], settings: OperatorSettings, version: str
) -> KubeObject:
    """The object's Service's endpoints while at zero: the ready activator pods, on the
    Service's port names."""
    owner, grpc_port = observed.owner, observed.spec.runtime.grpc_port
    ports: list[dict[str, Any]] = [
        {"name": "http", "port": settings.activator.http_port, "protocol": "TCP"},
        {"name": "metrics", "port": settings.activator.http_port, "protocol": "TCP"},
    ]
    if grpc_port is not None:
        ports.append({"name": "grpc", "port": settings.activator.grpc_port, "protocol": "TCP"})
    body = {
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [address], "conditions": {"ready": True}} for address in sorted(addresses)
        ],
        "ports": ports,
    }
    labels = names.common_labels(owner.name, version, names.COMPONENT_RUNTIME)
    labels[names.LABEL_SERVICE_NAME] = names.service_name(owner.name)
    labels[names.LABEL_SLICE_MANAGED_BY] = names.ACTIVATOR_SLICE_MANAGER
    name = names.activator_slice_name(owner.name)
    return finish_child("discovery.k8s.io/v1", "EndpointSlice", name, owner, labels, body)


def route(observed: ObservedState) -> dict[str, Any] | None:
    """The object's entry in the activator's route table; None without minReplicas 0."""
    if not scales_to_zero(observed):
        return None
    owner, spec = observed.owner, observed.spec
    return {
        "namespace": owner.namespace,
        "service": names.service_name(owner.name),
        "models": [spec.model.name],
        "backendHost": f"{names.backend_service_name(owner.name)}.{owner.namespace}.svc",
        "httpPort": HTTP_PORT,
        "grpcPort": spec.runtime.grpc_port,
    }
