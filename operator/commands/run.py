"""`kubeinfer operator`: runs the kopf operator.

    kubeinfer operator [--namespace NS ...] [--all-namespaces]
                       [--standalone | --leader-election [--lease-name N] [--lease-namespace NS]]

Namespaced (`--namespace`, repeatable, or `KUBEINFER_WATCHING__NAMESPACES`) or cluster-wide
(`--all-namespaces`, also the default when no namespace is named). `--standalone` (the
default) runs one replica. `--leader-election` lets several replicas run, one reconciling
at a time: the holder of a coordination.k8s.io/v1 Lease (`kube.leader_election`), in the
operator's own namespace (`--lease-namespace`, else `POD_NAMESPACE`, else the service
account's namespace). A replica that loses the Lease exits with status 1, to restart as
a standby. kopf's own peering is not offered: it pauses kopf's handlers but not the
reconciler's own requeues, so a paused replica would still write.
Credentials are found the way kopf finds them: the in-cluster service account, else
KUBECONFIG.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import socket
import sys
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubeinfer.operator.rbac import DEFAULT_LEASE_NAME

if TYPE_CHECKING:
    import kopf
    from kubeinfer.operator.handlers import Login
    from kubeinfer.operator.kube.leader_election import Election
    from kubeinfer.operator.settings import OperatorSettings
    from kubeinfer.operator.telemetry.exporter import StatusBoard

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the operator (reconciles InferenceDeployments)",
        description="Runs the kopf operator that reconciles InferenceDeployments into "
        "engine build Jobs, runtime Deployments, ConfigMaps and Services.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable, exact names); "
        "default: KUBEINFER_WATCHING__NAMESPACES or all",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    replicas = parser.add_mutually_exclusive_group()
    replicas.add_argument(
        "--standalone", action="store_true", help="one replica, no election (the default)"
    )
    replicas.add_argument(
        "--leader-election",
        action="store_true",
        help="several replicas: only the holder of a Lease reconciles",
    )
    parser.add_argument(
        "--lease-name", default=DEFAULT_LEASE_NAME, help=f"the Lease (default {DEFAULT_LEASE_NAME})"
    )
    parser.add_argument(
        "--lease-namespace",
        metavar="NS",
        help="the Lease's namespace (default: POD_NAMESPACE, else the service account's)",
    )
    parser.add_argument(
        "--liveness", metavar="URL", help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve the operator's own metrics at :PORT/metrics (each InferenceDeployment's "
        "conditions and replicas); off by default",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log at debug level")
    parser.set_defaults(handler=_run)


def scope_of(args: argparse.Namespace, settings: OperatorSettings) -> tuple[bool, list[str]]:
    """(cluster-wide?, namespaces) from the flags, then the settings."""
    if args.all_namespaces:
        return True, []
    namespaces = list(args.namespace or settings.watching.namespaces)
    return not namespaces, namespaces


async def run_operator(
    settings: OperatorSettings,
    *,
    clusterwide: bool,
    namespaces: Collection[str],
    election: Election | None = None,
    liveness_endpoint: str | None = None,
    metrics_port: int | None = None,
    login: Login | None = None,
    kopf_settings: kopf.OperatorSettings | None = None,
    stop_flag: asyncio.Event | None = None,
    board: StatusBoard | None = None,
    **kopf_options: Any,
) -> None:
    """Runs kopf with the operator's handlers until `stop_flag` is set or kopf stops (the
    other `kopf.operator` options pass through). With `election`, kopf runs only while
    this replica holds the Lease (LeadershipLost is raised when it loses it). With
    `metrics_port`, the operator's own metrics are served there for the whole run, standby
    included (`kubeinfer.operator.telemetry.exporter`). `login` and `kopf_settings` replace kopf's
    credential discovery and default settings (the tests use both); `board` receives each
    pass's status and the operator's counters (a new one by default)."""
    from kubeinfer.operator.telemetry.exporter import StatusBoard, board_registry, serve_metrics

    board = board if board is not None else StatusBoard()
    if metrics_port is not None:
        async with serve_metrics(board_registry(board), metrics_port, board=board):
            await _run_operator(settings, clusterwide, namespaces, election, liveness_endpoint,
                                login, kopf_settings, stop_flag, board, kopf_options)  # fmt: skip
        return
    await _run_operator(settings, clusterwide, namespaces, election, liveness_endpoint, login,
                        kopf_settings, stop_flag, board, kopf_options)  # fmt: skip


async def _run_operator(
    settings: OperatorSettings,
    clusterwide: bool,
    namespaces: Collection[str],
    election: Election | None,
    liveness_endpoint: str | None,
    login: Login | None,
    kopf_settings: kopf.OperatorSettings | None,
    stop_flag: asyncio.Event | None,
    board: StatusBoard | None,
    kopf_options: dict[str, Any],
) -> None:
    import kopf
    from kubeinfer.operator.handlers import configure_kopf, register
    from kubeinfer.operator.kube.client import Vault
    from kubeinfer.operator.kube.leader_election import run_as_leader

    login_fn = login or kopf.login_via_client
    configured = configure_kopf(kopf_settings or kopf.OperatorSettings())

    async def run_kopf(stop: asyncio.Event | None) -> None:
        vault = Vault()  # kopf logs in into it; the operator's client reads it
        registry = kopf.OperatorRegistry()
        context = register(registry, settings, login=login_fn, vault=vault, board=board)
        try:
            await kopf.operator(
                registry=registry,
                settings=configured,
                clusterwide=clusterwide,
                namespaces=list(namespaces),
                standalone=True,
                liveness_endpoint=liveness_endpoint,
                vault=vault,
                stop_flag=stop,
                **kopf_options,
            )
        finally:  # also when cancelled: no requeue of the reconciler's outlives kopf
            await context.close()
            await vault.close()
            if board is not None:  # a standby reports no object
                board.clear()

    if election is None:
        await run_kopf(stop_flag)
        return

    async def login_once() -> kopf.ConnectionInfo | None:
        import logging

        result = login_fn(logger=logging.getLogger("kopf.activities.authentication"),
                          settings=configured)  # fmt: skip
        return await result if asyncio.iscoroutine(result) else result  # type: ignore[return-value]

    await run_as_leader(run_kopf, election, login_once, stop_flag or asyncio.Event())


def election_of(args: argparse.Namespace, settings: OperatorSettings) -> Election | None:
    """The Lease and this replica's identity (`POD_NAME` or the host name, plus a random
    suffix as client-go adds), or None without `--leader-election`. Raises InvalidSettings
    when the Lease's namespace cannot be found."""
    from kubeinfer.operator.kube.leader_election import Election
    from kubeinfer.operator.settings import InvalidSettings

    if not args.leader_election:
        return None
    namespace = args.lease_namespace or os.environ.get("POD_NAMESPACE")
    if not namespace and SERVICE_ACCOUNT_NAMESPACE.exists():
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    if not namespace:
        raise InvalidSettings(
            "--leader-election: name the Lease's namespace with --lease-namespace or POD_NAMESPACE"
        )
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return Election(
        namespace=namespace,
        name=args.lease_name,
        identity=f"{host}_{uuid.uuid4().hex[:8]}",
        lease_duration_seconds=settings.leader_election.lease_duration_seconds,
        renew_deadline_seconds=settings.leader_election.renew_deadline_seconds,
        retry_period_seconds=settings.leader_election.retry_period_seconds,
    )


