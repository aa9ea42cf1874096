"""Manifests read as the API server reads them (`api.manifest_loader`, used by `kubeinfer
validate` and `render`): YAML 1.2 with the readings kubectl (YAML 1.1) disagrees on
refused, duplicate keys refused, JSON values only (timestamps stay strings), alias
expansion, nesting and encoding bounded with a one-line error, strict integers in the
models, and every file of a `validate` run reported whatever the others hold."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.operator.api.manifest_loader import (
    MAX_DEPTH,
    ManifestSyntaxError,
    load_documents,
)
from kubeinfer.operator.api.v1alpha1.validation import InvalidManifest, parse_inference_deployment
from kubeinfer.operator.commands.render import render_file
from kubeinfer.operator.commands.validate import run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "examples" / "cpu-minimal.yaml").read_text()


def kubeinfer(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kubeinfer.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("a: 0o10", 8),  # YAML 1.2's octal, and go-yaml's
        ("a: 1:30", "1:30"),  # YAML 1.1's base 60 is a string to kubectl and YAML 1.2
        ("a: '010'", "010"),
        ('a: "yes"', "yes"),
        ("a: true", True),
        ("a: 2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),  # as kubectl sends it
        ("a: 2026-01-01", "2026-01-01"),
        ("b: &x {c: 1}\na: {<<: *x, d: 2}", {"c": 1, "d": 2}),  # merge keys, as go-yaml
        ("a: ~", None),
    ],
)
def test_values_read_as_json_the_way_kubectl_sends_them(text: str, value: object) -> None:
    [document] = load_documents(text.encode())
    assert document["a"] == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 010", "line 1, column 4: 010 is ambiguous"),
        ("a: -007", "-007 is ambiguous"),
        ("a: on", "on is ambiguous: kubectl (YAML 1.1) reads a boolean"),
        ("n: 1", "n is ambiguous"),
        ("a: 1\nb: 2\na: 3", 'line 3, column 1: YAML syntax error: found duplicate key "a"'),
        ("a: !!binary aGk=", "the tag !!binary has no JSON equivalent"),
        ("a: !!set {x}", "the tag !!set has no JSON equivalent"),
        ("a: .nan", "a: nan is not a number JSON can carry"),
        ("1: a", "the key 1 is not a string"),
        ("%YAML 1.1\n---\na: 1", "%YAML 1.1 is not read here"),
        ("a: [1\n", "line 2, column 1: YAML syntax error"),
    ],
)
def test_what_yaml_1_1_and_1_2_read_differently_or_json_cannot_hold_is_refused(
    text: str, message: str
) -> None:
    with pytest.raises(ManifestSyntaxError) as caught:
        load_documents(text.encode())
    assert message in str(caught.value)


def test_nesting_is_bounded_before_anything_recurses() -> None:
    load_documents(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    for depth in (MAX_DEPTH + 1, 500, 100_000):
        with pytest.raises(ManifestSyntaxError, match=f"nested deeper than {MAX_DEPTH} levels"):
            load_documents(b"a: " + b"[" * depth + b"]" * depth)


def alias_bomb(levels: int, where: str = "  uid") -> str:
    """A billion-laughs document: each level repeats the one below it 9 times."""
    lines = ['x0: &x0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        refs = ", ".join([f"*x{level - 1}"] * 9)
        lines.append(f"x{level}: &x{level} [{refs}]")
    body = "\n".join(f"  {line}" for line in lines)
    return EXAMPLE.replace("  namespace: default\n", f"{where}: *x{levels - 1}\n") + (
        f"bomb:\n{body}\n"
    )


def test_an_alias_bomb_is_refused_at_once_and_its_size_is_said() -> None:
    text = alias_bomb(9)  # about 1 KB expanding to 9^9 strings
    assert len(text) < 2000
    tracemalloc.start()
    try:
        with pytest.raises(ManifestSyntaxError, match="larger than 3145728 bytes with its aliases"):
            load_documents(text.encode())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Counted while parsing, never expanded: a few MB at most.
    assert peak < 8 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"


def test_an_alias_in_metadata_uid_within_bounds_is_refused_by_type(tmp_path: Path) -> None:
    path = tmp_path / "uid.yaml"
    path.write_text(EXAMPLE.replace("namespace: default", "uid: &u [a, [*u]]"))
    # a recursive alias has no JSON form; a plain list is refused by the uid's type
    assert "the alias *u is inside its own anchor" in kubeinfer("validate", str(path)).stderr
    path.write_text(EXAMPLE.replace("namespace: default", "uid: &u [a, b]\n  namespace: *u"))
    result = kubeinfer("render", str(path))
    assert result.returncode == 1
    assert "metadata.uid: Input should be a valid string" in result.stderr
    assert "metadata.namespace: Input should be a valid string" in result.stderr


def test_render_of_the_alias_bomb_fails_fast_instead_of_growing(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(9))
    result = kubeinfer("render", str(path))  # expanding would outlast its 60 s timeout
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "with its aliases expanded" in result.stderr


def test_strict_integers_refuse_strings_and_booleans_as_the_crd_does() -> None:
    for value in ("2", True, 2.5, "1:30"):
        document = load_documents(EXAMPLE.encode())[0]
        document["spec"]["runtime"]["replicas"] = value
        with pytest.raises(InvalidManifest) as caught:
            parse_inference_deployment(document)
        assert [str(e) for e in caught.value.errors] == [
            "spec.runtime.replicas: Input should be a valid integer"
        ]
    document["spec"]["autoscaling"] = {"enabled": "true", "tolerance": "0.1"}
    document["spec"]["runtime"]["replicas"] = 2
    with pytest.raises(InvalidManifest) as caught:
        parse_inference_deployment(document)
    assert {e.path for e in caught.value.errors} == {
        "spec.autoscaling.enabled",
        "spec.autoscaling.tolerance",
    }
    # a number field takes an integer, as JSON Schema's `number` does
    document["spec"]["autoscaling"] = {"tolerance": 0, "targetRequestsInProgressPerReplica": 4}
    assert parse_inference_deployment(document).spec.autoscaling.tolerance == 0.0


def test_validate_reports_every_bad_file_and_the_good_ones(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 500 + "]" * 500)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(EXAMPLE.replace("resnet-cpu", "r\u00e9snet").encode("latin-1"))
    npy = tmp_path / "calibration.npy"
    np.save(npy, np.zeros((2, 3), np.float32))
    directory = tmp_path / "a-directory"
    directory.mkdir()
    good = tmp_path / "good.yaml"
    good.write_text(EXAMPLE)
    result = kubeinfer("validate", str(deep), str(latin1), str(npy), str(directory), str(good))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"{deep}: line 1, column 67: nested deeper than 64 levels")
    assert lines[1].startswith(f"{latin1}: line 7: not UTF-8 text (byte 0xe9")
    assert lines[2].startswith(f"{npy}: line 1: not UTF-8 text (byte 0x93 at offset 0)")
    assert lines[3].startswith(f"{directory}: cannot read: Is a directory")
    assert len(lines) == 4
    assert result.stdout == f"{good}: valid InferenceDeployment resnet-cpu (model resnet:1, " + (
        "onnxruntime/fp32)\n"
    )


def test_in_process_validate_and_render_agree_on_a_bad_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "octal.yaml"
    path.write_text(EXAMPLE.replace("replicas: 2", "replicas: 010"))
    assert run([path]) == 1
    message = "line 21, column 15: 010 is ambiguous"
    assert f"{path}: {message}" in capsys.readouterr().err
    with pytest.raises(Exception, match=message):
        render_file(path)
