"""`kubeinfer activator`: hold the requests of InferenceDeployments scaled to zero until one
of their pods is ready, then forward them (issue 44), until SIGTERM.

While an InferenceDeployment has no serving pod, the operator points its public Service at
the activator's pods and writes a route table (`--routes-file`, JSON: `{"routes":
[{"namespace", "service", "models", "backendHost", "httpPort", "grpcPort"}]}`) into the
ConfigMap they mount; the activator re-reads it when its content changes. Each request is
held in a bounded queue per route (`--max-held-requests`) until the route's backend answers
its readiness, then forwarded as it came, over HTTP (`--port`) or gRPC (`--grpc-port`).
Past the bound a request is refused at once with 503 and Retry-After, before its body is
read; past `--hold-timeout-seconds` from its arrival, with 503 too: never left hanging.
`--wake-url` is told (a POST of `{"namespace", "service"}`, at most once a second a route)
when a route with no ready backend holds a request. `GET /v2/activator` shows each route's
held requests, what the operator reads to scale from zero; `GET /metrics` its series
(`kubeinfer_activator_*`).

SIGTERM or SIGINT stops accepting; held requests go on waiting for their backends until
`--drain-grace-period-seconds`, then are refused with 503; forwarded ones are answered.

Each flag can also be set by `KUBEINFER_ACTIVATOR_<FLAG>` (`KUBEINFER_ACTIVATOR_PORT=8000`);
the flag wins. Exit codes: 0 after the drain; 2 for an invalid flag; 1 when the activator
cannot start (a port taken, the extension not built), its message on stderr and in the
container's termination message where the kubelet made one.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kubeinfer.contract.runtime_config import UNSIZED_REQUEST_BYTES
from kubeinfer.runtime import command_settings
from pydantic import Field, field_validator
from pydantic_settings import (
    SettingsConfigDict,
)

log = logging.getLogger("kubeinfer.activator")

TERMINATION_LOG = Path("/dev/termination-log")
TERMINATION_MESSAGE_LIMIT = 4000
"""Kubernetes keeps at most 4096 bytes of a termination message."""


class ActivatorSettings(command_settings.FlagsThenEnvironment):
    """`kubeinfer activator`'s flags, each also read from `KUBEINFER_ACTIVATOR_<FLAG>`
    (`--max-held-requests`: `KUBEINFER_ACTIVATOR_MAX_HELD_REQUESTS`); a flag wins over its
    variable."""

    model_config = SettingsConfigDict(
        env_prefix="KUBEINFER_ACTIVATOR_",
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        cli_kebab_case=True,
        cli_hide_none_type=True,
    )

    routes_file: Path
    """the route table (JSON), re-read when its content changes; missing: no routes"""
    host: str = "0.0.0.0"
    """listen address"""
    port: int = Field(default=8000, ge=0, le=65535)
    """HTTP port (0: any free one)"""
    grpc_port: int | None = Field(default=None, ge=0, le=65535)
    """gRPC (h2c) port; unset: no gRPC"""
    max_held_requests: int = Field(default=256, ge=1, le=1_000_000)
    """requests held at once for one route; the next is refused with 503 at once"""
    hold_timeout_seconds: float = Field(default=120, gt=0, le=3600)
    """longest a request is held, from its arrival, before it is refused with 503"""
    wake_url: str | None = None
    """an http:// URL told (POST {"namespace", "service"}) when a route with no ready
    backend holds a request, at most once a second a route"""
    max_request_bytes: int = Field(default=UNSIZED_REQUEST_BYTES, ge=1024)
    """largest request body held (413 beyond); held bodies are kept whole"""
    probe_interval_milliseconds: int = Field(default=100, ge=1, le=60_000)
    """how often a route with held requests asks its backend's readiness"""
    retry_after_seconds: int = Field(default=1, ge=0, le=3600)
    """the Retry-After of the activator's 503s"""
    drain_grace_period_seconds: float = Field(default=30, ge=0, le=3600)
    """after SIGTERM, how long held requests may still wait for their backends"""

    @field_validator("wake_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        """The activator posts over plain HTTP only (an in-cluster Service)."""
        if value is not None and not value.startswith("http://"):
            raise ValueError("must be an http:// URL")
        return value


def settings_from_args(args: argparse.Namespace) -> ActivatorSettings:
    """The flags parsed by `kubeinfer activator`'s parser, over `KUBEINFER_ACTIVATOR_*`; raises
    ValueError naming each bad flag and its variable."""
    return command_settings.from_args(ActivatorSettings, args)


def activator_options(settings: ActivatorSettings) -> dict[str, Any]:
    """`ActivatorOptions` (crates/server/src/activator/options.rs, camelCase) for
    `settings`."""
    return {
        "host": settings.host,
        "httpPort": settings.port,
        "grpcPort": settings.grpc_port,
        "routesFile": str(settings.routes_file),
        "maxHeldRequestsPerRoute": settings.max_held_requests,
        "holdTimeoutSeconds": settings.hold_timeout_seconds,
        "maxRequestBytes": settings.max_request_bytes,
        "probeIntervalMilliseconds": settings.probe_interval_milliseconds,
        "retryAfterSeconds": settings.retry_after_seconds,
        "wakeUrl": settings.wake_url,
        "drainGracePeriodSeconds": settings.drain_grace_period_seconds,
    }


class CannotStart(Exception):
    """The activator could not start: its message says why."""


def start_activator(options: dict[str, Any]) -> Any:
    """`kubeinfer_dataplane.Activator`, listening; `CannotStart` saying why not."""
    try:
        import kubeinfer_dataplane
    except ImportError as error:
        raise CannotStart(
            f"the Rust data plane is not installed ({error}); build it with `make dataplane`"
        ) from None
    try:
        return kubeinfer_dataplane.Activator(json.dumps(options))
    except (RuntimeError, ValueError) as error:  # the activator's own sentence
        raise CannotStart(str(error)) from None


def _fail_to_start(message: str, code: int) -> int:
    """Says why the activator did not start, on stderr and in the kubelet's termination
    message file where it exists."""
    print(f"kubeinfer activator: {message}", file=sys.stderr)
    if TERMINATION_LOG.is_file():
        one_line = message.strip().replace(":\n", ": ").replace("\n", "; ")
        try:
            TERMINATION_LOG.write_text(f"error: {one_line}"[:TERMINATION_MESSAGE_LIMIT])
        except OSError as error:
            print(f"kubeinfer activator: cannot write {TERMINATION_LOG}: {error}", file=sys.stderr)
    return code


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = settings_from_args(args)
    except ValueError as error:
        return _fail_to_start(f"invalid configuration:\n{error}", 2)
    try:
        activator = start_activator(activator_options(settings))
    except CannotStart as error:
        return _fail_to_start(str(error), 1)
    return _serve(activator, settings)


def _serve(activator: Any, settings: ActivatorSettings) -> int:
    """Serves until SIGTERM or SIGINT, then drains (`--drain-grace-period-seconds`)."""
    stop = threading.Event()
    previous = {n: signal.signal(n, lambda *_: stop.set()) for n in _STOP_SIGNALS}
    try:
        log.info(
            "Serving the activator port=%d grpc_port=%s routes_file=%s max_held_requests=%d "
            "hold_timeout_seconds=%g",
            activator.http_port, activator.grpc_port, settings.routes_file,
            settings.max_held_requests, settings.hold_timeout_seconds,
        )  # fmt: skip
        while not stop.wait(1.0):  # a timed wait, so the signal handler runs promptly
            pass
    finally:
        # The activator logs its drain (what it held, how long it took).
        activator.shutdown(settings.drain_grace_period_seconds)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "activator",
        help="hold the requests of scaled-to-zero models until a pod is ready, then forward them",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command_settings.attach(parser, ActivatorSettings, run)
