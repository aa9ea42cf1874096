"""`kubeinfer rbac`: prints the operator's RBAC Role or ClusterRole (`kubeinfer.operator.rbac`
holds the rules), its nodes' ClusterRole, the suspect nodes' taint ClusterRole, the leader
election's Role, or the Helm chart's
`templates/rbac.yaml`."""

from __future__ import annotations

import argparse
import sys

import yaml
from kubeinfer.operator.rbac import (
    DEFAULT_LEASE_NAME,
    helm_template,
    lease_role_document,
    node_role_document,
    node_taint_role_document,
    role_document,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rbac",
        help="print the operator's RBAC Role or ClusterRole",
        description="Prints the Role (with --namespace) or ClusterRole holding exactly the "
        "permissions the operator uses.",
    )
    parser.add_argument("--namespace", help="print a Role in this namespace")
    parser.add_argument("--name", default="kubeinfer-operator", help="the role's name")
    parser.add_argument(
        "--leader-election",
        action="store_true",
        help="also print the Role for leader election's Lease (kubeinfer operator "
        "--leader-election)",
    )
    parser.add_argument("--lease-name", default=DEFAULT_LEASE_NAME, help="the Lease's name")
    parser.add_argument(
        "--lease-namespace", help="the operator's own namespace (default: --namespace)"
    )
    parser.add_argument(
        "--taint-suspect-nodes",
        action="store_true",
        help="also print the ClusterRole that lets the operator taint suspect nodes "
        "(KUBEINFER_KNOWN_ANSWERS__TAINT_SUSPECT_NODES=true)",
    )
    parser.add_argument(
        "--helm", action="store_true", help="print the Helm chart's templates/rbac.yaml"
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.helm:
        print(helm_template(), end="")
        return 0
    documents = [role_document(args.name, args.namespace), node_role_document(f"{args.name}-nodes")]
    if args.taint_suspect_nodes:
        documents.append(node_taint_role_document(f"{args.name}-node-taints"))
    if args.leader_election:
        namespace = args.lease_namespace or args.namespace
        if not namespace:
            print("kubeinfer rbac: --leader-election needs --lease-namespace", file=sys.stderr)
            return 2
        name = f"{args.name}-leader-election"
        documents.append(lease_role_document(name, namespace, args.lease_name))
    print(yaml.safe_dump_all(documents, sort_keys=False), end="")
    return 0
