"""The running operator logs in again when its token is refused: the emulated API server
refuses the token the operator started with, to the operator's own client only (kopf's
watches keep working, so kopf has no reason of its own to log in again), and an
InferenceDeployment created after that still gets its children, written with the token
of a second login through kopf's login handler: the client's 401 emptied kopf's
credentials vault, which it shares."""

from __future__ import annotations

import aiohttp.web
from emulator import ApiCall
from kmock._internal import rendering
from kubeinfer.operator.kube.client import USER_AGENT
from operator_harness import World, digest_of, eventually, manifest, start_operator


async def test_a_revoked_token_sends_the_operator_back_to_its_login(world: World) -> None:
    issued: list[str] = []

    def tokens() -> str:
        issued.append(f"token-{len(issued) + 1}")
        return issued[-1]

    async def refuse(request: rendering.Request, call: ApiCall) -> aiohttp.web.Response | None:
        ours = request.headers.get("User-Agent") == USER_AGENT
        if ours and call.user == "token-1":
            return world.api._status_response(401, "Unauthorized", "Unauthorized")
        return None

    async with start_operator(world, tokens=tokens):
        assert issued == ["token-1"]
        world.api.interceptors.append(refuse)
        world.api.create("inferencedeployments", manifest(engine={"pin": digest_of("relogin")}))
        await eventually(
            lambda: world.one("apps/v1", "deployments") and world.one("v1", "services"),
            within=10,
            what="the children, written after a new login",
        )
    assert issued[:2] == ["token-1", "token-2"]
    refused = [c for c in world.api.calls if c.user == "token-1" and c.verb == "get"]
    assert refused, "the first token was refused at least once"
    writers = {c.user for c in world.api.writes() if c.resource == "deployments"}
    assert writers == {"token-2"}
