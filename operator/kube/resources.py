"""Every kind the operator reads or writes, and where it lives in the REST API. Pure data:
the client builds its paths from it and `kubeinfer.operator.rbac` its rules."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceType:
    """Where a kind lives in the REST API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    """False for a cluster-scoped kind (Nodes): its paths name no namespace."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        within = f"/namespaces/{namespace}" if self.namespaced else ""
        path = f"{root}{within}/{self.plural}"
        if name is not None:
            path += f"/{name}"
            if subresource is not None:
                path += f"/{subresource}"
        return path


INFERENCE_DEPLOYMENT = ResourceType(
    "kubeinfer.io", "v1alpha1", "inferencedeployments", "InferenceDeployment"
)
PVC = ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
CONFIGMAP = ResourceType("", "v1", "configmaps", "ConfigMap")
SERVICE = ResourceType("", "v1", "services", "Service")
POD = ResourceType("", "v1", "pods", "Pod")
EVENT = ResourceType("", "v1", "events", "Event")
DEPLOYMENT = ResourceType("apps", "v1", "deployments", "Deployment")
JOB = ResourceType("batch", "v1", "jobs", "Job")
PDB = ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
"""The serving pods' disruption budget (a drain evicts one at a time)."""
POD_MONITOR = ResourceType("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
"""The prometheus-operator's; only where the cluster serves it."""
NODE = ResourceType("", "v1", "nodes", "Node", namespaced=False)
"""Read (listed and watched, never written) for mixed GPU fleets: which GPU products the
cluster has (`kube.nodes`)."""
ENDPOINT_SLICE = ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
"""With autoscaling.minReplicas 0, while at zero: the slice that points an object's
Service at the activator pods (in the operator's namespace, so no selector can)."""
ENDPOINTS = ResourceType("", "v1", "endpoints", "Endpoints")
"""Only deleted: the Endpoints controller leaves a Service's Endpoints as they were once
the Service has no selector, and the mirroring controller copies them into an
EndpointSlice, so the pods a Service at zero listed would still take its traffic."""
LEASE = ResourceType("coordination.k8s.io", "v1", "leases", "Lease")
"""Leader election's lock, in the operator's own namespace (`kube.leader_election`)."""

RESOURCES: dict[str, ResourceType] = {
    r.kind: r
    for r in (
        INFERENCE_DEPLOYMENT,
        PVC,
        CONFIGMAP,
        SERVICE,
        POD,
        EVENT,
        DEPLOYMENT,
        JOB,
        PDB,
        POD_MONITOR,
        ENDPOINT_SLICE,
        ENDPOINTS,
        LEASE,
        NODE,
    )
}
"""Every kind the operator reads or writes, by kind."""
