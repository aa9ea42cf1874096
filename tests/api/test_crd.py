"""The generated CRD: committed copies are current, the schema is structural and valid
apiextensions.k8s.io/v1, kubectl-facing parts (columns, scale, short names) are there,
and the CEL rules and their pydantic twins are the same rules: the same set in the same
places, and the same verdict (and field and message) on the examples, on the invalid
manifests and on generated manifests at each rule's boundary."""

from __future__ import annotations

import functools
import typing
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kubeinfer.contract.api_model import ApiModel
from kubeinfer.operator.api.v1alpha1.inference_deployment import InferenceDeployment
from kubeinfer.operator.api.v1alpha1.metadata import NAME_FORM_MESSAGE, NAME_LENGTH_MESSAGE
from kubeinfer.operator.api.v1alpha1.validation import InvalidManifest, parse_inference_deployment
from kubeinfer.operator.commands import crds as crds_command
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


def test_crds_writes_both_copies_and_its_check_names_a_stale_or_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert crds_command.run(write=False, check=True, root=tmp_path) == 1
    assert f"{CRD_FILE} is missing: run `kubeinfer crds --write`" in capsys.readouterr().err
    assert crds_command.run(write=True, check=False, root=tmp_path) == 0
    assert (tmp_path / HELM_CRD_FILE).read_text() == render_crd_yaml()
    assert crds_command.run(write=False, check=True, root=tmp_path) == 0
    (tmp_path / HELM_CRD_FILE).write_text("kind: CustomResourceDefinition\n")
    assert crds_command.run(write=False, check=True, root=tmp_path) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{HELM_CRD_FILE} is stale: run `kubeinfer crds --write`"
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
    assert columns == [
        "Model", "Version", "Backend", "Precision", "Ready", "Phase", "Engines", "Zero", "P99",
        "Cost/1k", "Answers", "Age",
    ]  # fmt: skip
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
#
# The two sides are read independently: the CEL rules from the generated CRD, the pydantic
# rules from the models' own `cross_field_rules` (and ObjectMeta's name checks, the twins
# of the root's rules). Expectations drawn from the CRD alone would let a rule deleted from
# the CRD take its own test with it.


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


CEL = celpy.Environment()


def cel_sum(items: Any) -> Any:
    """Kubernetes' CEL list library's `sum()` (celpy has no such extension)."""
    total = celpy.celtypes.IntType(0)
    for item in items:
        total = total + item
    return total


@functools.cache
def cel_program(rule: str) -> Any:
    return CEL.program(CEL.compile(rule), functions={"sum": cel_sum})


def cel_violations(value: Any, node: dict[str, Any], path: str = "") -> list[str]:
    """Evaluates every x-kubernetes-validations rule wherever the value reaches, through
    objects, list items and map values; returns `path.field: message`s."""
    found = []
    for rule in node.get("x-kubernetes-validations", []):
        if not cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)}):
            found.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}".lstrip("."))
    properties = node.get("properties", {})
    if isinstance(value, dict):
        for name, child in properties.items():
            if name in value:
                found += cel_violations(value[name], child, f"{path}.{name}")
        if isinstance(node.get("additionalProperties"), dict):
            for name in sorted(value.keys() - properties.keys()):
                found += cel_violations(value[name], node["additionalProperties"], f"{path}.{name}")
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        for index, item in enumerate(value):
            found += cel_violations(item, node["items"], f"{path}[{index}]")
    return found


def cel_rejections(document: dict[str, Any]) -> list[str]:
    """What the API server's CEL rules say about a manifest, after its defaulting. The
    root's rules (on metadata.name) have no fieldPath: metadata has no schema to point
    into; they report at the field their message names."""
    root = schema()
    defaulted = {**document, "spec": apply_defaults(document["spec"], root["properties"]["spec"])}
    return [
        f"metadata.name{v}" if v.startswith(": ") else v for v in cel_violations(defaulted, root)
    ]


def pydantic_rejections(document: dict[str, Any]) -> list[str]:
    """What `kubeinfer validate` and the operator say about a manifest."""
    try:
        parse_inference_deployment(document)
    except InvalidManifest as invalid:
        return [str(error) for error in invalid.errors]
    return []


