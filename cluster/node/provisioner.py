"""The node's storage: a default StorageClass `local` whose claims are provisioned as
directories of the node, as kind's local-path provisioner does. A claim of the class
(the persistentvolume-binder controller marks it for this provisioner) gets a hostPath
PersistentVolume made for it, which the real binder binds; a released volume is
deleted. Pods mount a claim's directory (`volumes`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from kubeinfer.cluster.node.api import ApiError, KubeObject, NodeApi

PROVISIONER = "kubeinfer.io/local-path"
STORAGE_CLASS = "local"


class LocalPathProvisioner:
    def __init__(self, api: NodeApi, directory: Path) -> None:
        self.api, self.directory = api, directory

    async def ensure_storage_class(self) -> None:
        body = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
        with contextlib.suppress(ApiError):
            await self.api.request("POST", "/apis/storage.k8s.io/v1/storageclasses", body=body)

    async def run(self) -> None:
        async for kind, obj in self.api.watch("/api/v1/persistentvolumeclaims"):
            claims = (
                obj.get("items") or [] if kind == "SYNC" else [obj] if kind != "DELETED" else []
            )
            for claim in claims:
                await self._provision(claim)
            if kind in ("SYNC", "DELETED"):
                await self._delete_released()

    async def _provision(self, claim: KubeObject) -> None:
        meta, spec = claim["metadata"], claim["spec"]
        annotations = meta.get("annotations") or {}
        ours = (
            annotations.get("volume.kubernetes.io/storage-provisioner") == PROVISIONER
            or annotations.get("volume.beta.kubernetes.io/storage-provisioner") == PROVISIONER
        )
        if not ours or spec.get("volumeName") or meta.get("deletionTimestamp"):
            return
        name = f"pvc-{meta['uid']}"
        path = self.directory / "claims" / meta["namespace"] / meta["name"]
        path.mkdir(parents=True, exist_ok=True)
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": name,
                "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
            },
            "spec": {
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": spec.get("storageClassName") or STORAGE_CLASS,
                "volumeMode": spec.get("volumeMode") or "Filesystem",
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        with contextlib.suppress(ApiError):
            await self.api.request("POST", "/api/v1/persistentvolumes", body=volume)

    async def _delete_released(self) -> None:
        volumes = await self.api.request("GET", "/api/v1/persistentvolumes")
        for volume in volumes.get("items") or []:
            annotations = volume["metadata"].get("annotations") or {}
            released = (volume.get("status") or {}).get("phase") in ("Released", "Failed")
            if annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER and released:
                with contextlib.suppress(ApiError):
                    await self.api.request(
                        "DELETE", f"/api/v1/persistentvolumes/{volume['metadata']['name']}"
                    )
