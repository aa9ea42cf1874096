"""What every child of an InferenceDeployment carries besides its body: the standard
metadata, an ownerReference to the InferenceDeployment (so deleting it garbage-collects
the child), and an input-hash annotation over everything the operator sets, so a child
whose observed hash equals the desired one needs no write (prometheus-operator's
approach). Pure.
"""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.api.v1alpha1.resource import API_VERSION, KIND
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import KubeObject, OwnerRef


def owner_reference(owner: OwnerRef) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def input_hash(obj: KubeObject) -> str | None:
    """The input-hash annotation of an object (desired or observed), if any."""
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_INPUT_HASH)


def finish_child(
    api_version: str,
    kind: str,
    name: str,
    owner: OwnerRef,
    labels: dict[str, str],
    body: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> KubeObject:
    """Wraps a body with metadata and stamps the input hash over all of it."""
    obj: KubeObject = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": labels,
            "annotations": dict(annotations or {}),
            "ownerReferences": [owner_reference(owner)],
        },
        **body,
    }
    obj["metadata"]["annotations"][names.ANNOTATION_INPUT_HASH] = names.stable_hash(obj)
    return obj