async def _serve(
    settings: OperatorSettings,
    election: Election | None,
    clusterwide: bool,
    namespaces: list[str],
    liveness: str | None,
    metrics_port: int | None = None,
) -> None:
    """`run_operator` with SIGTERM and SIGINT stopping it, also while a standby (kopf,
    once running, installs its own handlers for both)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await run_operator(
        settings,
        clusterwide=clusterwide,
        namespaces=namespaces,
        election=election,
        liveness_endpoint=liveness,
        metrics_port=metrics_port,
        stop_flag=stop if election is not None else None,
    )


GC_THRESHOLDS = (50_000, 20, 100)
"""Python's cyclic garbage collector's thresholds in the operator process (the defaults
are 700, 10, 10). The operator keeps every watched object in kopf's indexes and turns
each watch event into new objects, so with the defaults the collector walked that large,
growing heap so often that it took about a quarter of the operator's CPU on a fleet,
inside whatever allocated (kopf's parsing of watch events, in profiles). Collected this
much less often it costs about a tenth, for some more peak memory (docs/fleet.md)."""


def tune_garbage_collector() -> None:
    gc.set_threshold(*GC_THRESHOLDS)


def _run(args: argparse.Namespace) -> int:
    from kubeinfer.operator.settings import InvalidSettings, OperatorSettings

    try:
        settings = OperatorSettings.from_env()
    except InvalidSettings as error:
        print(f"kubeinfer operator: {error}", file=sys.stderr)
        return 2
    try:
        election = election_of(args, settings)
    except InvalidSettings as error:
        print(f"kubeinfer operator: {error}", file=sys.stderr)
        return 2
    import logging

    import kopf

    kopf.configure(verbose=args.verbose, log_prefix=True)
    if not args.verbose:
        # kopf logs "Handler ... succeeded." at INFO for every watch event it hands to a
        # handler: tens of thousands of lines with a fleet, saying nothing the operator's
        # own log and status do not. Warnings and errors still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:  # the check kopf's login makes, once, so that a missing kubeconfig is one line
        kopf.login_via_client(logger=logging.getLogger(__name__), settings=kopf.OperatorSettings())
    except kopf.LoginError as error:
        print(f"kubeinfer operator: no Kubernetes credentials: {error}", file=sys.stderr)
        return 1
    clusterwide, namespaces = scope_of(args, settings)
    from kubeinfer.operator.kube.leader_election import LeadershipLost

    tune_garbage_collector()

    try:
        asyncio.run(
            _serve(settings, election, clusterwide, namespaces, args.liveness, args.metrics_port)
        )
    except LeadershipLost as lost:
        print(f"kubeinfer operator: {lost}; exiting to restart as a standby", file=sys.stderr)
        return 1
    except kopf.LoginError as error:
        print(f"kubeinfer operator: no Kubernetes credentials: {error}", file=sys.stderr)
        return 1
    return 0
