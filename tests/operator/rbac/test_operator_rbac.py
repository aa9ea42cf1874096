"""The RBAC rules as shipped: `kubeinfer rbac` prints a valid Role or ClusterRole (strict
Kubernetes 1.33 schemas) and the nodes' ClusterRole (get, list and watch only), with
`--leader-election` also the Lease's Role (create, and get and update of that one Lease by
name), with `--taint-suspect-nodes` the ClusterRole that only patches nodes; the Helm
chart's `templates/rbac.yaml` is exactly what `kubeinfer rbac --helm` generates from
`kubeinfer.operator.rbac`. (That those rules are exactly the calls the
operator makes is checked at the end of `test_operator_scenarios.py`.)

What Helm renders from the chart (the roles and bindings in each mode, the leader
election Role, the disruption budget, the Deployment) is checked with the real helm in
tests/helm/."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubeinfer.cli.main import main
from kubeinfer.operator import rbac

CHART = Path(__file__).parents[3] / "helm" / "kubeinfer"
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
    document, nodes = yaml.safe_load_all(capsys.readouterr().out)
    for each in (document, nodes):
        kubernetes_validate.validate(each, "1.33", strict=True)
    assert document["kind"] == kind
    assert granted_by(document) == rbac.granted()
    assert (nodes["kind"], nodes["metadata"]["name"]) == ("ClusterRole", "kubeinfer-operator-nodes")
    assert granted_by(nodes) == {
        ("get", "", "nodes"),
        ("list", "", "nodes"),
        ("watch", "", "nodes"),
    }


def test_tainting_suspect_nodes_adds_a_cluster_role_that_only_patches_nodes(capsys) -> None:
    assert main(["rbac", "--taint-suspect-nodes"]) == 0
    _, nodes, taints = yaml.safe_load_all(capsys.readouterr().out)
    kubernetes_validate.validate(taints, "1.33", strict=True)
    assert (taints["kind"], taints["metadata"]["name"]) == (
        "ClusterRole",
        "kubeinfer-operator-node-taints",
    )
    assert granted_by(taints) == {("patch", "", "nodes")}
    assert ("patch", "", "nodes") not in granted_by(nodes), "not without the setting"


def test_leader_election_adds_a_role_for_one_lease(capsys) -> None:
    argv = ["rbac", "--leader-election", "--lease-namespace", "ops", "--lease-name", "infer"]
    assert main(argv) == 0
    cluster_role, _, lease_role = yaml.safe_load_all(capsys.readouterr().out)
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
    for rule in (*rbac.RULES, *rbac.NODE_RULES, *rbac.NODE_TAINT_RULES):
        assert rule.to_dict() in rules
