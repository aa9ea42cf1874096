"""The simulated GPU fleet `kubeinfer cluster up --simulated-gpu-nodes PRODUCT=COUNT`
asks for (`kubeinfer.cluster.fleet`), before any cluster runs: the counts are read as a
user writes them, each product's nodes are spread over the zones, every node has its own
name and addresses, its Node object is a valid one labelled as GPU feature discovery
labels a node of its product, and a product the fleet does not know is refused with the
known ones named (the cluster is not started). `test_cluster_command` starts one."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import kubernetes_validate
import pytest
from kubeinfer.cluster import fleet

KUBEINFER = Path(sys.executable).parent / "kubeinfer"


@pytest.mark.parametrize(
    ("text", "read"), [("H100=2", ("H100", 2)), ("l4=0", ("L4", 0)), (" a10g = 3", ("A10G", 3))]
)
def test_a_product_count_is_read_whatever_its_case(text: str, read: tuple[str, int]) -> None:
    assert fleet.product_count(text) == read


@pytest.mark.parametrize("text", ["B200=1", "H100", "H100=-1", "H100=two", "=1"])
def test_a_product_count_that_is_not_one_names_the_products(text: str) -> None:
    with pytest.raises(ValueError, match="expected PRODUCT=COUNT, PRODUCT one of H100, H200"):
        fleet.product_count(text)


def test_each_products_nodes_are_spread_over_the_zones_with_addresses_of_their_own() -> None:
    nodes = fleet.plan_products({"H100": 4, "L4": 2, "A10G": 0})
    assert Counter(node.product for node in nodes) == {"H100": 4, "L4": 2}
    assert [n.zone for n in nodes if n.product == "H100"] == [*fleet.ZONES, fleet.ZONES[0]]
    assert [n.zone for n in nodes if n.product == "L4"] == list(fleet.ZONES[:2])
    manifests = [fleet.node_manifest(node) for node in nodes]
    assert len({m["metadata"]["name"] for m in manifests}) == len(nodes)
    assert len({m["spec"]["podCIDR"] for m in manifests}) == len(nodes)
    assert len({m["status"]["addresses"][0]["address"] for m in manifests}) == len(nodes)


def test_a_simulated_node_is_a_valid_node_labelled_as_its_product_is() -> None:
    [node] = fleet.plan_products({"H200": 1})
    manifest = fleet.node_manifest(node)
    kubernetes_validate.validate(manifest, "1.33", strict=True)
    labels = manifest["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.count"] == manifest["status"]["allocatable"]["nvidia.com/gpu"]
    assert labels[fleet.ZONE_LABEL] == fleet.ZONES[0]
    assert fleet.SIMULATED_TAINT in manifest["spec"]["taints"]


def test_a_fleet_past_the_pod_network_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 16000"):
        fleet.plan_products({"H100": fleet.MAX_NODES, "L4": 1})


def test_cluster_up_refuses_an_unknown_product_before_starting_anything(tmp_path: Path) -> None:
    directory = tmp_path / "never-up"
    up = subprocess.run(
        [str(KUBEINFER), "cluster", "up", "--directory", str(directory),
         "--simulated-gpu-nodes", "H100=1", "--simulated-gpu-nodes", "B200=1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert up.returncode == 2, up.stderr
    assert "--simulated-gpu-nodes: 'B200=1': expected PRODUCT=COUNT" in up.stderr
    assert not directory.exists()
