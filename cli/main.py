"""The `kubeinfer` console script: one entry point, a subcommand per job.

Each subcommand lives in the package that owns its concept and registers itself here
through a `register(subparsers)` function: the operator's (`operator`, `validate`,
`render`, `crds`, `rbac`, `promote`, `abort`), the runtime's (`serve`, `build`), the
local cluster's (`cluster`), the local mode's (`up`, `down`), the demo (`demo`) and the
batcher's tuning sweep (`tune`). A handler imports what it needs when it runs, so `kubeinfer
validate` never loads ONNX Runtime and `kubeinfer serve` never loads kopf, nor the operator's
API models and settings: every process builds the whole parser, so a registration imports only
what its arguments need (tests/test_packaging.py). Handlers return the process exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kubeinfer.cli.demo import command as demo_command
from kubeinfer.cli.local import commands as local_commands
from kubeinfer.cli.tune import command as tune_command
from kubeinfer.cluster import commands as cluster_commands
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
    cluster_commands.register(subparsers)
    local_commands.register(subparsers)
    demo_command.register(subparsers)
    tune_command.register(subparsers)
    return parser


EXTRA_OF_MODULE = {
    "kopf": "operator",
    "kubernetes": "operator",
    "ruamel": "operator",
    "requests": "operator",
    "numpy": "runtime",
    "onnx": "runtime",
    "onnxruntime": "runtime",
    "orjson": "runtime",
    "tensorrt": "gpu",
    "pycuda": "gpu",
    "pynvml": "gpu",
    "cryptography": "local",
}
"""Which extra (pyproject.toml) installs each side's own libraries: the operator image has
only `operator`, the runtime image only `runtime` (or `gpu`), and a command of the other
side says which extra it needs instead of failing with a traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ModuleNotFoundError as error:
        extra = EXTRA_OF_MODULE.get((error.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"kubeinfer {args.command}: needs {error.name}, which this installation lacks; "
            f"it comes with the {extra} extra: pip install 'kubeinfer[{extra}]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