def nested_models(annotation: Any) -> list[tuple[type[ApiModel], str]]:
    """The models a field's type holds, each with the schema-path suffix reaching it: `[]`
    through a list's items, `.*` through a map's values."""
    if isinstance(annotation, type) and issubclass(annotation, ApiModel):
        return [(annotation, "")]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset):
        return [(m, f"[]{s}") for arg in args for m, s in nested_models(arg)]
    if origin is dict:
        return [(m, f".*{s}") for m, s in nested_models(args[1])]
    return [found for arg in args for found in nested_models(arg)]  # Optional, Union


def model_rules(model: type[ApiModel], path: str = "") -> set[tuple[str, str | None, str]]:
    """(schema path, fieldPath, message) of every pydantic cross-field rule below `model`."""
    found = {(path, f".{rule.field}", rule.message) for rule in model.cross_field_rules}
    for name, field in model.model_fields.items():
        for nested, suffix in nested_models(field.annotation):
            found |= model_rules(nested, f"{path}.{field.alias or name}{suffix}")
    return found


PYDANTIC_RULES = model_rules(InferenceDeployment) | {
    ("", None, NAME_LENGTH_MESSAGE),  # ObjectMeta's name checks
    ("", None, NAME_FORM_MESSAGE),
}
RULE_MESSAGES = sorted({message for _, _, message in PYDANTIC_RULES})


def test_every_pydantic_rule_is_a_cel_rule_at_the_same_place_and_back() -> None:
    """Pins the CRD's rules to the models' in both directions: a rule missing from the CRD
    (or put on another node, or reporting at another field) fails, and so does a CEL rule
    with no pydantic twin."""
    crd_rules = {
        (path, rule.get("fieldPath"), rule["message"])
        for path, node in walk(schema())
        for rule in node.get("x-kubernetes-validations", [])
    }
    assert len(PYDANTIC_RULES) >= 11, "the models' rules were not found"
    assert crd_rules == PYDANTIC_RULES, (
        f"only in the CRD: {crd_rules - PYDANTIC_RULES}; "
        f"only in the models: {PYDANTIC_RULES - crd_rules}"
    )


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_every_cel_rule(path: Path) -> None:
    assert cel_rejections(load(path)) == []


def expectation(path: Path) -> str:
    """The first line of each invalid manifest says what it must be rejected with."""
    return path.read_text().splitlines()[0].removeprefix("# expect: ")


def names_rule(path: Path, message: str) -> bool:
    return message.startswith(expectation(path).split(": ", 1)[-1])


CROSS_FIELD = [p for p in INVALID if any(names_rule(p, m) for m in RULE_MESSAGES)]


def test_every_cross_field_rule_has_an_invalid_manifest() -> None:
    covered = {m for p in CROSS_FIELD for m in RULE_MESSAGES if names_rule(p, m)}
    assert set(RULE_MESSAGES) == covered


@pytest.mark.parametrize("path", CROSS_FIELD, ids=lambda p: p.name)
def test_cel_and_pydantic_reject_with_the_same_field_and_message(path: Path) -> None:
    cel = cel_rejections(load(path))
    assert len(cel) == 1 and cel[0].startswith(expectation(path)), cel
    assert pydantic_rejections(load(path)) == cel


SOURCE_URIS = [
    "https://models.example.com/resnet/model.onnx",
    "pvc://models/resnet/model.onnx",
    "pvc://models.team-a/.hidden/..x/model.onnx",
    f"pvc://{'a' * 253}/model.onnx",
    f"pvc://{'a' * 254}/model.onnx",
    "pvc://models/../etc/passwd",
    "pvc://models/./model.onnx",
    "pvc://models//model.onnx",
    "pvc://models/",
    "pvc://Models/model.onnx",
    "pvc://-models/model.onnx",
]
PINS = [None, "sha256:" + "0f" * 32, "sha256:" + "0F" * 32, "sha256:" + "0" * 63, "md5:" + "0" * 64]
NAMES = ["resnet", "a" * 52, "a" * 53, "9lives", "resNet", "resnet-", "a"]


def vary_name(draw: st.DrawFn, document: dict[str, Any]) -> None:
    document["metadata"]["name"] = draw(st.sampled_from(NAMES))


