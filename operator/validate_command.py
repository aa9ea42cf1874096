"""`kubeinfer validate FILE...`: offline validation of InferenceDeployment manifests.

Prints every problem as `file: field.path: message` and exits 1 if there is any; a YAML
syntax error, a missing file or a document of another kind is reported the same way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

import yaml
from kubeinfer.operator.api.v1alpha1.validation import InvalidManifest, parse_inference_deployment


def validate_file(path: Path) -> tuple[list[str], list[str]]:
    """Returns (problems, summaries of valid documents) for one file."""
    try:
        text = path.read_text()
    except OSError as error:
        return [f"{path}: cannot read: {error.strerror or error}"], []
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        return [f"{path}: {where}YAML syntax error: {problem}"], []
    if not documents:
        return [f"{path}: no YAML document in the file"], []
    problems, valid = [], []
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


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "validate", help="validate InferenceDeployment manifests offline"
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.set_defaults(handler=lambda args: run(args.files))
