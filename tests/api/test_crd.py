"""The generated CRD: committed copies are current, the schema is structural and valid
apiextensions.k8s.io/v1, kubectl-facing parts (columns, scale, short names) are there,
and every CEL rule agrees with its pydantic twin on real manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from kubeinfer.operator.crdgen.crd import CRD_FILE, HELM_CRD_FILE, build_crd, render_crd_yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "manifests" / "invalid").glob("*.yaml"))
FORBIDDEN = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "const", "nullable"}


def schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("relative", [CRD_FILE, HELM_CRD_FILE], ids=str)
def test_committed_crd_is_current(relative: Path) -> None:
    committed = ROOT / relative
    assert committed.exists(), f"{relative} is missing: run `kubeinfer crds --write`"
    assert committed.read_text() == render_crd_yaml(), (
        f"{relative} is stale: run `kubeinfer crds --write`"
    )


def test_crd_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate.validate(build_crd(), "1.33", strict=True)


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        found += walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += walk(node["additionalProperties"], f"{path}.*")
    return found


def test_schema_is_structural() -> None:
    for path, node in walk(schema()):
        assert not FORBIDDEN & node.keys(), f"{path}: {FORBIDDEN & node.keys()}"
        assert "type" in node, f"{path}: no type"
        assert node.get("default", ...) is not None, f"{path}: default null"
        if node["type"] == "object" and path != ".metadata":
            assert "properties" in node or "additionalProperties" in node, path


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    for path, node in walk(schema()):
        if path and not path.endswith(("[]", "*")) and path != ".metadata":
            assert node.get("description"), f"{path} has no description"


def test_status_schema_has_no_defaults() -> None:
    assert all("default" not in node for _, node in walk(schema()["properties"]["status"]))


def test_kubectl_facing_parts() -> None:
    crd = build_crd()
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == ["infd"]
    assert set(crd["spec"]["names"]["categories"]) == {"all", "kubeinfer"}
    assert crd["spec"]["scope"] == "Namespaced"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.runtime.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Model", "Version", "Backend", "Precision", "Ready", "Phase", "P99", "Age"]
    conditions = schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_units_are_in_field_names() -> None:
    timed = [p for p, _ in walk(schema()) if any(w in p.lower() for w in ("delay", "timeout"))]
    assert timed
    units = ("Microseconds", "Milliseconds", "Seconds")
    for path in timed:
        assert path.rsplit(".", 1)[-1].endswith(units), f"{path} has no unit in its name"


# --- CEL rules and their pydantic twins -------------------------------------------------


def apply_defaults(value: Any, node: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it, before CEL runs."""
    if isinstance(value, dict) and node.get("type") == "object":
        result = dict(value)
        for name, child in node.get("properties", {}).items():
            if name not in result and "default" in child:
                result[name] = child["default"]
            if name in result:
                result[name] = apply_defaults(result[name], child)
        return result
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [apply_defaults(v, node["items"]) for v in value]
    return value


def cel_violations(value: Any, node: dict[str, Any], path: str = "") -> list[str]:
    """Evaluates every x-kubernetes-validations rule; returns `path.field: message`s."""
    found = []
    env = celpy.Environment()
    for rule in node.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            found.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}".lstrip("."))
    if isinstance(value, dict):
        for name, child in node.get("properties", {}).items():
            if name in value:
                found += cel_violations(value[name], child, f"{path}.{name}")
    return found


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_every_cel_rule(path: Path) -> None:
    spec_schema = schema()["properties"]["spec"]
    spec = apply_defaults(load(path)["spec"], spec_schema)
    assert cel_violations(spec, spec_schema, "spec") == []


def expectation(path: Path) -> str:
    """The first line of each invalid manifest says what it must be rejected with."""
    return path.read_text().splitlines()[0].removeprefix("# expect: ")


RULE_MESSAGES = [
    rule["message"]
    for _, node in walk(schema())
    for rule in node.get("x-kubernetes-validations", [])
]


def names_rule(path: Path, message: str) -> bool:
    return message.startswith(expectation(path).split(": ", 1)[-1])


CROSS_FIELD = [p for p in INVALID if any(names_rule(p, m) for m in RULE_MESSAGES)]


def test_every_cross_field_rule_has_an_invalid_manifest() -> None:
    covered = {m for p in CROSS_FIELD for m in RULE_MESSAGES if names_rule(p, m)}
    assert set(RULE_MESSAGES) == covered


@pytest.mark.parametrize("path", CROSS_FIELD, ids=lambda p: p.name)
def test_cel_and_pydantic_reject_with_the_same_field_and_message(path: Path) -> None:
    expected = expectation(path)
    root = schema()
    document = load(path)
    document["spec"] = apply_defaults(document["spec"], root["properties"]["spec"])
    # The root's rules (on metadata.name) have no fieldPath: metadata has no schema to
    # point into; they report at the field their message names.
    violations = [
        f"metadata.name{v}" if v.startswith(": ") else v for v in cel_violations(document, root)
    ]
    assert len(violations) == 1 and violations[0].startswith(expected), violations
