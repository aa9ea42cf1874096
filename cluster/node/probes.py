"""Container probes as the kubelet runs them: one try of an httpGet, tcpSocket or exec
probe, and the loop that applies a probe's delay, period, timeout and thresholds.

An httpGet succeeds on a status from 200 to 399 (redirects are not followed); a
tcpSocket when the connection opens; an exec when its command exits 0. gRPC probes are
not supported here and always fail, with that said in the message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

Runner = Callable[[Sequence[str], float], Awaitable[int]]
"""Runs an exec probe's command in the container's environment, returning its exit code."""


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"port {port!r} is not a port of container {container.get('name')!r}")


async def probe_once(
    probe: Mapping[str, Any], pod_ip: str, container: Mapping[str, Any], run: Runner
) -> tuple[bool, str]:
    """(succeeded, the kubelet's message when it did not)."""
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            action = probe["httpGet"]
            port = resolve_port(action["port"], container)
            scheme = str(action.get("scheme") or "HTTP").lower()
            url = f"{scheme}://{action.get('host') or pod_ip}:{port}{action.get('path') or '/'}"
            headers = {h["name"]: h["value"] for h in action.get("httpHeaders") or []}
            session_timeout = aiohttp.ClientTimeout(total=timeout)
            async with aiohttp.ClientSession(timeout=session_timeout) as session:
                async with session.get(
                    url, headers=headers, allow_redirects=False, ssl=False
                ) as response:
                    if 200 <= response.status < 400:
                        return True, ""
                    return False, f"HTTP probe failed with statuscode: {response.status}"
        if "tcpSocket" in probe:
            action = probe["tcpSocket"]
            port = resolve_port(action["port"], container)
            host = action.get("host") or pod_ip
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True, ""
        if "exec" in probe:
            code = await run(probe["exec"].get("command") or [], timeout)
            return code == 0, "" if code == 0 else f"command exited with {code}"
        if "grpc" in probe:
            return False, "grpc probes are not supported by the kubeinfer node agent"
        return False, "probe has no handler"
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
        kind = "HTTP" if "httpGet" in probe else "TCP" if "tcpSocket" in probe else "Exec"
        return False, f"{kind} probe failed: {error or type(error).__name__}"


async def probe_loop(
    probe: Mapping[str, Any],
    attempt: Callable[[], Awaitable[tuple[bool, str]]],
    report: Callable[[bool, str], None],
) -> None:
    """Runs `attempt` on the probe's schedule and calls `report(result, message)` each time
    the result crosses a threshold (successThreshold successes or failureThreshold
    failures in a row). Runs until cancelled."""
    await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
    period = float(probe.get("periodSeconds") or 10)
    successes_needed = int(probe.get("successThreshold") or 1)
    failures_allowed = int(probe.get("failureThreshold") or 3)
    successes = failures = 0
    reported: bool | None = None
    while True:
        ok, message = await attempt()
        if ok:
            successes, failures = successes + 1, 0
            if successes >= successes_needed and reported is not True:
                reported = True
                report(True, "")
        else:
            successes, failures = 0, failures + 1
            if failures >= failures_allowed and reported is not False:
                reported = False
                report(False, message)
            elif failures >= failures_allowed:
                report(False, message)  # liveness acts on every failure past the threshold
        await asyncio.sleep(period)
