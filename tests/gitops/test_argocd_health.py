"""Argo CD's health check and resource actions for InferenceDeployment
(deploy/argocd/resource_customizations/kubeinfer.io/InferenceDeployment), and kstatus'
reading of the same objects (what Flux's health checks use).

The Lua itself runs (`argocd_lua`: lupa's Lua 5.1, with only the libraries Argo CD
opens) over Argo CD's own test tables, `health_test.yaml` and `actions/action_test.yaml`,
whose testdata are objects the real operator wrote on the real control plane
(`capture_statuses.py`; `test_health_on_the_control_plane` checks it still writes them).
The promote and abort actions write exactly the patch `kubeinfer promote|abort` sends,
and refuse where those commands refuse. No process is started here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import argocd_lua
import kstatus
import pytest
import yaml
from kubeinfer.operator.api.v1alpha1.status import InferenceDeploymentStatus
from kubeinfer.operator.commands.gate import GateRefused, gate_patch
from kubeinfer.operator.rollout.shadow import parse_gate

CUSTOMIZATION = (
    Path(__file__).resolve().parents[2]
    / "deploy/argocd/resource_customizations/kubeinfer.io/InferenceDeployment"
)
ACTIONS = CUSTOMIZATION / "actions"
HEALTH_TESTS: list[dict[str, Any]] = yaml.safe_load(
    (CUSTOMIZATION / "health_test.yaml").read_text()
)["tests"]
ACTION_TESTS: dict[str, Any] = yaml.safe_load((ACTIONS / "action_test.yaml").read_text())

KSTATUS = {
    # kstatus' documented blind spot: nothing to read before the operator's first write.
    "progressing_noStatus": "Current",
    "progressing_building": "InProgress",
    "progressing_newGeneration": "InProgress",
    # kstatus reads status.observedGeneration, not the conditions' own.
    "progressing_readyConditionBehind": "Current",
    "progressing_shadowing": "InProgress",
    "healthy_ready": "Current",
    "healthy_promoted": "Current",
    "degraded_buildFailed": "Failed",
    "degraded_engineIncompatible": "Failed",
    "degraded_shadowAborted": "Failed",
    # Drift is no reconcile failure: the operator leaves Stalled False (Argo CD's
    # Degraded is where it shows).
    "degraded_qualityDrift": "Current",
}
"""What kstatus makes of each testdata object."""


def load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def captured(name: str) -> dict[str, Any]:
    return load(CUSTOMIZATION / "testdata" / f"{name}.yaml")


@pytest.mark.parametrize("case", HEALTH_TESTS, ids=lambda c: Path(c["inputPath"]).stem)
def test_health_lua_gives_the_health_its_table_expects(case: dict[str, Any]) -> None:
    obj = load(CUSTOMIZATION / case["inputPath"])
    assert argocd_lua.health(CUSTOMIZATION, obj) == case["healthStatus"]


def test_every_testdata_object_has_a_health_case_and_a_kstatus_one() -> None:
    files = {path.stem for path in (CUSTOMIZATION / "testdata").glob("*.yaml")}
    assert files == {Path(case["inputPath"]).stem for case in HEALTH_TESTS}
    assert files == set(KSTATUS)


@pytest.mark.parametrize("name", sorted(KSTATUS))
def test_kstatus_reads_the_same_objects_as_flux_does(name: str) -> None:
    assert kstatus.compute(captured(name)).status == KSTATUS[name]


@pytest.mark.parametrize("name", sorted(KSTATUS))
def test_the_testdata_statuses_still_fit_the_status_api(name: str) -> None:
    """A renamed or removed status field fails here: capture the testdata again."""
    status = captured(name).get("status")
    if status is not None:
        InferenceDeploymentStatus.model_validate(status)


@pytest.mark.parametrize("case", ACTION_TESTS["discoveryTests"], ids=lambda c: c["inputPath"])
def test_discovery_offers_promote_and_abort_only_on_a_candidate_under_test(
    case: dict[str, Any],
) -> None:
    found = argocd_lua.discover(CUSTOMIZATION, load(ACTIONS / case["inputPath"]))
    expected = {item["name"]: {k: v for k, v in item.items() if k != "name"}
                for item in case["result"]}  # fmt: skip
    assert found == expected


@pytest.mark.parametrize("case", ACTION_TESTS["actionTests"], ids=lambda c: c["action"])
def test_an_action_returns_its_expected_object(case: dict[str, Any]) -> None:
    obj = load(ACTIONS / case["inputPath"])
    expected = load(ACTIONS / case["expectedOutputPath"])
    assert argocd_lua.act(CUSTOMIZATION, case["action"], obj) == expected


@pytest.mark.parametrize("action", ["promote", "abort"])
def test_an_action_sends_the_patch_the_gate_command_sends(action: str) -> None:
    shadowing = captured("progressing_shadowing")
    digest = shadowing["status"]["candidate"]["engineDigest"]
    result = argocd_lua.act(CUSTOMIZATION, action, shadowing)
    assert argocd_lua.merge_patch(shadowing, result) == gate_patch(shadowing, action, None)[0]
    assert parse_gate(result["metadata"]["annotations"]) == (action, digest)


@pytest.mark.parametrize("name", ["healthy_ready", "degraded_shadowAborted"])
@pytest.mark.parametrize("action", ["promote", "abort"])
def test_an_action_refuses_where_the_gate_command_refuses(action: str, name: str) -> None:
    obj = captured(name)
    with pytest.raises(GateRefused, match="no candidate under shadow test"):
        gate_patch(obj, action, None)
    with pytest.raises(argocd_lua.LuaScriptError, match="no candidate under shadow test"):
        argocd_lua.act(CUSTOMIZATION, action, obj)


def test_the_harness_opens_only_the_libraries_argo_cd_opens(tmp_path: Path) -> None:
    folder = tmp_path / "Kind"
    folder.mkdir()
    script = folder / "health.lua"
    script.write_text('local t = {}; table.insert(t, "Healthy"); return {status = t[1]}')
    assert argocd_lua.health(folder, {})["status"] == "Healthy"
    for closed in ('string.upper("x")', '("x"):upper()', "math.floor(1.5)", "io.write('x')"):
        script.write_text(f"local x = {closed}; return {{status = 'Healthy'}}")
        with pytest.raises(argocd_lua.LuaScriptError):
            argocd_lua.health(folder, {})
    script.write_text("return {status = 'Fine'}")
    assert argocd_lua.health(folder, {})["status"] == "Unknown"


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}, "Terminating"),
        ({"metadata": {"generation": 2}, "status": {"observedGeneration": 1}}, "InProgress"),
        ({"metadata": {"generation": 2}, "status": {}}, "Current"),
        ({"metadata": {}, "status": {"conditions": [
            {"type": "Stalled", "status": "True"}, {"type": "Reconciling", "status": "True"}]}},
         "Failed"),
        ({"metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}},
         "InProgress"),
        ({"metadata": {}, "status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "Stalled", "status": "False"}]}},
         "Current"),
    ],
)  # fmt: skip
def test_kstatus_rules_in_their_documented_order(obj: dict[str, Any], expected: str) -> None:
    """Deletion, then observedGeneration (only when present), then the first of Reconciling
    and Stalled found True, then Ready only for objects with neither condition."""
    assert kstatus.compute(obj).status == expected
