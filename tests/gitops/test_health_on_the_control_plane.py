"""Argo CD's health check and kstatus on what the real operator writes now, on the real
control plane, and a drift check of the checked-in testdata: the operator (in-process, as
its ServiceAccount) brings objects into each situation of `operator_statuses` in one
namespace at once (a build waiting, Ready, a spec just changed, a shadow test running,
promoted and aborted through Argo CD's own actions, a failed build, a runtime that refuses
its engine), about half a minute on two cores.

For each object: `health.lua` gives the health its table expects, kstatus what Flux would
read, and what a health check reads of the status (phase, generations observed, each
condition's status and reason) equals the checked-in testdata file's; when the operator
changes what it writes, this fails: run `tests/gitops/capture_statuses.py`. Quality drift
takes minutes of traffic, so only the capture script records it (its file is checked
against the status API by `test_argocd_health`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import argocd_lua
import kstatus
import pytest
import yaml
from cluster_harness import LocalCluster
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.operator.rollout.shadow import GATE_ANNOTATION
from operator_harness import Model, World, grant_operator_role
from operator_statuses import CUSTOMIZATION, capture, projection
from test_argocd_health import HEALTH_TESTS, KSTATUS

pytestmark = pytest.mark.slow

EXPECTED_HEALTH = {Path(c["inputPath"]).stem: c["healthStatus"]["status"] for c in HEALTH_TESTS}
LIVE = sorted(set(KSTATUS) - {"degraded_qualityDrift", "progressing_readyConditionBehind"})
Captured = tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def live(local_cluster: LocalCluster, model_directory: Path) -> Iterator[Captured]:
    namespace = local_cluster.new_namespace("gitops-health")
    world = World(local_cluster, local_cluster.admin(namespace))
    grant_operator_role(world)
    tiny = Model(build_tiny_mlp(model_directory / f"{namespace}-tiny.onnx"))
    try:
        yield asyncio.run(capture(world, tiny, model_directory))
    finally:
        local_cluster.admin().delete("v1", "namespaces", namespace, namespace=None)


@pytest.mark.parametrize("name", LIVE)
def test_the_health_of_what_the_operator_writes(live: Captured, name: str) -> None:
    obj = live[0][name]
    assert argocd_lua.health(CUSTOMIZATION, obj)["status"] == EXPECTED_HEALTH[name], obj
    assert kstatus.compute(obj).status == KSTATUS[name], obj


@pytest.mark.parametrize("name", LIVE)
def test_the_operator_still_writes_what_the_testdata_holds(live: Captured, name: str) -> None:
    recorded = yaml.safe_load((CUSTOMIZATION / "testdata" / f"{name}.yaml").read_text())
    assert projection(live[0][name]) == projection(recorded), (
        "the operator's status changed: run tests/gitops/capture_statuses.py"
    )


def test_the_actions_sent_only_the_gate_annotation(live: Captured) -> None:
    """The operator promoted and aborted on these patches alone (`capture` waited for
    both); they name the candidate each one saw, and never touch the spec."""
    captured, patches = live
    promoted = captured["progressing_shadowing"]["status"]["candidate"]["engineDigest"]
    assert patches["promote"] == {
        "metadata": {"annotations": {GATE_ANNOTATION: f"promote {promoted}"}}
    }
    aborted = captured["degraded_shadowAborted"]["status"]["candidate"]
    assert aborted["verdict"] == "Aborted" and aborted["reason"] == "ManualAbort"
    assert patches["abort"] == {
        "metadata": {"annotations": {GATE_ANNOTATION: f"abort {aborted['engineDigest']}"}}
    }
