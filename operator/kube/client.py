"""The operator's door to the API server: a thin facade over the official async client.

The transport is `kubernetes.aio` (the official `kubernetes` package, 37+): its `ApiClient`
holds the connection pool and the credentials, and its dynamic client's `request` builds
every call (query parameters, content types, JSON bodies), with paths from
`kube.resources`. The facade keeps the call sites small and the objects plain dicts, and
adds what the operator relies on:

- every request is bounded (`timeout_seconds`, `KUBEINFER_API__TIMEOUT_SECONDS`): a hung
  call would otherwise hold an object's reconcile lock for aiohttp's 300 s default;
- lists are paginated (`limit` + `continue`), as client-go's pager does;
- errors are `ApiError` with the HTTP status, whether retrying can help, and the
  server's `Retry-After` (read with the official client's own helper), so the handlers
  hand kopf the delay the server asked for;
- credentials come from a kopf credentials vault: one `ApiClient` per credential, cached
  in the vault beside kopf's own session, and closed by the vault when the credential is
  dropped. A 401 invalidates the credential in the vault, which sends kopf back to its
  login handlers (exactly what kopf's own API client does); the call is then retried
  with the new credential. A client built from one `kopf.ConnectionInfo` has nothing to
  log in again with, so there a 401 is raised.

kopf exports no name for its `Vault` (`kopf.operator(vault=...)` takes one): it is
imported from its module here, and the re-login scenario tests pin the behaviour.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
from kopf._cogs.structs.credentials import Vault
from kubeinfer.operator.kube.resources import (
    CONFIGMAP,
    DEPLOYMENT,
    ENDPOINT_SLICE,
    EVENT,
    INFERENCE_DEPLOYMENT,
    JOB,
    LEASE,
    PDB,
    POD,
    POD_MONITOR,
    PVC,
    RESOURCES,
    SERVICE,
    ResourceType,
)
from kubeinfer.operator.state.observed import KubeObject
from kubeinfer.operator.telemetry.activity import Activity
from kubernetes.aio.client import ApiClient, Configuration
from kubernetes.aio.dynamic import DynamicClient
from kubernetes.aio.dynamic.exceptions import DynamicApiError
from kubernetes.aio.utils.retry import retry_after_seconds

__all__ = [
    "CONFIGMAP",
    "DEPLOYMENT",
    "ENDPOINT_SLICE",
    "EVENT",
    "INFERENCE_DEPLOYMENT",
    "JOB",
    "LEASE",
    "PDB",
    "POD",
    "POD_MONITOR",
    "PVC",
    "RESOURCES",
    "SERVICE",
    "ApiError",
    "KubeClient",
    "ResourceType",
    "Vault",
]


JsonPatch = list[dict[str, Any]]
"""An RFC 6902 patch: its operations, in order. (An alias, since `KubeClient.list`
hides the builtin in the class body.)"""

FIELD_MANAGER = "kubeinfer"
USER_AGENT = "kubeinfer-operator"
BACKGROUND = "Background"
DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_PAGE_SIZE = 500
"""client-go's pager default."""
VAULT_PURPOSE = "kubeinfer.operator.kube.client"
"""The key of our `ApiClient` among the objects the vault caches per credential."""


RETRY_SOON_SECONDS = 2.0
RETRY_LATER_SECONDS = 30.0


class ApiError(Exception):
    """A request the API server refused (`status` is its HTTP status), or one that got no
    answer (status 0: unreachable or timed out)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        retry_after_seconds: float | None = None,
        causes: tuple[str, ...] = (),
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after_seconds = retry_after_seconds
        """The server's `Retry-After` (429, 5xx), when it sent one."""
        self.causes = causes
        """The fields the server found invalid (`field: message`, from its Status's
        `details.causes`): a 422 of a written object that failed validation has some, a
        422 of a JSON patch that could not be applied has none."""

    @property
    def retryable(self) -> bool:
        """No answer, conflicts, throttling and server errors pass; 4xx refusals do not."""
        return self.status in (0, 409, 429) or self.status >= 500

    @property
    def retry_delay_seconds(self) -> float:
        """How long to wait before trying again: what the server asked for
        (`Retry-After`), else soon for what passes by itself, else later."""
        if self.retry_after_seconds is not None:
            return self.retry_after_seconds
        return RETRY_SOON_SECONDS if self.retryable else RETRY_LATER_SECONDS


