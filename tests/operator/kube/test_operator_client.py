"""The API client on the official `kubernetes.aio` transport, against the real API server,
directly or through the fault proxy (`fault_proxy`) for what the server will not do on
demand:

- a request the proxy hangs is cut at the client's timeout, as a retryable ApiError;
- a 429's Retry-After reaches the delay handed to kopf;
- lists come in pages and every page is read (the real server, a small `limit`, more
  matching ConfigMaps than one page holds);
- a 401 (the proxy refusing a revoked token) empties kopf's credentials vault: the
  credential is replaced by a new login, the old session closed, and the request goes
  through, once, with the new one; a client on one fixed connection raises the real
  server's 401 instead;
- the reconciler forgets what it kept for an object once the object is gone.

The whole operator logging in again after its token is revoked is in
`test_operator_relogin.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import pytest
from cluster_harness import LocalCluster
from fault_proxy import FaultProxy
from kubeinfer.operator.controller import Reconciler
from kubeinfer.operator.kube.client import (
    CONFIGMAP,
    SERVICE,
    VAULT_PURPOSE,
    ApiError,
    KubeClient,
    Vault,
    api_client_for,
)
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from operator_harness import IDS, Model, World, eventually, manifest
from test_operator_apply import FULL_ACCESS, PIN, connection, full_access_token
from test_operator_relogin import audit_events


def configmap(namespace: str, name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {"k": name},
    }


@pytest.fixture
async def proxy(local_cluster: LocalCluster) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(local_cluster) as proxy:
        yield proxy


async def test_a_hung_request_fails_at_the_timeout(world: World, proxy: FaultProxy) -> None:
    proxy.hang(lambda request: request.resource == "configmaps")
    token = await asyncio.to_thread(full_access_token, world)
    async with KubeClient(proxy.connection(token), timeout_seconds=0.3) as client:
        # The proxy never answers: an ApiError at all is the client's own timeout (the
        # wait_for's would raise TimeoutError).
        with pytest.raises(ApiError) as failed:
            await asyncio.wait_for(client.get(CONFIGMAP, world.namespace, "any"), timeout=60)
        # The rest goes through to the server, which answers.
        assert await client.get(SERVICE, world.namespace, "absent") is None
    assert (failed.value.status, failed.value.reason) == (0, "Timeout")
    assert failed.value.retryable
    answered = [(s.request.resource, s.status, s.by_rule) for s in proxy.seen]
    assert answered == [("configmaps", 0, True), ("services", 404, False)]


async def test_retry_after_of_a_429_is_the_delay_before_the_next_try(
    world: World, proxy: FaultProxy
) -> None:
    proxy.throttle(lambda request: request.method == "PATCH", retry_after=7)
    token = await asyncio.to_thread(full_access_token, world)
    async with KubeClient(proxy.connection(token)) as client:
        with pytest.raises(ApiError) as throttled:
            await client.apply(configmap(world.namespace, "a"))
    assert (throttled.value.status, throttled.value.reason) == (429, "TooManyRequests")
    assert throttled.value.retry_after_seconds == 7.0
    assert throttled.value.retry_delay_seconds == 7.0
    conflict, forbidden = ApiError(409, "Conflict", "x"), ApiError(403, "Forbidden", "")
    assert conflict.retry_delay_seconds < forbidden.retry_delay_seconds


async def test_lists_are_read_in_pages_and_every_page_is_read(world: World) -> None:
    for index in range(7):
        world.kube.create(configmap(world.namespace, f"cm-{index}", app="x"))
    world.kube.create(configmap(world.namespace, "other", app="y"))
    token = await asyncio.to_thread(full_access_token, world)
    async with KubeClient(connection(world, token), page_size=3) as client:
        found = await client.list(CONFIGMAP, world.namespace, "app=x")
    assert sorted(o["metadata"]["name"] for o in found) == [f"cm-{i}" for i in range(7)]

    # What the real server was asked: pages of at most 3, each after the previous one's
    # continue token (3 + 3 + 1).
    def pages() -> list[dict[str, list[str]]]:
        return [
            query
            for query in list_queries(world.cluster, world.namespace, FULL_ACCESS)
            if query.get("labelSelector") == ["app=x"]
        ]

    await eventually(lambda: len(pages()) >= 3, what="the list requests in the audit log")
    await asyncio.sleep(0.5)  # not a wait: a page requested after the last would be audited by now
    assert [q["limit"] for q in pages()] == [["3"]] * 3
    assert ["continue" in q for q in pages()] == [False, True, True]


def list_queries(cluster: LocalCluster, namespace: str, account: str) -> list[dict[str, list[str]]]:
    """The query of each LIST of ConfigMaps `account` made, from the audit log (whose
    request URI keeps it)."""
    user = f"system:serviceaccount:{namespace}:{account}"
    queries = []
    for event in audit_events(cluster):
        ref = event.get("objectRef") or {}
        if (
            event.get("verb") == "list"
            and ref.get("resource") == "configmaps"
            and (event.get("user") or {}).get("username") == user
        ):
            queries.append(parse_qs(event["requestURI"].partition("?")[2]))
    return queries


async def cached_api_client(vault: Vault) -> Any:
    """The client's ApiClient as the vault holds it for the current credential."""
    async for _, _, api in vault.extended(api_client_for, VAULT_PURPOSE):
        return api
    raise AssertionError("no credential")


