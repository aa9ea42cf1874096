"""The RBAC rules as shipped: `kubeinfer rbac` prints a valid Role or ClusterRole (strict
Kubernetes 1.33 schemas), and the Helm chart's `templates/rbac.yaml` is exactly what
`kubeinfer rbac --helm` generates from `kubeinfer.operator.rbac`. (That those rules are
exactly the calls the operator makes is checked at the end of
`test_operator_scenarios.py`.)"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubeinfer.operator import rbac
from kubeinfer.operator.cli import main

CHART_RBAC = Path(__file__).parents[2] / "helm" / "kubeinfer" / "templates" / "rbac.yaml"


@pytest.mark.parametrize(
    ("argv", "kind"),
    [([], "ClusterRole"), (["--namespace", "ml"], "Role"), (["--peering"], "ClusterRole")],
)
def test_printed_role_is_valid_kubernetes(argv, kind, capsys) -> None:
    assert main(["rbac", *argv]) == 0
    document = yaml.safe_load(capsys.readouterr().out)
    kubernetes_validate.validate(document, "1.33", strict=True)
    assert document["kind"] == kind
    granted = {
        (verb, group, resource)
        for rule in document["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert rbac.granted() <= granted
    assert any(g == "kopf.dev" for _, g, _ in granted) == ("--peering" in argv)


def test_helm_chart_rbac_is_generated_from_the_rules() -> None:
    assert CHART_RBAC.read_text() == rbac.helm_template(), (
        "helm/kubeinfer/templates/rbac.yaml is stale: run "
        "`kubeinfer rbac --helm > helm/kubeinfer/templates/rbac.yaml`"
    )


def test_chart_rules_are_the_rules() -> None:
    lines = [line[4:] for line in CHART_RBAC.read_text().splitlines() if line.startswith("  - {")]
    rules = {yaml.safe_load(line)["resources"][0]: yaml.safe_load(line) for line in lines}
    for rule in rbac.RULES:
        assert rules[rule.resources[0]] == rule.to_dict()
