"""`kubeinfer crds`: prints the CRD generated from the models; `--write` refreshes the
committed copies, `--check` fails when they are stale."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kubeinfer.contract.generated_files import write_or_check


def run(write: bool, check: bool, root: Path) -> int:
    from kubeinfer.operator.crdgen.crd import CRD_FILE, HELM_CRD_FILE, render_crd_yaml

    text = render_crd_yaml()
    if not (write or check):
        sys.stdout.write(text)
        return 0
    files = {str(CRD_FILE): text, str(HELM_CRD_FILE): text}
    return write_or_check(files, root, write=write, command="kubeinfer crds --write")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("crds", help="print the InferenceDeployment CRD")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write crds/ and the Helm chart copy")
    mode.add_argument("--check", action="store_true", help="exit 1 if the committed CRDs are stale")
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root")
    parser.set_defaults(handler=lambda args: run(args.write, args.check, args.root))
