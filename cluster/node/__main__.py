"""`python -m kubeinfer.cluster.node`: the node agent, as `kubeinfer cluster up` starts it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import yaml
from kubeinfer.cluster.binaries import pinned_versions
from kubeinfer.cluster.network import claim_subnet
from kubeinfer.cluster.node.agent import NodeAgent
from kubeinfer.cluster.node.api import NodeApi
from kubeinfer.cluster.node.images import ImageConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kubeinfer.cluster.node")
    parser.add_argument("--kubeconfig", required=True, help="the node's credentials")
    parser.add_argument("--directory", required=True, type=Path, help="pods' files and logs")
    parser.add_argument("--ca-file", required=True, type=Path, help="the cluster CA (for pods)")
    parser.add_argument("--node-name", default="kubeinfer-node")
    parser.add_argument(
        "--kubelet-cert",
        type=Path,
        default=None,
        help="serving certificate of the logs endpoint (with --kubelet-key)",
    )
    parser.add_argument("--kubelet-key", type=Path, default=None)
    parser.add_argument(
        "--pod-network",
        required=True,
        help="the locally routed network; the node claims a /24 of it",
    )
    parser.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu to advertise")
    parser.add_argument("--cpus", default=None, help="allocatable CPU (default: the machine's)")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="IMAGE=PROGRAM",
        help="run IMAGE's containers as PROGRAM (a path, or a console script of this Python)",
    )
    parser.add_argument(
        "--crash-loop-backoff-seconds",
        type=float,
        default=10.0,
        help="first restart delay of a crashed container (the kubelet's is 10 s)",
    )
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    extra = {}
    for item in args.image:
        image, _, program = item.partition("=")
        extra[image] = ImageConfig((program,))
    subnet = claim_subnet(args.pod_network)
    kubeconfig = yaml.safe_load(await asyncio.to_thread(Path(args.kubeconfig).read_text))
    server = kubeconfig["clusters"][0]["cluster"]["server"]
    api = await NodeApi.from_kubeconfig(args.kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    agent = NodeAgent(
        api,
        name=args.node_name,
        directory=args.directory.resolve(),
        server=server,
        ca_file=args.ca_file.resolve(),
        kubernetes_version=pinned_versions().kubernetes,
        pod_cidr=subnet.cidr,
        gpus=args.gpus,
        cpus=args.cpus,
        extra_images=extra,
        backoff_initial_seconds=args.crash_loop_backoff_seconds,
        kubelet_tls=(args.kubelet_cert, args.kubelet_key, args.ca_file)
        if args.kubelet_cert and args.kubelet_key
        else None,
    )
    try:
        await agent.run(stop)
    finally:
        await api.close()
        subnet.release()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(main(parse_args()))
    except KeyboardInterrupt:
        sys.exit(130)
