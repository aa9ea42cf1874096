"""`kubeinfer validate`: the examples pass, each invalid manifest is rejected with the
offending field's path, and any field broken anywhere in a manifest is reported at its
own path (the check that hand-written invalid manifests we never saw get named too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator.api.v1alpha1.validation import InvalidManifest, parse_inference_deployment
from kubeinfer.operator.commands.validate import run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "manifests" / "invalid").glob("*.yaml"))


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kubeinfer.cli", "validate", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_examples_exist_and_validate() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "cpu-minimal.yaml",
        "gpu-int8-shadow-autoscale.yaml",
        "pinned.yaml",
    }
    result = validate(*EXAMPLES)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.count("valid InferenceDeployment") == len(EXAMPLES)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_manifest_is_rejected_naming_the_field(path: Path, capsys: Any) -> None:
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    assert run([path]) == 1
    err = capsys.readouterr().err
    assert f"{path}: {expected}" in err, err
    assert "Traceback" not in err


def test_exit_code_and_output_through_the_console_script(tmp_path: Path) -> None:
    bad = INVALID[0]
    result = validate(EXAMPLES[0], bad, tmp_path / "missing.yaml")
    assert result.returncode == 1
    assert "valid InferenceDeployment" in result.stdout
    assert f"{bad}: " in result.stderr
    assert f"{tmp_path / 'missing.yaml'}: cannot read" in result.stderr
    assert "Traceback" not in result.stderr


def test_multi_document_file_reports_each_document(tmp_path: Path) -> None:
    good = yaml.safe_load(EXAMPLES[0].read_text())
    bad = {**good, "spec": {**good["spec"], "engine": {"precision": "int4"}}}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([good, bad]))
    result = validate(path)
    assert result.returncode == 1
    assert f"{path}[0]: valid" in result.stdout
    assert f"{path}[1]: spec.engine.precision:" in result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no YAML document"),
        ("- a\n- b\n", "(document): expected a mapping"),
        ("apiVersion: v1\nkind: ConfigMap\n", "kind: expected apiVersion kubeinfer.io/v1alpha1"),
        ("spec: {model: [\n", "YAML syntax error"),
        ("a: b\n\tc: d\n", "YAML syntax error"),
    ],
)
def test_not_a_manifest_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "input.yaml"
    path.write_text(text)
    result = validate(path)
    assert result.returncode == 1
    assert f"{path}: " in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [leaf for key, child in value.items() for leaf in leaves(child, (*path, key))]
    if isinstance(value, list) and value:
        return [leaf for i, child in enumerate(value) for leaf in leaves(child, (*path, i))]
    return [path]


def replaced(document: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    if isinstance(document, list):
        return [replaced(v, tuple(rest), new) if i == head else v for i, v in enumerate(document)]
    return {k: replaced(v, tuple(rest), new) if k == head else v for k, v in document.items()}


def dotted(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_a_broken_field_anywhere_is_reported_at_its_path(example: Path) -> None:
    document = yaml.safe_load(example.read_text())
    spec_leaves = [p for p in leaves(document) if p[0] == "spec"]
    assert len(spec_leaves) >= 8
    for leaf in spec_leaves:
        # An object where a scalar belongs is wrong for every field of the spec.
        broken = replaced(document, leaf, {"unexpected": {"nested": True}})
        with pytest.raises(InvalidManifest) as caught:
            parse_inference_deployment(broken)
        paths = [e.path for e in caught.value.errors]
        assert dotted(leaf) in paths, (dotted(leaf), paths)
