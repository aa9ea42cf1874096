"""The running operator logs in again when its token is revoked.

The operator logs in with a ServiceAccount token bound to a Secret of its own; deleting
the Secret revokes the token, which the real API server then refuses (401) at every new
request. The operator has reconciled an InferenceDeployment by then and kopf's watches,
opened before, keep streaming, so kopf itself has no reason to log in again: only the
operator's client meets the 401 (its resync passes, the pass after a child's deletion),
and it must empty kopf's credentials vault, which it shares, to send kopf back to its
login handler for a second token. The deleted child is then recreated with that token.

Also the audit-log helpers that tell one token's requests from another's: the API server
records a service-account token's `jti` claim as the request's credential id.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from cluster_harness import LocalCluster, path_of
from kubeinfer.operator.kube.client import USER_AGENT
from operator_harness import (
    IDS,
    OPERATOR_ACCOUNT,
    Model,
    World,
    eventually,
    manifest,
    start_operator,
)

PIN = "sha256:" + "b" * 64
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


def audit_events(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Every request in the audit log, once, as the API server wrote it: a watch when its
    response started, a request refused before authentication (401) then too, every
    other request once it completed."""
    events = []
    path = cluster.audit.path
    if not path.exists():
        return []
    with path.open() as lines:
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written
            code = (event.get("responseStatus") or {}).get("code")
            started_only = event.get("verb") == "watch" or code == 401
            if event.get("stage") == ("ResponseStarted" if started_only else "ResponseComplete"):
                events.append(event)
    return events


def credential_of(token: str) -> str:
    """The credential id the audit log records for a service-account token."""
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return f"JTI={claims['jti']}"


def made_with(event: dict[str, Any], token: str) -> bool:
    extra = (event.get("user") or {}).get("extra") or {}
    return extra.get(CREDENTIAL_ID) == [credential_of(token)]


def bound_token(world: World, secret: str) -> str:
    """A token of the operator's ServiceAccount bound to a new Secret `secret`: valid until
    that Secret is deleted."""
    created = world.kube.create(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret}}
    )
    issued = world.kube.request(
        "POST",
        path_of("v1", "serviceaccounts", world.namespace, OPERATOR_ACCOUNT, "token"),
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "name": secret,
                    "uid": created["metadata"]["uid"],
                },
            },
        },
    )
    return str(issued["status"]["token"])


def refused(world: World, token: str) -> bool:
    """Whether the API server refuses `token` now (a GET the operator's Role allows)."""
    request = urllib.request.Request(
        world.cluster.server + path_of(*IDS, world.namespace, "absent"),
        headers={"Authorization": f"Bearer {token}"},
    )
    context = ssl.create_default_context(cafile=str(world.cluster.ca_file))
    try:
        urllib.request.urlopen(request, context=context, timeout=10).close()
    except urllib.error.HTTPError as error:
        return error.code == 401
    return False


async def test_a_revoked_token_sends_the_operator_back_to_its_login(
    world: World, tiny: Model
) -> None:
    issued: list[str] = []

    def login() -> str:
        issued.append(bound_token(world, f"operator-login-{len(issued) + 1}"))
        return issued[-1]

    async with start_operator(world, tokens=login):
        world.create(manifest(tiny, engine={"pin": PIN}))
        service = await eventually(lambda: world.one("v1", "services"), 60, "the Service")
        assert len(issued) == 1
        world.kube.delete("v1", "secrets", "operator-login-1")
        # The API server keeps a token's authentication for 10 s: wait for it to lapse.
        await eventually(
            lambda: refused(world, issued[0]), within=30, what="the server to refuse the token"
        )
        world.kube.delete("v1", "services", service["metadata"]["name"])
        await eventually(
            lambda: (
                (world.one("v1", "services") or service)["metadata"]["uid"]
                != service["metadata"]["uid"]
            ),
            within=60,
            what="the Service recreated, after a new login",
        )
    assert len(issued) >= 2
    ours = [
        e
        for e in audit_events(world.cluster)
        if (e.get("objectRef") or {}).get("namespace") == world.namespace
    ]
    client_refused = [
        e for e in ours if e["responseStatus"]["code"] == 401 and e.get("userAgent") == USER_AGENT
    ]
    assert client_refused, "the operator's client met the revoked token's 401"
    services_created = [
        e
        for e in ours
        if (e.get("objectRef") or {}).get("resource") == "services"
        and e["verb"] == "patch"
        and e["responseStatus"]["code"] == 201
    ]
    assert len(services_created) == 2
    assert made_with(services_created[0], issued[0])
    assert made_with(services_created[1], issued[1]), "recreated with the second login's token"
