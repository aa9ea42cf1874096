"""`kubeinfer operator`: runs the kopf operator.

    kubeinfer operator [--namespace NS ...] [--all-namespaces] [--standalone | --peering NAME]

Namespaced (`--namespace`, repeatable, or `KUBEINFER_NAMESPACES`) or cluster-wide
(`--all-namespaces`, also the default when no namespace is named). `--standalone` runs
one replica without kopf's peering; `--peering NAME` lets several replicas share the
work, one active at a time (needs kopf's peering CRDs and `kubeinfer rbac --peering`).
Credentials are found the way kopf finds them: the in-cluster service account, else
KUBECONFIG.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from kubeinfer.operator.settings import InvalidSettings, OperatorSettings

if TYPE_CHECKING:
    import kopf
    from kubeinfer.operator.handlers import Login

if TYPE_CHECKING:
    pass


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
        help="watch this namespace (repeatable, exact names); default: KUBEINFER_NAMESPACES or all",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--standalone", action="store_true", help="one replica, no peering (the default)"
    )
    peering.add_argument(
        "--peering", metavar="NAME", help="coordinate replicas through kopf peering NAME"
    )
    parser.add_argument(
        "--liveness", metavar="URL", help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log at debug level")
    parser.set_defaults(handler=_run)


def scope_of(args: argparse.Namespace, settings: OperatorSettings) -> tuple[bool, list[str]]:
    """(cluster-wide?, namespaces) from the flags, then the settings."""
    if args.all_namespaces:
        return True, []
    namespaces = list(args.namespace or settings.namespaces)
    return not namespaces, namespaces


async def run_operator(
    settings: OperatorSettings,
    *,
    clusterwide: bool,
    namespaces: Collection[str],
    peering_name: str | None = None,
    liveness_endpoint: str | None = None,
    login: Login | None = None,
    kopf_settings: kopf.OperatorSettings | None = None,
    **kopf_options: Any,
) -> None:
    """Runs kopf with the operator's handlers until it is stopped (`stop_flag` and the
    other `kopf.operator` options pass through). `login` and `kopf_settings` replace
    kopf's credential discovery and default settings (the tests use both)."""
    import kopf
    from kubeinfer.operator.handlers import configure_kopf, register

    registry = kopf.OperatorRegistry()
    register(registry, settings, login=login)
    await kopf.operator(
        registry=registry,
        settings=configure_kopf(kopf_settings or kopf.OperatorSettings()),
        clusterwide=clusterwide,
        namespaces=list(namespaces),
        standalone=peering_name is None,
        peering_name=peering_name,
        liveness_endpoint=liveness_endpoint,
        **kopf_options,
    )


def _run(args: argparse.Namespace) -> int:
    try:
        settings = OperatorSettings.from_env()
    except InvalidSettings as error:
        print(f"kubeinfer operator: {error}", file=sys.stderr)
        return 2
    import logging

    import kopf

    kopf.configure(verbose=args.verbose, log_prefix=True)
    try:  # the check kopf's login makes, once, so that a missing kubeconfig is one line
        kopf.login_via_client(logger=logging.getLogger(__name__), settings=kopf.OperatorSettings())
    except kopf.LoginError as error:
        print(f"kubeinfer operator: no Kubernetes credentials: {error}", file=sys.stderr)
        return 1
    clusterwide, namespaces = scope_of(args, settings)
    asyncio.run(
        run_operator(
            settings,
            clusterwide=clusterwide,
            namespaces=namespaces,
            peering_name=args.peering,
            liveness_endpoint=args.liveness,
        )
    )
    return 0
