"""A pod's volumes as directories on the node, kept current as the kubelet keeps them.

- `configMap`, `secret`, `downwardAPI` and `projected` volumes are files written from the
  API objects (keys or `items`, optional or not), rewritten when the objects change. A
  ConfigMap's text has its Service URLs resolved to a ready endpoint (cluster DNS and
  kube-proxy, see `paths.resolve_services`) and the pod's mount paths mapped to the
  node's directories (`paths.PathMap`).
- A projected service-account token is a real TokenRequest for the pod's ServiceAccount,
  bound to the pod and renewed at 80 % of its life, as the kubelet does. Since a process
  on this node cannot find it at the in-cluster path, the node also writes a kubeconfig
  beside it that names the API server, the CA and the token, and points `KUBECONFIG` at
  it (see `pods`).
- `emptyDir` is a fresh directory of the pod; `persistentVolumeClaim` a directory per
  claim that every pod mounting the claim shares (a ReadWriteMany local volume), once the
  claim exists; `hostPath` is the node's own path.
Writes are atomic per file (a temporary file renamed over the old one), so a process
that watches a file never reads half of it.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubeinfer.cluster.node.api import ApiError, KubeObject, NodeApi
from kubeinfer.cluster.node.paths import PathMap, resolve_services, service_references

TOKEN_DEFAULT_SECONDS = 3607


class VolumeNotReady(Exception):
    """A volume cannot be set up yet (its object is missing); the message says which."""


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> bool:
    """Writes `data` unless the file already holds it; True when it wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_bytes(data)
    staged.chmod(mode)
    staged.replace(path)
    return True


class Endpoints:
    """Service URL → a ready endpoint: a ready pod the Service selects, at the port its
    targetPort names (what cluster DNS and kube-proxy route a connection to). Read from
    the pods rather than EndpointSlices, which cannot list the loopback addresses pods
    have where the node could not route a pod CIDR (see `kubeinfer.cluster.network`)."""

    def __init__(self, api: NodeApi) -> None:
        self.api = api

    async def resolve(self, text: str) -> str:
        targets: dict[tuple[str, str, int | None], str] = {}
        for namespace, name, port in set(service_references(text)):
            target = await self._endpoint(namespace, name, port)
            if target:
                targets[(namespace, name, port)] = target
        return resolve_services(text, targets)

    async def _endpoint(self, namespace: str, name: str, port: int | None) -> str | None:
        service = await self.api.get(f"/api/v1/namespaces/{namespace}/services/{name}")
        if service is None:
            return None
        selector = (service.get("spec") or {}).get("selector")
        if not selector:
            return None
        wanted = next(
            (p for p in service["spec"].get("ports") or [] if p["port"] == (port or 80)), None
        )
        if wanted is None:
            return None
        pods = await self.api.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            labelSelector=",".join(f"{k}={v}" for k, v in sorted(selector.items())),
        )
        for pod in sorted(pods.get("items") or [], key=lambda p: p["metadata"]["name"]):
            status = pod.get("status") or {}
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in status.get("conditions") or []
            )
            if not ready or not status.get("podIP") or pod["metadata"].get("deletionTimestamp"):
                continue
            target = _target_port(pod, wanted.get("targetPort", wanted["port"]))
            if target is not None:
                return f"{status['podIP']}:{target}"
        return None


def _target_port(pod: KubeObject, target: int | str) -> int | None:
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for container in pod["spec"].get("containers") or []:
        for declared in container.get("ports") or []:
            if declared.get("name") == target:
                return int(declared["containerPort"])
    return None


