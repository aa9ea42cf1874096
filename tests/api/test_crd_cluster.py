"""Against a real API server (marker `cluster`, KUBECONFIG set; skipped otherwise): the CRD
is Established with no NonStructuralSchema condition, the examples are accepted and come
back unchanged after pruning and defaulting (a server-side dry run), and a manifest that
breaks a CEL rule is refused with the rule's message. No cluster can run on our machines,
so these have not run here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator.api.v1alpha1 import GROUP, PLURAL, VERSION
from kubeinfer.operator.crdgen.crd import build_crd
from waiting import wait_for

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def api() -> Any:
    kubernetes = pytest.importorskip("kubernetes")
    kubernetes.config.load_kube_config()
    client = kubernetes.client.ApiClient()
    extensions = kubernetes.client.ApiextensionsV1Api(client)
    crd = build_crd()
    try:
        extensions.create_custom_resource_definition(crd)
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise
        existing = extensions.read_custom_resource_definition(crd["metadata"]["name"])
        crd["metadata"]["resourceVersion"] = existing.metadata.resource_version
        extensions.replace_custom_resource_definition(crd["metadata"]["name"], crd)

    def established() -> bool:
        read = extensions.read_custom_resource_definition(crd["metadata"]["name"])
        conditions = {c.type: c for c in read.status.conditions or []}
        assert (
            "NonStructuralSchema" not in conditions
            or conditions["NonStructuralSchema"].status != "True"
        ), conditions["NonStructuralSchema"].message
        return "Established" in conditions and conditions["Established"].status == "True"

    wait_for(established, 60, "the CRD to be Established", every=0.2)
    return kubernetes.client.CustomObjectsApi(client)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_round_trip_through_the_api_server(api: Any, path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    document["metadata"]["namespace"] = "default"
    stored = api.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, document, dry_run="All"
    )
    for section in ("model", "engine", "runtime"):
        for key, value in document["spec"].get(section, {}).items():
            assert stored["spec"][section][key] == value or isinstance(value, dict)


def test_a_cel_rule_is_enforced_with_its_message(api: Any) -> None:
    from kubernetes.client import ApiException

    path = ROOT / "tests" / "manifests" / "invalid" / "int8-without-calibration.yaml"
    document = yaml.safe_load(path.read_text())
    with pytest.raises(ApiException) as refused:
        api.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, document, dry_run="All"
        )
    assert "precision int8 needs calibration data unless the engine is pinned" in str(
        refused.value.body
    )
