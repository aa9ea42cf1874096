"""The part of the kubelet's API that the API server proxies to: container logs, so
`kubectl logs` (with `--previous`, `--tail`, `-f`) works on this node's pods.

It listens with TLS on the port the Node advertises (`daemonEndpoints.kubeletEndpoint`),
and only the API server gets in: a client certificate signed by the cluster CA is
required, as a kubelet with webhook-free x509 authentication would. Logs are the files
the pod worker writes, `logs/<container>-<restart>.log`: the latest is the running (or
last) container's, the one before it `--previous`.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

LOG_NAME = re.compile(r"^(?P<container>.+)-(?P<restart>\d+)\.log$")
FOLLOW_POLL_SECONDS = 0.2


def container_logs(pod_directory: Path, container: str) -> dict[int, Path]:
    """The container's log files by restart count."""
    found = {}
    for path in (pod_directory / "logs").glob(f"{container}-*.log"):
        match = LOG_NAME.match(path.name)
        if match and match.group("container") == container:
            found[int(match.group("restart"))] = path
    return found


def tail(data: bytes, lines: int | None, limit_bytes: int | None) -> bytes:
    if lines is not None:
        data = b"".join(data.splitlines(keepends=True)[-lines:]) if lines > 0 else b""
    if limit_bytes is not None:
        data = data[:limit_bytes]
    return data


class KubeletServer:
    """`pod_directory(namespace, name)` finds a pod's files; `running(namespace, name,
    container)` says whether its container may still write (for `-f`)."""

    def __init__(
        self,
        pod_directory: Callable[[str, str], Path | None],
        running: Callable[[str, str, str], bool],
        cert: Path,
        key: Path,
        ca: Path,
    ) -> None:
        self.pod_directory, self.running = pod_directory, running
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        self.context.load_cert_chain(str(cert), str(key))
        self.context.verify_mode = ssl.CERT_REQUIRED
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str = "127.0.0.1") -> int:
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, 0, ssl_context=self.context)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        namespace, pod = request.match_info["namespace"], request.match_info["pod"]
        container = request.match_info["container"]
        directory = self.pod_directory(namespace, pod)
        if directory is None:
            raise web.HTTPNotFound(text=f'pod "{pod}" not found on this node')
        files = container_logs(directory, container)
        previous = request.query.get("previous") in ("true", "1")
        # As the kubelet: the current log is the latest container that started (a crashed
        # one's while it waits to restart), the previous the one before it.
        latest = max(files, default=-1)
        wanted = latest - 1 if previous else latest
        if wanted not in files:
            if previous:
                text = f'previous terminated container "{container}" in pod "{pod}" not found'
            else:
                text = f'container "{container}" in pod "{pod}" is waiting to start'
            raise web.HTTPBadRequest(text=text)
        path = files[wanted]
        try:
            lines = int(request.query["tailLines"]) if "tailLines" in request.query else None
            limit = int(request.query["limitBytes"]) if "limitBytes" in request.query else None
        except ValueError:
            raise web.HTTPBadRequest(text="tailLines and limitBytes are integers") from None
        data = await asyncio.to_thread(path.read_bytes)
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(tail(data, lines, limit))
        if request.query.get("follow") in ("true", "1") and not previous:
            offset = len(data)
            while True:
                size = path.stat().st_size
                if size > offset:
                    with path.open("rb") as file:
                        file.seek(offset)
                        chunk = file.read(size - offset)
                    offset = size
                    await response.write(chunk)
                elif not self.running(namespace, pod, container):
                    break
                else:
                    await asyncio.sleep(FOLLOW_POLL_SECONDS)
        await response.write_eof()
        return response