class PodVolumes:
    """The volumes of one pod under `directory`; `shared` holds the claims' directories."""

    def __init__(
        self,
        api: NodeApi,
        pod: KubeObject,
        directory: Path,
        shared: Path,
        server: str,
        ca_file: Path,
        endpoints: Endpoints,
    ) -> None:
        self.api, self.pod, self.directory, self.shared = api, pod, directory, shared
        self.server, self.ca_file, self.endpoints = server, ca_file, endpoints
        self.namespace = pod["metadata"]["namespace"]
        self.volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        self.roots: dict[str, Path] = {}
        self.tokens: dict[str, tuple[str, float]] = {}
        """Token file path → (token, monotonic time to renew it)."""
        self.kubeconfig: Path | None = None

    # -- where each volume is ----------------------------------------------------------------
    def root(self, name: str) -> Path:
        volume = self.volumes[name]
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            return self.shared / "claims" / self.namespace / claim
        if "hostPath" in volume:
            return Path(volume["hostPath"]["path"])
        return self.directory / "volumes" / name

    def path_map(self, container: Mapping[str, Any]) -> PathMap:
        """The container's mount paths → the node's paths (subPath included), plus its
        termination message file."""
        mounts: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            if mount["name"] not in self.volumes:
                continue
            host = self.root(mount["name"])
            if mount.get("subPath"):
                host = host / mount["subPath"]
            mounts[mount["mountPath"]] = str(host)
        message = container.get("terminationMessagePath") or "/dev/termination-log"
        mounts[message] = str(self.termination_file(container["name"]))
        return PathMap(mounts)

    def pod_path_map(self) -> PathMap:
        """Every container's mounts, for the text of files that several containers read."""
        mounts: dict[str, str] = {}
        for container in self.pod["spec"].get("containers") or []:
            for path, host in self.path_map(container).mounts.items():
                mounts.setdefault(path, host)
        return PathMap(mounts)

    def termination_file(self, container: str) -> Path:
        return self.directory / "termination" / container

    # -- setting them up ---------------------------------------------------------------------
    async def prepare(self) -> None:
        """Creates every volume; VolumeNotReady when an object it needs is missing."""
        for name, volume in self.volumes.items():
            root = self.root(name)
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                found = await self.api.get(
                    f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim}"
                )
                if found is None:
                    raise VolumeNotReady(f'persistentvolumeclaim "{claim}" not found')
            if "hostPath" not in volume:
                root.mkdir(parents=True, exist_ok=True)
        (self.directory / "termination").mkdir(parents=True, exist_ok=True)
        await self.refresh()

    async def refresh(self) -> None:
        """Writes the files of the object-backed volumes (again, where they changed)."""
        for name, volume in self.volumes.items():
            root = self.root(name)
            if "configMap" in volume:
                await self._config_map(root, volume["configMap"])
            elif "secret" in volume:
                await self._secret(root, volume["secret"])
            elif "downwardAPI" in volume:
                self._downward(root, volume["downwardAPI"].get("items") or [])
            elif "projected" in volume:
                for source in volume["projected"].get("sources") or []:
                    await self._projected(root, source)
            elif not {"emptyDir", "persistentVolumeClaim", "hostPath"} & volume.keys():
                kind = next((k for k in volume if k != "name"), "unknown")
                raise VolumeNotReady(f'volume "{name}": {kind} volumes are not supported here')

    async def _files_of(self, kind: str, name: str, optional: bool) -> dict[str, bytes] | None:
        plural = "configmaps" if kind == "configMap" else "secrets"
        found = await self.api.get(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        if found is None:
            if optional:
                return None
            raise VolumeNotReady(f'{plural[:-1]} "{name}" not found')
        files: dict[str, bytes] = {}
        for key, value in (found.get("data") or {}).items():
            if kind == "configMap":
                text = self.pod_path_map().apply(await self.endpoints.resolve(value))
                files[key] = text.encode()
            else:
                files[key] = base64.b64decode(value)
        for key, value in (found.get("binaryData") or {}).items():
            files[key] = base64.b64decode(value)
        return files

    def _write_keys(
        self,
        root: Path,
        files: Mapping[str, bytes],
        items: list[dict[str, Any]],
        default_mode: int,
        optional: bool,
        what: str,
    ) -> None:
        if items:
            for item in items:
                if item["key"] not in files:
                    if optional:
                        continue
                    raise VolumeNotReady(f'{what}: key "{item["key"]}" not found')
                write_atomic(
                    root / item["path"], files[item["key"]], item.get("mode", default_mode)
                )
        else:
            for key, data in files.items():
                write_atomic(root / key, data, default_mode)
            for stale in root.iterdir() if root.is_dir() else []:
                if stale.is_file() and stale.name not in files and not stale.name.startswith("."):
                    stale.unlink()

    async def _config_map(self, root: Path, source: Mapping[str, Any]) -> None:
        await self._object_volume(root, "configMap", source["name"], source)

    async def _secret(self, root: Path, source: Mapping[str, Any]) -> None:
        await self._object_volume(root, "secret", source["secretName"], source)

    async def _object_volume(
        self, root: Path, kind: str, name: str, source: Mapping[str, Any]
    ) -> None:
        """A ConfigMap's or Secret's keys (or its `items`) as files under `root`."""
        optional = bool(source.get("optional"))
        files = await self._files_of(kind, name, optional)
        if files is not None:
            what = f'{kind.lower()} "{name}"'
            mode = source.get("defaultMode", 0o644)
            self._write_keys(root, files, source.get("items") or [], mode, optional, what)

    def _downward(self, root: Path, items: list[dict[str, Any]]) -> None:
        for item in items:
            field = (item.get("fieldRef") or {}).get("fieldPath")
            if field:
                write_atomic(root / item["path"], field_value(self.pod, field).encode())

    async def _projected(self, root: Path, source: Mapping[str, Any]) -> None:
        if "configMap" in source:
            await self._config_map(root, source["configMap"])
        elif "secret" in source:
            spec = dict(source["secret"])
            spec["secretName"] = spec.pop("name")
            await self._secret(root, spec)
        elif "downwardAPI" in source:
            self._downward(root, source["downwardAPI"].get("items") or [])
        elif "serviceAccountToken" in source:
            await self._token(root, source["serviceAccountToken"])

    async def _token(self, root: Path, source: Mapping[str, Any]) -> None:
        path = root / source["path"]
        held = self.tokens.get(str(path))
        if held and time.monotonic() < held[1]:
            return
        seconds = int(source.get("expirationSeconds") or TOKEN_DEFAULT_SECONDS)
        account = self.pod["spec"].get("serviceAccountName") or "default"
        meta = self.pod["metadata"]
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [source["audience"]] if source.get("audience") else None,
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        try:
            issued = await self.api.request(
                "POST",
                f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token",
                body=body,
            )
        except ApiError as error:
            raise VolumeNotReady(f"token for serviceaccount {account!r}: {error}") from None
        token = issued["status"]["token"]
        write_atomic(path, token.encode(), 0o600)
        self.tokens[str(path)] = (token, time.monotonic() + 0.8 * seconds)
        self.kubeconfig = self.directory / "kubeconfig"
        write_atomic(self.kubeconfig, self._kubeconfig(token).encode(), 0o600)

    def _kubeconfig(self, token: str) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "in-cluster",
                "clusters": [
                    {
                        "name": "in-cluster",
                        "cluster": {
                            "server": self.server,
                            "certificate-authority": str(self.ca_file),
                        },
                    }
                ],
                "users": [{"name": "service-account", "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "in-cluster",
                        "context": {
                            "cluster": "in-cluster",
                            "user": "service-account",
                            "namespace": self.namespace,
                        },
                    }
                ],
            }
        )


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API field of the pod (the fieldRef paths the API allows)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    for prefix, table in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((meta.get(table) or {}).get(path[len(prefix) + 2 : -2], ""))
        if path == prefix:
            items = sorted((meta.get(table) or {}).items())
            return "\n".join(f"{k}={json.dumps(v)}" for k, v in items)
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []),
    }
    return str(simple.get(path) or "")
