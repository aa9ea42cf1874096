"""The operator's I/O with the activator (docs/scale-to-zero.md): reading its pods'
routes and held requests, writing its route table, and the wake an activator sends when
it holds a request for an object at zero.

`ActivatorReader.read` lists the ready activator pods and asks each its /v2/activator,
at once, each bounded by the metrics timeout; the answer is shared by every pass for a
second (a fleet's passes read it once), and a wake drops it, so the pass the wake starts
sees the request that woke it.

`RouteTable` keeps one route per object with minReplicas 0 in the ConfigMap the activator
pods mount (`routes.json`). It starts from what the ConfigMap holds, so an operator that
restarts never drops the route of an object it has not reconciled yet, and it writes
only when the table changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

import aiohttp
from kubeinfer.operator.kube.client import CONFIGMAP, POD, KubeClient
from kubeinfer.operator.settings import Activator
from kubeinfer.operator.state import names
from kubeinfer.operator.state.activator_view import ActivatorPod, ActivatorView, pod_of, ready_pods

logger = logging.getLogger(__name__)

SHARED_READ_SECONDS = 1.0
"""How long one read of the activator pods serves every pass."""
ROUTES_KEY = "routes.json"
ROUTES_COMPONENT = "activator-routes"
"""The route table ConfigMap's `app.kubernetes.io/component` (it is found by it)."""


def activator_namespace(settings: Activator) -> str:
    """Where the activator runs: its setting, else the operator's own namespace."""
    return settings.namespace_or(os.environ.get("POD_NAMESPACE"))


class ActivatorReader:
    def __init__(self, client: KubeClient, settings: Activator, timeout_seconds: float) -> None:
        self.client, self.settings, self.timeout_seconds = client, settings, timeout_seconds
        self.namespace = activator_namespace(settings)
        self._last: tuple[float, asyncio.Task[ActivatorView]] | None = None
        self._session: aiohttp.ClientSession | None = None

    def forget(self) -> None:
        """The next read asks the pods again (a wake came in)."""
        self._last = None

    async def read(self) -> ActivatorView:
        now = time.monotonic()
        if self._last is None or now - self._last[0] > SHARED_READ_SECONDS:
            self._last = (now, asyncio.ensure_future(self._read()))
        return await asyncio.shield(self._last[1])

    async def _read(self) -> ActivatorView:
        try:
            pods = await self.client.list(POD, self.namespace, self.settings.pod_selector)
        except Exception as error:  # the API's own errors: said in the condition
            return ActivatorView(error=str(error) or type(error).__name__)
        ready = ready_pods(pods)
        return ActivatorView(tuple(await asyncio.gather(*(self._ask(*p) for p in ready))))

    async def _ask(self, name: str, address: str) -> ActivatorPod:
        url = f"http://{address}:{self.settings.http_port}/v2/activator"
        try:
            async with self._client().get(url) as response:
                if response.status != 200:
                    return ActivatorPod(name, address, error=f"{url} answered {response.status}")
                return pod_of(name, address, await response.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            return ActivatorPod(name, address, error=f"{url}: {str(error) or type(error).__name__}")

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.timeout_seconds)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class RouteTable:
    """The activator's route table, one entry per (namespace, object)."""

    def __init__(self, client: KubeClient, settings: Activator) -> None:
        self.client, self.settings = client, settings
        self.namespace = activator_namespace(settings)
        self._routes: dict[tuple[str, str], dict[str, Any]] | None = None
        self._written = ""
        self._lock = asyncio.Lock()

    async def set(self, key: tuple[str, str], route: dict[str, Any] | None) -> None:
        """`key`'s route is `route` (None: it has none); the ConfigMap is written when
        the table changed."""
        if route is None and self._routes is None:
            # Nothing to remove from a table not read: an operator whose objects never
            # scale to zero never reads or needs the activator's namespace.
            return
        async with self._lock:
            routes = await self._loaded()
            if routes.get(key) == route:
                return
            if route is None:
                routes.pop(key, None)
            else:
                routes[key] = route
            await self._write(routes)

    async def _loaded(self) -> dict[tuple[str, str], dict[str, Any]]:
        if self._routes is None:
            self._routes = await self._read()
        return self._routes

    async def _read(self) -> dict[tuple[str, str], dict[str, Any]]:
        selector = f"{names.LABEL_COMPONENT}={ROUTES_COMPONENT}"
        found = await self.client.list(CONFIGMAP, self.namespace, selector)
        mine = [c for c in found if c["metadata"]["name"] == self.settings.routes_config_map]
        text = ((mine[0].get("data") or {}).get(ROUTES_KEY) or "") if mine else ""
        self._written = text
        try:
            entries = json.loads(text).get("routes", []) if text else []
            return {(e["namespace"], e["service"]): e for e in entries}
        except (ValueError, AttributeError, KeyError, TypeError):
            logger.warning("the activator's route table held no route list; starting empty")
            return {}

    async def _write(self, routes: dict[tuple[str, str], dict[str, Any]]) -> None:
        text = json.dumps({"routes": [routes[k] for k in sorted(routes)]}, sort_keys=True)
        if text == self._written:
            return
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.settings.routes_config_map,
                "namespace": self.namespace,
                "labels": {
                    names.LABEL_NAME: names.APP_NAME,
                    names.LABEL_COMPONENT: ROUTES_COMPONENT,
                    names.LABEL_MANAGED_BY: names.MANAGED_BY,
                },
            },
            "data": {ROUTES_KEY: text},
        }
        await self.client.apply(body)
        self._written = text
