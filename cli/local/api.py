"""`kubeinfer up`'s door to the API server: plain-dict requests and watches through the
official `kubernetes.aio` client (its kubeconfig loader, TLS and connection pool; its
dynamic client's `request` builds each call)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from kubernetes.aio import config as kube_config
from kubernetes.aio.client import ApiClient, Configuration
from kubernetes.aio.dynamic import DynamicClient
from kubernetes.aio.dynamic.exceptions import DynamicApiError

log = logging.getLogger(__name__)
KubeObject = dict[str, Any]
USER_AGENT = "kubeinfer-up"
TIMEOUT_SECONDS = 30.0

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class NodeApi:
    """Requests as the identity of the kubeconfig it was made from."""

    def __init__(self, client: ApiClient) -> None:
        self._client = client
        self._dynamic = DynamicClient(client)

    @classmethod
    async def from_kubeconfig(cls, path: str) -> NodeApi:
        configuration = Configuration()
        await kube_config.load_kube_config(config_file=path, client_configuration=configuration)
        client = ApiClient(configuration)
        client.user_agent = USER_AGENT
        return cls(client)

    async def close(self) -> None:
        await self._client.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str | None = None,
        accept: str | None = None,
        **query: Any,
    ) -> KubeObject:
        """One call; `accept` asks for another representation (a Table, say)."""
        params = [(key, value) for key, value in query.items() if value is not None]
        headers = {"Accept": accept} if accept else {}
        try:
            response = await self._dynamic.request(
                method,
                path,
                body=body,
                content_type=content_type,
                query_params=params,
                header_params=headers,
                serialize=False,
                _request_timeout=TIMEOUT_SECONDS,
            )
            raw = await response.read()
        except DynamicApiError as error:
            raise ApiError(error.status, _message(error.body)) from None
        except (OSError, TimeoutError) as error:
            raise ApiError(0, str(error) or type(error).__name__) from None
        return json.loads(raw) if raw else {}

    async def get(self, path: str) -> KubeObject | None:
        try:
            return await self.request("GET", path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def watch(self, path: str, **query: Any) -> AsyncIterator[tuple[str, KubeObject]]:
        """List, then watch from the list's resourceVersion; again from a fresh list when
        the server says the version is too old (410). Yields ("SYNC", list) after each
        list, then (type, object) per event."""
        while True:
            listing = await self.request("GET", path, **query)
            version = listing["metadata"]["resourceVersion"]
            yield "SYNC", listing
            try:
                async for kind, obj in self._stream(path, version, query):
                    if kind == "BOOKMARK":
                        version = obj["metadata"]["resourceVersion"]
                        continue
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    yield kind, obj
            except ApiError as error:
                if error.status not in (0, 410, 500, 503, 504):
                    raise
                log.info("Watch of %s ended (%s); listing again", path, error)
                await asyncio.sleep(0.2)

    async def _stream(
        self, path: str, version: str, query: dict[str, Any]
    ) -> AsyncIterator[tuple[str, KubeObject]]:
        params = [(k, v) for k, v in query.items() if v is not None] + [
            ("watch", "true"),
            ("resourceVersion", version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", "240"),
        ]
        while True:
            try:
                response = await self._dynamic.request(
                    "GET", path, query_params=params, serialize=False, _request_timeout=300
                )
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        status = event["object"]
                        raise ApiError(int(status.get("code", 500)), status.get("message", ""))
                    yield event["type"], event["object"]
            except DynamicApiError as error:
                raise ApiError(error.status, _message(error.body)) from None
            except (OSError, TimeoutError) as error:
                raise ApiError(0, str(error) or type(error).__name__) from None
            return  # the server closed the watch at its timeout: list again, to be safe


def _message(body: Any) -> str:
    try:
        return str(json.loads(body).get("message", body))
    except (TypeError, ValueError, AttributeError):
        return str(body)
