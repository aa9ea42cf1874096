"""A fault-injecting reverse proxy in front of the test cluster's real API server.

The real kube-apiserver answers what it answers: it will not hang a request, throttle
one with a chosen Retry-After, or refuse one token to one client while another client
keeps using it, on demand. `FaultProxy` sits on loopback between a client and the API
server and forwards every request unchanged (bodies, the bearer token, and streaming
responses: a watch flows through as the server writes it), except the requests a rule
matches, which it answers itself:

- `hang(matches)`: never answered (until the proxy closes), for a client's timeout;
- `throttle(matches, retry_after)`: 429 TooManyRequests with `Retry-After`, the Status
  body the API server's own flow control sends;
- `refuse(matches)`: 401 Unauthorized, as for a revoked token.

Its front is TLS with a certificate for 127.0.0.1 signed by the cluster's own CA, so a
client configured with the cluster's CA file verifies it as it verifies the API server:
only the address changes. Requests are authenticated upstream by the bearer token they
carry (a client certificate ends at the proxy's TLS), which is how the operator logs in.
`seen` records every request with what it was answered.

    async with FaultProxy(local_cluster) as proxy:
        proxy.hang(lambda request: request.resource == "configmaps")
        connection = proxy.connection(token)  # a kopf.ConnectionInfo through the proxy
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import aiohttp
import aiohttp.web
import kopf
from cluster_harness import LocalCluster
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",  # recomputed, or chunked, by aiohttp on each leg
    }
)


@dataclass(frozen=True)
class Request:
    """What a rule decides on: one request as the proxy received it."""

    method: str
    path: str
    query: str
    user_agent: str
    token: str
    """The bearer token it carried ('' without one)."""

    @property
    def resource(self) -> str:
        """The plural of a resource path (`/api/v1/namespaces/x/configmaps/y` → configmaps),
        '' for other paths."""
        parts = [p for p in self.path.split("/") if p]
        if not parts or parts[0] not in ("api", "apis"):
            return ""
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        return rest[0] if rest else ""


@dataclass(frozen=True)
class Seen:
    """A request the proxy handled and the status it was answered with (0: hung, or the
    client went away first)."""

    request: Request
    status: int
    by_rule: bool
    """Answered by a rule, not by the API server."""


Matcher = Callable[[Request], bool]


@dataclass(frozen=True)
class _Rule:
    matches: Matcher
    status: int  # 0: hang
    reason: str = ""
    message: str = ""
    headers: tuple[tuple[str, str], ...] = ()


def _status_body(code: int, reason: str, message: str, details: dict[str, object]) -> bytes:
    """A `Status`, as the API server sends with every refusal."""
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }
    return json.dumps(status).encode()


def serving_certificate(cluster: LocalCluster, directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (and localhost) signed by the cluster's CA, and its key:
    (certificate path, key path) in `directory`."""
    pki = cluster.cluster.pki
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fault-proxy")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    cert_path, key_path = directory / "proxy.crt", directory / "proxy.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


class FaultProxy:
    """The proxy, started by `async with` (or `start()`/`close()`); see the module."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.url = ""
        self.seen: list[Seen] = []
        self._rules: list[_Rule] = []
        self._closing = asyncio.Event()
        self._files = tempfile.TemporaryDirectory(prefix="fault-proxy-")
        self._runner: aiohttp.web.AppRunner | None = None
        self._upstream: aiohttp.ClientSession | None = None

    # -- rules ---------------------------------------------------------------------------
    def hang(self, matches: Matcher) -> None:
        self._rules.append(_Rule(matches, 0))

    def throttle(self, matches: Matcher, retry_after: int) -> None:
        self._rules.append(
            _Rule(
                matches,
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                (("Retry-After", str(retry_after)),),
            )
        )

    def refuse(self, matches: Matcher) -> None:
        self._rules.append(_Rule(matches, 401, "Unauthorized", "Unauthorized"))

    def clear(self) -> None:
        """Forwards everything again."""
        self._rules.clear()

    def connection(self, token: str, namespace: str | None = None) -> kopf.ConnectionInfo:
        """kopf's connection info for a client that goes through the proxy."""
        return kopf.ConnectionInfo(
            server=self.url,
            ca_path=str(self.cluster.ca_file),
            token=token,
            default_namespace=namespace,
        )

    # -- life ----------------------------------------------------------------------------
    async def start(self) -> str:
        cert, key = serving_certificate(self.cluster, Path(self._files.name))
        front = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        front.load_cert_chain(cert, key)
        back = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        # auto_decompress off: a gzipped answer is passed on as it came, with its header.
        self._upstream = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=back, limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
        )
        app = aiohttp.web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._handle)
        # Hung requests are released at close; a watch ends when the upstream closes.
        self._runner = aiohttp.web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=front)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"https://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        self._closing.set()
        if self._upstream is not None:
            await self._upstream.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self._files.cleanup()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # -- forwarding ----------------------------------------------------------------------
    async def _handle(self, incoming: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        authorization = incoming.headers.get("Authorization", "")
        request = Request(
            method=incoming.method,
            path=incoming.path,
            query=incoming.query_string,
            user_agent=incoming.headers.get("User-Agent", ""),
            token=authorization.removeprefix("Bearer ").strip()
            if authorization.startswith("Bearer ")
            else "",
        )
        rule = next((r for r in self._rules if r.matches(request)), None)
        if rule is not None:
            return await self._answer(request, rule)
        return await self._forward(incoming, request)

    async def _answer(self, request: Request, rule: _Rule) -> aiohttp.web.StreamResponse:
        if rule.status == 0:
            self.seen.append(Seen(request, 0, by_rule=True))
            await self._closing.wait()
            return aiohttp.web.Response(status=503)
        details: dict[str, object] = {}
        for name, value in rule.headers:
            if name == "Retry-After":
                details["retryAfterSeconds"] = int(value)
        self.seen.append(Seen(request, rule.status, by_rule=True))
        return aiohttp.web.Response(
            status=rule.status,
            body=_status_body(rule.status, rule.reason, rule.message, details),
            headers={"Content-Type": "application/json", **dict(rule.headers)},
        )

    async def _forward(
        self, incoming: aiohttp.web.Request, request: Request
    ) -> aiohttp.web.StreamResponse:
        assert self._upstream is not None
        headers = {k: v for k, v in incoming.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await incoming.read()
        target = self.cluster.server + incoming.path_qs
        try:
            upstream = await self._upstream.request(
                incoming.method, target, headers=headers, data=body or None, allow_redirects=False
            )
        except (aiohttp.ClientError, RuntimeError):  # RuntimeError: the session closed
            self.seen.append(Seen(request, 0, by_rule=False))
            return aiohttp.web.Response(status=502)
        self.seen.append(Seen(request, upstream.status, by_rule=False))
        async with upstream:
            response = aiohttp.web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(incoming)
            # Chunk by chunk as the server writes them: a watch's events arrive as they
            # happen, not when the watch ends.
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                await response.write_eof()
        return response
