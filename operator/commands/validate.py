"""`kubeinfer validate FILE...`: offline validation of InferenceDeployment manifests.

Prints every problem as `file: field.path: message` and exits 1 if there is any; a YAML
syntax error, a missing or unreadable file, a file that is not UTF-8 or a document of
another kind is reported the same way, and every file is checked whatever the others
hold. Files are read as the API server will read them (`api.manifest_loader`: YAML 1.2,
no duplicate keys, bounded aliases and nesting), so what passes here is what the cluster
receives.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO


def validate_file(path: Path) -> tuple[list[str], list[str]]:
    """Returns (problems, summaries of valid documents) for one file."""
    from kubeinfer.operator.api.manifest_loader import ManifestSyntaxError, load_documents
    from kubeinfer.operator.api.v1alpha1.validation import (
        InvalidManifest,
        parse_inference_deployment,
    )

    try:
        data = path.read_bytes()
    except OSError as error:
        return [f"{path}: cannot read: {error.strerror or error}"], []
    try:
        documents = load_documents(data)
    except ManifestSyntaxError as error:
        return [f"{path}: {error}"], []
    if not documents:
        return [f"{path}: no YAML document in the file"], []
    problems: list[str] = []
    valid: list[str] = []
    for index, document in enumerate(documents):
        where = f"{path}" if len(documents) == 1 else f"{path}[{index}]"
        try:
            manifest = parse_inference_deployment(document)
        except InvalidManifest as invalid:
            problems.extend(f"{where}: {error}" for error in invalid.errors)
            continue
        spec = manifest.spec
        valid.append(
            f"{where}: valid InferenceDeployment {manifest.metadata.name} "
            f"(model {spec.model.name}:{spec.model.version}, "
            f"{spec.engine.backend}/{spec.engine.precision})"
        )
    return problems, valid


def run(paths: list[Path], out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    failed = False
    for path in paths:
        problems, valid = validate_file(path)
        for line in problems:
            print(line, file=err)
        for line in valid:
            print(line, file=out)
        failed = failed or bool(problems)
    return 1 if failed else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate", help="validate InferenceDeployment manifests offline"
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.set_defaults(handler=lambda args: run(args.files))
