"""The serving pods' PodDisruptionBudget and topology spread, as the pure decision makes
them: one budget per object whose selector takes every serving pod (each product's on a
mixed fleet) and no shadow candidate's; the spread rendered into the pods from
`runtime.topologySpread` (zone then node by default, none when emptied), counting the
pods of the Deployment it is in. What they do to a drain, a lost node and a lost zone is
played on the real scheduler and controllers in `test_operator_fleet_faults`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from decide_scenarios import DIGEST_A, DIGEST_B, T0, Cluster, make_spec
from kubeinfer.operator.state import names
from test_decide_fleet import H100, L4, served, two_products

SHADOW = {"strategy": "Shadow", "shadow": {"minSamples": 50}}
RUNTIME = names.runtime_name("demo")


def selects(selector: dict[str, Any], deployment: dict[str, Any]) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return selector["matchLabels"].items() <= labels.items()


def budgets(cluster: Cluster) -> list[dict[str, Any]]:
    return [o for (kind, _), o in cluster.objects.items() if kind == "PodDisruptionBudget"]


def spreads(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return deployment["spec"]["template"]["spec"].get("topologySpreadConstraints") or []


def versioned(version: str, **runtime: Any) -> Any:
    uri = f"https://models.example.com/mlp-{version}.onnx"
    return make_spec(
        model={"version": version, "source": {"uri": uri}}, rollout=SHADOW, runtime=runtime
    )


def test_the_budget_takes_the_serving_pods_one_at_a_time_and_no_candidate() -> None:
    cluster = Cluster(versioned("1", replicas=3))
    cluster.build_to_ready(DIGEST_A)
    cluster.update_spec(versioned("2", replicas=3))
    later = T0 + timedelta(minutes=10)
    cluster.reconcile(later)
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(job["metadata"]["name"], DIGEST_B, at=later)
    cluster.reconcile(later + timedelta(seconds=1))
    candidate = cluster.get("Deployment", names.candidate_name("demo"))

    (budget,) = budgets(cluster)
    spec = budget["spec"]
    assert spec["maxUnavailable"] == 1 and spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert selects(spec["selector"], cluster.get("Deployment"))
    assert not selects(spec["selector"], candidate), "a candidate takes no traffic"
    assert budget["metadata"]["name"] == RUNTIME


def test_one_budget_takes_every_product_s_serving_pods() -> None:
    cluster = served(two_products(replicas=3))
    (budget,) = budgets(cluster)
    for product in (H100, L4):
        assert selects(budget["spec"]["selector"], cluster.runtime(product)), product
    assert cluster.reconcile(T0 + timedelta(seconds=91)).apply == (), "written once"


def test_the_pods_spread_over_zones_then_nodes_by_default_each_deployment_its_own() -> None:
    cluster = served(two_products(replicas=3))
    for product in (H100, L4):
        deployment = cluster.runtime(product)
        constraints = spreads(deployment)
        assert [c["topologyKey"] for c in constraints] == [
            "topology.kubernetes.io/zone",
            "kubernetes.io/hostname",
        ]
        for each in constraints:
            assert each["whenUnsatisfiable"] == "ScheduleAnyway" and each["maxSkew"] == 1
            assert each["matchLabelKeys"] == ["pod-template-hash"]
            assert each["labelSelector"] == deployment["spec"]["selector"], "its own pods"


def test_the_spread_is_set_in_the_spec_and_can_be_turned_off() -> None:
    rule = {"topologyKeys": ["topology.kubernetes.io/zone"], "maxSkew": 2,
            "whenUnsatisfiable": "DoNotSchedule"}  # fmt: skip
    cluster = Cluster(make_spec(runtime={"topologySpread": rule}))
    cluster.build_to_ready(DIGEST_A)
    (constraint,) = spreads(cluster.get("Deployment"))
    assert (constraint["topologyKey"], constraint["maxSkew"]) == ("topology.kubernetes.io/zone", 2)
    assert constraint["whenUnsatisfiable"] == "DoNotSchedule"

    cluster.update_spec(make_spec(runtime={"topologySpread": {"topologyKeys": []}}))
    cluster.reconcile(T0 + timedelta(minutes=1))
    assert spreads(cluster.get("Deployment")) == []