def api_client_for(connection: kopf.ConnectionInfo) -> ApiClient:
    """The official client's `ApiClient` for kopf's connection info. The Authorization
    header is taken whole from kopf (bearer token, other schemes, basic auth), and so is
    the TLS context (CA, client certificate, insecure), which kopf builds from paths or
    inline data alike."""
    headers = connection.as_http_headers()
    configuration = Configuration(
        host=connection.server.rstrip("/"),
        api_key={"authorization": headers["Authorization"]} if headers else None,
        proxy=connection.proxy_url,
        client_session_kwargs={"trust_env": connection.trust_env},
    )
    api = ApiClient(configuration)
    api.user_agent = USER_AGENT
    # The REST client builds its connector from this context on the first request.
    api.rest_client.ssl_context = connection.as_ssl_context()
    return api


class KubeClient:
    """Plain-dict reads and writes through the official client. `credentials` is either
    kopf's vault (shared with the running operator, which logs in again on a 401) or one
    fixed `kopf.ConnectionInfo`. Use `async with`, or call `close()`."""

    def __init__(
        self,
        credentials: kopf.ConnectionInfo | Vault,
        field_manager: str = FIELD_MANAGER,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        page_size: int = DEFAULT_PAGE_SIZE,
        activity: Activity | None = None,
    ) -> None:
        self.field_manager = field_manager
        self.activity = activity if activity is not None else Activity()
        """Where each request is counted, by verb."""
        self.timeout_seconds = timeout_seconds
        self.page_size = page_size
        self._owns_vault = not isinstance(credentials, Vault)
        self._vault = (
            credentials if isinstance(credentials, Vault) else Vault({"fixed": credentials})
        )

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the sessions of a client built from one connection; a shared vault's
        are closed by whoever runs it (kopf, at its cleanup, and the operator command)."""
        if self._owns_vault:
            await self._vault.close()

    # -- transport ---------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        **params: Any,
    ) -> KubeObject:
        async for key, info, api in self._vault.extended(_api_client_of, VAULT_PURPOSE):
            try:
                return await self._send(api, method, path, body, content_type, params)
            except ApiError as error:
                if error.status != 401 or self._owns_vault:
                    raise
                try:  # as kopf's own client does: drop the credential, wait for a new one
                    await self._vault.invalidate(key, info, exc=error)
                except kopf.LoginError as failed:
                    raise ApiError(401, "Unauthorized", f"login again failed: {failed}") from None
        raise ApiError(401, "Unauthorized", "no credentials left")  # pragma: no cover

    async def _send(
        self,
        api: ApiClient,
        method: str,
        path: str,
        body: Any,
        content_type: str | None,
        params: Mapping[str, Any],
    ) -> KubeObject:
        self.activity.request(method, "limit" in params)
        try:
            response = await DynamicClient(api).request(
                method,
                path,
                body=body,
                content_type=content_type,
                serialize=False,
                _request_timeout=self.timeout_seconds,
                **params,
            )
            raw = await response.read()
        except DynamicApiError as error:
            raise _from_refusal(error) from None
        except TimeoutError:
            raise ApiError(
                0, "Timeout", f"{method} {path}: no answer in {self.timeout_seconds:g} s"
            ) from None
        except (aiohttp.ClientError, OSError) as error:
            raise ApiError(0, "Unreachable", f"{method} {path}: {error!r}") from None
        payload = json.loads(raw) if raw else {}
        return payload if isinstance(payload, dict) else {}

    # -- calls -------------------------------------------------------------------------------

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
        group that is not installed answers 404)."""
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
        """Objects of one kind in one namespace matching a label selector, read in pages of
        `page_size` (a large namespace never arrives as one response)."""
        items: list[KubeObject] = []
        token: str | None = None
        while True:
            page = await self._request(
                "GET",
                resource.path(namespace),
                label_selector=label_selector,
                limit=self.page_size,
                _continue=token,
            )
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def apply(self, obj: KubeObject, *, subresource: str | None = None) -> KubeObject:
        """Server-side apply as our field manager (`kubeinfer`), forcing ownership of conflicts:
        the operator is the only writer of what it renders."""
        resource = RESOURCES[obj["kind"]]
        meta = obj["metadata"]
        return await self._request(
            "PATCH",
            resource.path(meta["namespace"], meta["name"], subresource),
            body=obj,
            content_type="application/apply-patch+yaml",
            field_manager=self.field_manager,
            force_conflicts=True,
        )

    async def json_patch(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        operations: JsonPatch,
        *,
        subresource: str | None = None,
    ) -> KubeObject:
        """An RFC 6902 JSON patch (use a `test` operation for optimistic concurrency).

        A patch the API server cannot apply to the stored object (a `test` operation
        failed, or an operation's path does not exist) is a 422 Invalid whose message names
        neither ("the server rejected our request due to an error in our request") and
        which has no causes: it is raised with a message that says so."""
        target = f"{resource.plural}/{name}" + (f"/{subresource}" if subresource else "")
        try:
            return await self._request(
                "PATCH",
                resource.path(namespace, name, subresource),
                body=operations,
                content_type="application/json-patch+json",
                field_manager=self.field_manager,
            )
        except ApiError as error:
            if error.status != 422 or error.causes:
                raise
            raise ApiError(
                422,
                error.reason,
                f"JSON patch of {namespace}/{target} not applied: a test operation failed "
                f"or a path it names does not exist (the server said: {error.message})",
            ) from None

    async def strategic_patch(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        body: KubeObject,
        *,
        subresource: str | None = None,
    ) -> KubeObject:
        """A strategic merge patch: lists merge by their key (a pod's conditions by
        type), so one entry is set without reading or replacing the others."""
        return await self._request(
            "PATCH",
            resource.path(namespace, name, subresource),
            body=body,
            content_type="application/strategic-merge-patch+json",
            field_manager=self.field_manager,
        )

    async def create(self, obj: KubeObject) -> KubeObject:
        resource = RESOURCES[obj["kind"]]
        return await self._request(
            "POST",
            resource.path(obj["metadata"]["namespace"]),
            body=obj,
            field_manager=self.field_manager,
        )

    async def replace(self, obj: KubeObject) -> KubeObject:
        """PUT: replaces the object if it is still at its `metadata.resourceVersion` (a
        409 Conflict otherwise)."""
        resource = RESOURCES[obj["kind"]]
        meta = obj["metadata"]
        return await self._request(
            "PUT",
            resource.path(meta["namespace"], meta["name"]),
            body=obj,
            field_manager=self.field_manager,
        )

    async def delete(self, resource: ResourceType, namespace: str, name: str) -> bool:
        """Deletes in the background (dependents are garbage-collected); False if absent."""
        try:
            await self._request(
                "DELETE", resource.path(namespace, name), propagation_policy=BACKGROUND
            )
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True


def _api_client_of(info: object) -> ApiClient:
    if not isinstance(info, kopf.ConnectionInfo):
        raise TypeError(f"Unsupported credentials for the API client: {type(info).__name__}")
    return api_client_for(info)


def _from_refusal(error: DynamicApiError) -> ApiError:
    """The API server's Status (reason, message) and Retry-After, as an ApiError."""
    text = error.body.decode() if isinstance(error.body, bytes) else (error.body or "")
    try:
        payload = json.loads(text) if text else {}
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    details = payload.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return ApiError(
        int(error.status or 0),
        str(payload.get("reason") or error.reason or "Error"),
        str(payload.get("message") or text[:500]),
        retry_after_seconds(error),
        tuple(
            f"{cause.get('field', '')}: {cause.get('message', '')}"
            for cause in causes or []
            if isinstance(cause, dict)
        ),
    )