async def test_a_401_logs_in_again_and_closes_the_old_session(
    world: World, proxy: FaultProxy
) -> None:
    vault = Vault()
    logins: list[str] = []

    async def authenticator() -> None:  # what kopf's authenticator does with the vault
        while True:
            await vault.wait_for_emptiness()
            logins.append(await asyncio.to_thread(full_access_token, world))
            await vault.populate({"login": proxy.connection(logins[-1])})

    filling = asyncio.create_task(authenticator())
    client = KubeClient(vault)
    try:
        assert await client.get(CONFIGMAP, world.namespace, "absent") is None
        first = await cached_api_client(vault)
        revoked = logins[0]
        proxy.refuse(lambda request: request.token == revoked)
        await client.apply(configmap(world.namespace, "after-revocation"))
        second = await cached_api_client(vault)
    finally:
        filling.cancel()
        await vault.close()
    assert len(logins) == 2 and logins[0] != logins[1]
    assert second is not first
    assert first.rest_client.pool_manager is None or first.rest_client.pool_manager.closed
    assert world.kube.get("v1", "configmaps", "after-revocation") is not None
    patches = [(s.request.token, s.status) for s in proxy.seen if s.request.method == "PATCH"]
    assert patches == [(logins[0], 401), (logins[1], 201)], "the refused write was sent again, once"


async def test_a_fixed_connection_raises_the_401(world: World) -> None:
    """The real server's own 401, for a token it never issued: a client on one fixed
    connection has nothing to log in again with."""
    async with KubeClient(connection(world, "not-a-token")) as client:
        with pytest.raises(ApiError) as refused:
            await client.get(CONFIGMAP, world.namespace, "any")
    assert (refused.value.status, refused.value.reason) == (401, "Unauthorized")
    assert not refused.value.retryable


async def test_the_reconciler_forgets_an_object_once_it_is_gone(world: World, tiny: Model) -> None:
    settings = OperatorSettings(requeue={"resync_interval_seconds": 60})
    async with KubeClient(connection(world, world.token())) as client:
        reconciler = Reconciler(client, settings)
        try:
            for name in ("a", "b"):
                world.create(manifest(tiny, name, engine={"pin": PIN}))
                await reconciler.reconcile(world.namespace, name)
            assert reconciler.tracked() == {(world.namespace, "a"), (world.namespace, "b")}
            world.kube.delete(*IDS, "a")
            outcome = await reconciler.reconcile(world.namespace, "a")
            assert outcome.decision is None
            assert reconciler.tracked() == {(world.namespace, "b")}
        finally:
            await reconciler.close()
    deployments = [d["metadata"]["name"] for d in world.children(("apps/v1", "deployments"))]
    assert names.runtime_name("b") in deployments, "b, still tracked, keeps its children"


async def test_a_pass_whose_status_write_is_throttled_is_tried_again_after_the_servers_delay(
    world: World, tiny: Model, proxy: FaultProxy
) -> None:
    """The reconciler's own retry: a 429 with Retry-After 1 on the status write fails the
    pass, and the next one comes after that second, not at the resync a minute later."""
    settings = OperatorSettings(requeue={"resync_interval_seconds": 60})
    status_write = lambda request: request.method == "PATCH" and request.path.endswith("/status")  # noqa: E731
    proxy.throttle(status_write, retry_after=1)
    world.create(manifest(tiny, "a", engine={"pin": PIN}))
    async with KubeClient(proxy.connection(world.token(), world.namespace)) as client:
        reconciler = Reconciler(client, settings)
        try:
            reconciler.trigger(world.namespace, "a", 0.0)
            await eventually(lambda: any(s.by_rule for s in proxy.seen), 30, "a throttled write")
            proxy.clear()
            status = await eventually(
                lambda: (world.infd("a") or {}).get("status"), 15, "the status, on the retry"
            )
        finally:
            await reconciler.close()
    assert status["observedGeneration"] == 1
    throttled = [s for s in proxy.seen if s.by_rule]
    assert throttled and all(status_write(s.request) for s in throttled)