def vary_batch_sizes(draw: st.DrawFn, document: dict[str, Any]) -> None:
    spec = document["spec"]
    spec["engine"]["maxBatchSize"] = draw(st.integers(1, 4))
    spec["runtime"]["batching"]["maxBatchSize"] = draw(st.integers(1, 4))
    spec["runtime"]["batching"]["preferredBatchSizes"] = draw(
        st.lists(st.integers(1, 5), max_size=3)
    )


def vary_backend(draw: st.DrawFn, document: dict[str, Any]) -> None:
    spec = document["spec"]
    spec["engine"]["backend"] = draw(st.sampled_from(["onnxruntime", "tensorrt"]))
    if draw(st.booleans()):  # else the default, 0
        spec["runtime"]["resources"]["gpus"] = draw(st.integers(0, 2))


def vary_precision(draw: st.DrawFn, document: dict[str, Any]) -> None:
    engine = document["spec"]["engine"]
    engine["precision"] = draw(st.sampled_from(["fp32", "fp16", "int8"]))
    if draw(st.booleans()):
        engine["calibration"] = {"uri": draw(st.sampled_from(SOURCE_URIS))}
    if (pin := draw(st.sampled_from(PINS))) is not None:
        engine["pin"] = pin


def vary_cache(draw: st.DrawFn, document: dict[str, Any]) -> None:
    optional = {"existingClaim": st.just("models"), "storageClassName": st.just("fast")}
    document["spec"]["engine"]["cache"] = draw(st.fixed_dictionaries({}, optional=optional))


def vary_source(draw: st.DrawFn, document: dict[str, Any]) -> None:
    document["spec"]["model"]["source"]["uri"] = draw(st.sampled_from(SOURCE_URIS))


def vary_replicas(draw: st.DrawFn, document: dict[str, Any]) -> None:
    bounds = {"minReplicas": st.integers(1, 3), "maxReplicas": st.integers(1, 3)}
    document["spec"]["autoscaling"] = draw(st.fixed_dictionaries(bounds))


KNOBS = [
    vary_name,
    vary_batch_sizes,
    vary_backend,
    vary_precision,
    vary_cache,
    vary_source,
    vary_replicas,
]


@st.composite
def near_rule_boundaries(draw: st.DrawFn) -> dict[str, Any]:
    """cpu-minimal.yaml with the fields of one to three rules drawn from both sides of their
    boundaries (equal sizes, zero and one GPU, pins of the wrong length or case, claims of
    253 and 254 characters, `.` and `..` segments), each field on its own valid; the other
    fields keep the example's valid values, so about half the manifests are accepted."""
    document = load(ROOT / "examples" / "cpu-minimal.yaml")
    for knob in draw(st.permutations(KNOBS))[: draw(st.integers(1, 3))]:
        knob(draw, document)
    return document


@settings(max_examples=200, deadline=None)
@given(near_rule_boundaries())
def test_cel_and_pydantic_agree_on_every_manifest_near_a_rule(document: dict[str, Any]) -> None:
    """Parity in both directions, at the boundaries: CEL accepts exactly what pydantic
    accepts, and what pydantic reports (one rule per model: it stops at the first) is among
    what CEL reports. A `<` for a `<=`, or a rule on one side only, fails here."""
    cel, pydantic = cel_rejections(document), pydantic_rejections(document)
    event("rejected" if cel else "accepted")
    assert bool(cel) == bool(pydantic), (cel, pydantic)
    assert set(pydantic) <= set(cel), (cel, pydantic)


def test_the_cost_of_a_thousand_inferences_is_a_wide_column_of_the_status_field() -> None:
    """`kubectl get infd -o wide` shows Cost/1k (priority 1: not in the plain listing), read
    from the status field the model generates."""
    version = build_crd()["spec"]["versions"][0]
    (column,) = [c for c in version["additionalPrinterColumns"] if c["name"] == "Cost/1k"]
    assert column["priority"] == 1 and column["type"] == "number"
    assert column["jsonPath"] == ".status.cost.perThousandInferences"
    cost = schema()["properties"]["status"]["properties"]["cost"]
    assert cost["properties"]["perThousandInferences"]["type"] == "number"
    assert set(cost["properties"]) == {
        "perThousandInferences", "windowSeconds", "inferences", "podHours", "lastEvaluated",
    }  # fmt: skip
