"""A small async Kubernetes REST client: the operator's only door to the API server.

Why not kopf's internal client: it is private API. Why not the generated `kubernetes`
client: it is synchronous and turns objects into models, while the operator works with
plain dicts and server-side apply. The credentials come from kopf's public login
functions (`kopf.ConnectionInfo`), so kubeconfig, in-cluster service accounts and test
servers all work the same way.

Every call is one HTTP request; errors carry their HTTP status (`ApiError.status`), and
`retryable` says whether trying again later can help. Every kind the operator touches is
listed once in `kube.resources`, which `kubeinfer.operator.rbac` also reads.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import kopf
from kubeinfer.operator.kube.resources import (
    CONFIGMAP,
    DEPLOYMENT,
    EVENT,
    INFERENCE_DEPLOYMENT,
    JOB,
    POD,
    POD_MONITOR,
    PVC,
    RESOURCES,
    SERVICE,
    ResourceType,
)

__all__ = [
    "CONFIGMAP",
    "DEPLOYMENT",
    "EVENT",
    "INFERENCE_DEPLOYMENT",
    "JOB",
    "POD",
    "POD_MONITOR",
    "PVC",
    "RESOURCES",
    "SERVICE",
    "ApiError",
    "KubeClient",
    "ResourceType",
]

KubeObject = dict[str, Any]

FIELD_MANAGER = "kubeinfer"
BACKGROUND = "Background"


class ApiError(Exception):
    """A request the API server refused; `status` is its HTTP status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def retryable(self) -> bool:
        """Conflicts, throttling and server errors pass; 4xx validation errors do not."""
        return self.status in (409, 429) or self.status >= 500


class KubeClient:
    """One aiohttp session to one API server. Use `async with` or call `close()`."""

    def __init__(self, connection: kopf.ConnectionInfo, field_manager: str = FIELD_MANAGER) -> None:
        self.field_manager = field_manager
        self.server = connection.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=connection.as_ssl_context()),
            headers={"User-Agent": "kubeinfer-operator", **connection.as_http_headers()},
            trust_env=connection.trust_env,
        )

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> KubeObject:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        async with self._session.request(
            method, self.server + path, params=params, data=data, headers=headers
        ) as response:
            text = await response.text()
            try:
                payload = json.loads(text) if text else {}
            except ValueError:
                payload = {"message": text[:500]}
            if response.status >= 400:
                raise ApiError(
                    response.status,
                    str(payload.get("reason") or response.reason or "Error"),
                    str(payload.get("message") or text[:500]),
                )
            return payload if isinstance(payload, dict) else {}

    async def get(self, resource: ResourceType, namespace: str, name: str) -> KubeObject | None:
        """The object, or None when it does not exist (404 is absence, not an error)."""
        try:
            return await self._request("GET", resource.path(namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def serves(self, resource: ResourceType) -> bool:
        """Whether the API server serves this resource (discovery of its group version; a
        group that is not installed answers 404). Other errors are raised."""
        root = f"/apis/{resource.group}/{resource.version}" if resource.group else "/api/v1"
        try:
            found = await self._request("GET", root)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return any(r.get("name") == resource.plural for r in found.get("resources") or [])

    async def list(
        self, resource: ResourceType, namespace: str, label_selector: str
    ) -> list[KubeObject]:
        """Objects of one kind in one namespace matching a label selector."""
        result = await self._request(
            "GET", resource.path(namespace), params={"labelSelector": label_selector}
        )
        return list(result.get("items") or [])

    async def apply(self, obj: KubeObject, *, subresource: str | None = None) -> KubeObject:
        """Server-side apply as our field manager (`kubeinfer`), forcing ownership of conflicts:
        the operator is the only writer of what it renders."""
        resource = RESOURCES[obj["kind"]]
        meta = obj["metadata"]
        return await self._request(
            "PATCH",
            resource.path(meta["namespace"], meta["name"], subresource),
            params={"fieldManager": self.field_manager, "force": "true"},
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    async def json_patch(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        operations: list[dict[str, Any]],
        *,
        subresource: str | None = None,
    ) -> KubeObject:
        """An RFC 6902 JSON patch (use a `test` operation for optimistic concurrency)."""
        return await self._request(
            "PATCH",
            resource.path(namespace, name, subresource),
            params={"fieldManager": self.field_manager},
            body=operations,
            content_type="application/json-patch+json",
        )

    async def create(self, obj: KubeObject) -> KubeObject:
        resource = RESOURCES[obj["kind"]]
        return await self._request(
            "POST",
            resource.path(obj["metadata"]["namespace"]),
            params={"fieldManager": self.field_manager},
            body=obj,
        )

    async def delete(self, resource: ResourceType, namespace: str, name: str) -> bool:
        """Deletes in the background (dependents are garbage-collected); False if absent."""
        try:
            await self._request(
                "DELETE",
                resource.path(namespace, name),
                body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": BACKGROUND},
            )
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True
