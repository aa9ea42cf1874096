"""The API client on the official `kubernetes.aio` transport, against the emulated API
server over HTTP: a hung request is cut at the timeout; a 429's Retry-After reaches the
delay handed to kopf; lists come in pages and all of them are read; a 401 empties kopf's
credentials vault, the credential is replaced by a new login and its session closed,
and the request goes through with the new one; a fixed connection raises the 401; and
the reconciler forgets what it kept for an object once the object is gone. The whole
operator logging in again after its token is revoked is in `test_operator_relogin.py`."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp.web
import kopf
import pytest
from emulator import ApiCall
from kmock._internal import rendering
from kubeinfer.operator.handlers import retry_delay
from kubeinfer.operator.kube.client import (
    CONFIGMAP,
    VAULT_PURPOSE,
    ApiError,
    KubeClient,
    Vault,
    api_client_for,
)
from kubeinfer.operator.reconcile import names
from kubeinfer.operator.reconciler import Reconciler
from kubeinfer.operator.settings import OperatorSettings
from operator_harness import NAMESPACE, World, digest_of, manifest


def configmap(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "data": {"k": name},
    }


async def test_a_hung_request_fails_at_the_timeout(world: World) -> None:
    async def hang(request: rendering.Request, call: ApiCall) -> None:
        if call.resource == "configmaps":
            await asyncio.Event().wait()

    world.api.interceptors.append(hang)
    connection = kopf.ConnectionInfo(server=world.url)
    async with KubeClient(connection, timeout_seconds=0.3) as client:
        started = time.monotonic()
        with pytest.raises(ApiError) as failed:
            await asyncio.wait_for(client.get(CONFIGMAP, NAMESPACE, "any"), timeout=5)
        elapsed = time.monotonic() - started
    assert (failed.value.status, failed.value.reason) == (0, "Timeout")
    assert failed.value.retryable
    assert elapsed < 1.5


async def test_retry_after_of_a_429_is_the_delay_handed_to_kopf(world: World) -> None:
    async def throttle(request: rendering.Request, call: ApiCall) -> aiohttp.web.Response:
        response = world.api._status_response(429, "TooManyRequests", "slow down")
        response.headers["Retry-After"] = "7"
        return response

    world.api.interceptors.append(throttle)
    async with KubeClient(kopf.ConnectionInfo(server=world.url)) as client:
        with pytest.raises(ApiError) as throttled:
            await client.apply(configmap("a"))
    assert throttled.value.status == 429
    assert throttled.value.retry_after_seconds == 7.0
    assert retry_delay(throttled.value) == 7.0
    assert retry_delay(ApiError(409, "Conflict", "x")) < retry_delay(ApiError(403, "Forbidden", ""))


async def test_lists_are_read_in_pages_and_every_page_is_read(world: World) -> None:
    for index in range(7):
        world.api.create("configmaps", configmap(f"cm-{index}", app="x"))
    world.api.create("configmaps", configmap("other", app="y"))
    async with KubeClient(kopf.ConnectionInfo(server=world.url), page_size=3) as client:
        found = await client.list(CONFIGMAP, NAMESPACE, "app=x")
    assert sorted(o["metadata"]["name"] for o in found) == [f"cm-{i}" for i in range(7)]
    assert world.api.list_pages and max(world.api.list_pages) <= 3


async def cached_api_client(vault: Vault) -> Any:
    """The client's ApiClient as the vault holds it for the current credential."""
    async for _, _, api in vault.extended(api_client_for, VAULT_PURPOSE):
        return api
    raise AssertionError("no credential")


async def test_a_401_logs_in_again_and_closes_the_old_session(world: World) -> None:
    vault = Vault()
    logins: list[str] = []

    async def authenticator() -> None:  # what kopf's authenticator does with the vault
        while True:
            await vault.wait_for_emptiness()
            token = f"token-{len(logins) + 1}"
            logins.append(token)
            await vault.populate({"login": kopf.ConnectionInfo(server=world.url, token=token)})

    filling = asyncio.create_task(authenticator())
    client = KubeClient(vault)
    try:
        assert await client.get(CONFIGMAP, NAMESPACE, "absent") is None
        first = await cached_api_client(vault)
        world.api.revoked.add("token-1")
        await client.apply(configmap("after-revocation"))
        second = await cached_api_client(vault)
    finally:
        filling.cancel()
        await vault.close()
    assert logins == ["token-1", "token-2"]
    assert second is not first
    assert first.rest_client.pool_manager is None or first.rest_client.pool_manager.closed
    assert world.api.get("v1", "configmaps", NAMESPACE, "after-revocation") is not None
    users = [call.user for call in world.api.calls if call.verb == "patch"]
    assert users == ["token-1", "token-2"], "the refused write was sent again, once"


async def test_a_fixed_connection_raises_the_401(world: World) -> None:
    world.api.revoked.add("old")
    connection = kopf.ConnectionInfo(server=world.url, token="old")
    async with KubeClient(connection) as client:
        with pytest.raises(ApiError) as refused:
            await client.get(CONFIGMAP, NAMESPACE, "any")
    assert refused.value.status == 401
    assert not refused.value.retryable


async def test_the_reconciler_forgets_an_object_once_it_is_gone(world: World) -> None:
    settings = OperatorSettings(resync_interval_seconds=60)
    async with KubeClient(kopf.ConnectionInfo(server=world.url)) as client:
        reconciler = Reconciler(client, settings)
        try:
            for name in ("a", "b"):
                world.api.create(
                    "inferencedeployments", manifest(name, engine={"pin": digest_of(name)})
                )
                await reconciler.reconcile(NAMESPACE, name)
            assert reconciler.tracked() == {(NAMESPACE, "a"), (NAMESPACE, "b")}
            world.api.delete("kubeinfer.io/v1alpha1", "inferencedeployments", NAMESPACE, "a")
            outcome = await reconciler.reconcile(NAMESPACE, "a")
            assert outcome.decision is None
            assert reconciler.tracked() == {(NAMESPACE, "b")}
            assert world.one("apps/v1", "deployments")["metadata"]["name"] == names.runtime_name(
                "b"
            )
        finally:
            await reconciler.close()
