"""The `kubeinfer` console script: one entry point, a subcommand per job.

Each subcommand lives in the module that owns its concept and registers itself here
through a `register(subparsers)` function; its handler imports what it needs when it
runs, so `kubeinfer validate` never loads ONNX Runtime and `kubeinfer serve` never loads
kopf. Handlers return the process exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kubeinfer.operator import commands as operator_commands
from kubeinfer.runtime import commands as runtime_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubeinfer",
        description="A Kubernetes operator for GPU inference deployments.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    operator_commands.register(subparsers)
    runtime_commands.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
