"""The RBAC rules as shipped: `kubeinfer rbac` prints a valid Role or ClusterRole (strict
Kubernetes 1.33 schemas), with `--leader-election` also the Lease's Role (create, and get
and update of that one Lease by name); the Helm chart's `templates/rbac.yaml` is exactly
what `kubeinfer rbac --helm` generates from `kubeinfer.operator.rbac`. (That those rules
are exactly the calls the operator makes is checked at the end of
`test_operator_scenarios.py`.)

No helm binary is at hand: the chart's leader election Role and RoleBinding and its
PodDisruptionBudget are rendered here by a small renderer that knows only the template
constructs those files use (values, `include` of one `define`, `if gt (int …) N`), and
the result is validated against the strict schemas. The Deployment template (`range`,
`with`, `toYaml`) is not rendered: unverified beyond what this file reads from it."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubeinfer.cli.main import main
from kubeinfer.operator import rbac

CHART = Path(__file__).parents[2] / "helm" / "kubeinfer"
CHART_RBAC = CHART / "templates" / "rbac.yaml"


def granted_by(document: dict) -> set[tuple[str, str, str]]:
    return {
        (verb, group, resource)
        for rule in document["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize(("argv", "kind"), [([], "ClusterRole"), (["--namespace", "ml"], "Role")])
def test_printed_role_is_valid_kubernetes(argv, kind, capsys) -> None:
    assert main(["rbac", *argv]) == 0
    (document,) = yaml.safe_load_all(capsys.readouterr().out)
    kubernetes_validate.validate(document, "1.33", strict=True)
    assert document["kind"] == kind
    assert granted_by(document) == rbac.granted()


def test_leader_election_adds_a_role_for_one_lease(capsys) -> None:
    argv = ["rbac", "--leader-election", "--lease-namespace", "ops", "--lease-name", "infer"]
    assert main(argv) == 0
    cluster_role, lease_role = yaml.safe_load_all(capsys.readouterr().out)
    for document in (cluster_role, lease_role):
        kubernetes_validate.validate(document, "1.33", strict=True)
    assert cluster_role["kind"] == "ClusterRole"
    assert (lease_role["kind"], lease_role["metadata"]["namespace"]) == ("Role", "ops")
    by_verb = {
        verb: rule.get("resourceNames") for rule in lease_role["rules"] for verb in rule["verbs"]
    }
    assert by_verb == {"create": None, "get": ["infer"], "update": ["infer"]}


def test_leader_election_without_a_namespace_is_refused(capsys) -> None:
    assert main(["rbac", "--leader-election"]) == 2
    assert "--lease-namespace" in capsys.readouterr().err


def test_helm_chart_rbac_is_generated_from_the_rules() -> None:
    assert CHART_RBAC.read_text() == rbac.helm_template(), (
        "helm/kubeinfer/templates/rbac.yaml is stale: run "
        "`kubeinfer rbac --helm > helm/kubeinfer/templates/rbac.yaml`"
    )


def test_chart_rules_are_the_rules() -> None:
    lines = [line[4:] for line in CHART_RBAC.read_text().splitlines() if line.startswith("  - {")]
    rules = [yaml.safe_load(line) for line in lines]
    for rule in rbac.RULES:
        assert rule.to_dict() in rules


# -- a small renderer for the chart's simple templates ----------------------------------------

RELEASE = {".Release.Name": "rel", ".Release.Namespace": "ops", ".Release.Service": "Helm"}


def render(text: str, values: dict[str, object]) -> str:
    """Go-template subset: `{{- ... }}` trims the whitespace before it; `define`/`include`
    of a block; `if gt (int .Values.x) N` ... `end`; `.Release.*` and `.Values.*` (also
    with `$.`)."""
    text = re.sub(r"\s*\{\{-", "{{", text)
    defined: dict[str, str] = {}

    def define(match: re.Match[str]) -> str:
        defined[match.group(1)] = match.group(2)
        return ""

    text = re.sub(r'\{\{ define "([^"]+)" \}\}(.*?)\{\{ end \}\}', define, text, flags=re.S)
    text = re.sub(r"\{\{ /\*.*?\*/\}\}", "", text, flags=re.S)
    text = re.sub(r'\{\{ include "([^"]+)" [.$] \}\}', lambda m: defined[m.group(1)], text)

    def branch(match: re.Match[str]) -> str:
        value = int(values[match.group(1)])  # type: ignore[call-overload]
        return match.group(3) if value > int(match.group(2)) else ""

    pattern = r"\{\{ if gt \(int \$?\.Values\.(\w+)\) (\d+) \}\}(.*?)\{\{ end \}\}"
    text = re.sub(pattern, branch, text, flags=re.S)
    scope = {**RELEASE, **{f".Values.{key}": value for key, value in values.items()}}
    text = re.sub(r"\{\{ \$?(\.[\w.]+) \}\}", lambda m: str(scope[m.group(1)]), text)
    assert "{{" not in text, f"not rendered: {text}"
    return text


def test_the_charts_leader_election_role_and_binding_are_valid() -> None:
    text = CHART_RBAC.read_text()
    define = text[: text.index("{{- if .Values.watchNamespaces }}")]
    tail = text[text.rindex("{{- end }}\n---") + len("{{- end }}\n") :]
    documents = [d for d in yaml.safe_load_all(render(define + tail, {})) if d]
    for document in documents:
        kubernetes_validate.validate(document, "1.33", strict=True)
    role, binding = documents
    assert (role["kind"], role["metadata"]["namespace"]) == ("Role", "ops")
    assert role["rules"] == [rule.to_dict() for rule in rbac.lease_rules("rel-operator")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == "rel-operator"


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_charts_disruption_budget_keeps_one_of_several(replicas: int) -> None:
    template = (CHART / "templates" / "poddisruptionbudget.yaml").read_text()
    documents = [d for d in yaml.safe_load_all(render(template, {"replicas": replicas})) if d]
    if replicas == 1:
        assert documents == [], "one replica: a budget of one would block every drain"
        return
    (budget,) = documents
    kubernetes_validate.validate(budget, "1.33", strict=True)
    assert budget["spec"]["minAvailable"] == 1
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    for key, value in budget["spec"]["selector"]["matchLabels"].items():
        template_value = "{{ .Release.Name }}" if value == "rel" else value
        assert f"{key}: {template_value}" in deployment


def test_the_chart_runs_replicas_with_leader_election_on_its_lease() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert values["replicas"] == 2
    assert "replicas: {{ .Values.replicas }}" in deployment
    assert "- --leader-election" in deployment
    assert f"- --lease-name={rbac.HELM_LEASE_NAME}" in deployment
    assert "fieldPath: metadata.namespace" in deployment
