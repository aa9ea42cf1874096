"""The operator against an external cluster (marker `cluster`: runs only when KUBECONFIG
is set; none is reachable from our machines, so these are unverified here).

The rest of the operator tests run against the session's own cluster (a kube-apiserver,
etcd, kube-controller-manager and kube-scheduler of one Kubernetes version, and one node
whose kubelet runs pods as containers with containerd and runc). What only another
cluster can show: the CRD as it ships is accepted and Established by that cluster's API
server version, and its CEL rules refuse at admission what the model refuses; the
children the operator renders pass that cluster's admission (its defaulting,
PodSecurity, quotas) and its server-side apply then leaves them alone (their
resourceVersions do not move across resync passes); and the garbage collector there
honours their ownerReferences. The operator runs with the kubeconfig's own credentials
(to check that the Role from `kubeinfer.operator.rbac` is enough, run the suite under a
service account bound to it). Builds and readiness need the runtime image on that
cluster's nodes, so the scenario pins an engine and asserts children and status, not
Ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator.commands.run import run_operator
from operator_harness import FAST, Model, eventually, manifest

pytestmark = pytest.mark.cluster

CRD = Path(__file__).parents[2] / "crds" / "inferencedeployments.kubeinfer.io.yaml"
GROUP, VERSION, PLURAL = "kubeinfer.io", "v1alpha1", "inferencedeployments"
INSTANCE = "app.kubernetes.io/instance=resnet"
PIN = "sha256:" + "e" * 64
"""A pinned engine, never served: only the children and the status are checked."""


@pytest.fixture(scope="module")
def kube() -> Any:
    import kubernetes

    kubernetes.config.load_kube_config()
    api = kubernetes.client.ApiClient()
    extensions = kubernetes.client.ApiextensionsV1Api(api)
    crd = yaml.safe_load(CRD.read_text())
    try:
        extensions.create_custom_resource_definition(crd)
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise
    return kubernetes


@pytest.fixture
def namespace(kube: Any) -> Any:
    core = kube.client.CoreV1Api()
    name = f"kubeinfer-test-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@contextlib.asynccontextmanager
async def operator_in(namespace: str) -> AsyncIterator[None]:
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        run_operator(
            FAST, clusterwide=False, namespaces=[namespace], stop_flag=stop, ready_flag=ready
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), timeout=30)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


def in_namespace(document: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**document, "metadata": {**document["metadata"], "namespace": namespace}}


async def test_crd_is_established(kube: Any) -> None:
    extensions = kube.client.ApiextensionsV1Api()
    crd = extensions.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
    conditions = {c.type: c.status for c in crd.status.conditions or []}
    assert conditions.get("Established") == "True"
    assert conditions.get("NonStructuralSchema") in (None, "False")


async def test_pinned_deployment_gets_its_children_and_then_no_writes(
    kube: Any, namespace: str, tiny: Model
) -> None:
    custom = kube.client.CustomObjectsApi()
    apps, core = kube.client.AppsV1Api(), kube.client.CoreV1Api()
    body = in_namespace(manifest(tiny, engine={"pin": PIN}), namespace)
    async with operator_in(namespace):
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

        def children() -> list[Any]:
            found = [
                *apps.list_namespaced_deployment(namespace).items,
                *core.list_namespaced_service(namespace).items,
                *core.list_namespaced_config_map(namespace, label_selector=INSTANCE).items,
            ]
            return found if len(found) == 3 else []

        found = await eventually(children, within=30, what="the runtime children")
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "resnet")
        engine = next(c for c in obj["status"]["conditions"] if c["type"] == "EngineReady")
        assert engine["reason"] == "EnginePinned"
        for child in found:
            assert child.metadata.owner_references[0].uid == obj["metadata"]["uid"]
        versions = {child.metadata.name: child.metadata.resource_version for child in found}
        # not a wait: four resyncs pass, which must change nothing
        await asyncio.sleep(4 * FAST.requeue.resync_interval_seconds)
        # Services and ConfigMaps have no controller writing their status: any change of
        # their resourceVersion would be ours. (The Deployment's moves as pods start.)
        again = {c.metadata.name: c.metadata.resource_version for c in children()}
    kinds = {c.metadata.name: type(c).__name__ for c in found}  # list items carry no kind
    for name, version in versions.items():
        if kinds[name] != "V1Deployment":
            assert again[name] == version, f"a resync pass over an unchanged object wrote {name}"


async def test_cel_rejects_at_admission_what_the_model_refuses(
    kube: Any, namespace: str, tiny: Model
) -> None:
    custom = kube.client.CustomObjectsApi()
    body = in_namespace(manifest(tiny, engine={"precision": "int8"}), namespace)
    with pytest.raises(kube.client.ApiException) as rejected:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert rejected.value.status == 422
    assert "calibration" in rejected.value.body
