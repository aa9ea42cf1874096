"""Whether a pod fits the node (`kubeinfer.cluster.node.scheduling`), table-driven:
resource quantities as Kubernetes writes them, the node selector and required node
affinity (terms ORed, expressions ANDed, every operator), and requests against what the
running pods leave of the node (requests not limits, except an extended resource asked
for by its limit alone; the larger of the containers' sum and any init container), with
the reasons worded as kube-scheduler words them in a FailedScheduling Event."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from kubeinfer.cluster.node.scheduling import pod_requests, quantity, unschedulable_reason

GIB = 2**30


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Decimal(2)),
        (3, Decimal(3)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        ("250u", Decimal("0.00025")),
        ("2Gi", Decimal(2 * GIB)),
        ("512Mi", Decimal(512 * 2**20)),
        ("100Ki", Decimal(102400)),
        ("1G", Decimal(10**9)),
        ("1k", Decimal(1000)),
        ("1e3", Decimal(1000)),
        ("2E", Decimal(2 * 10**18)),  # E alone is the exa suffix, not an exponent
        ("1Ei", Decimal(2**60)),
        (" 4 ", Decimal(4)),
    ],
)
def test_quantity_reads_kubernetes_suffixes(text: str | int, value: Decimal) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1Xi", "1 Gi", "2gi", "one"])
def test_a_malformed_quantity_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        quantity(text)


LABELS = {
    "kubernetes.io/hostname": "kubeinfer-node",
    "kubernetes.io/os": "linux",
    "kubernetes.io/arch": "amd64",
    "cores": "16",
}
ALLOCATABLE = {
    "cpu": Decimal(2),
    "memory": Decimal(8 * GIB),
    "pods": Decimal(110),
    "nvidia.com/gpu": Decimal(1),
}
NO_GPU = {k: v for k, v in ALLOCATABLE.items() if k != "nvidia.com/gpu"}
MISMATCH = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."


def requests(**resources: str) -> dict[str, Any]:
    return {"name": "main", "resources": {"requests": dict(resources)}}


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"containers": list(containers) or [{"name": "main"}], **spec}


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]}}}  # fmt: skip


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


PLACEMENT = [
    ("no constraints", pod(), None),
    ("selector matches", pod(nodeSelector={"kubernetes.io/os": "linux"}), None),
    ("selector value differs", pod(nodeSelector={"kubernetes.io/os": "windows"}), MISMATCH),
    ("selector key missing", pod(nodeSelector={"gpu": "a100"}), MISMATCH),
    ("In", pod(affinity=required([expression("kubernetes.io/arch", "In", "arm64", "amd64")])),
     None),
    ("In, no value matches",
     pod(affinity=required([expression("kubernetes.io/arch", "In", "arm64")])), MISMATCH),
    ("NotIn", pod(affinity=required([expression("kubernetes.io/os", "NotIn", "windows")])),
     None),
    ("NotIn, excluded",
     pod(affinity=required([expression("kubernetes.io/os", "NotIn", "linux")])), MISMATCH),
    ("Exists", pod(affinity=required([expression("cores", "Exists")])), None),
    ("Exists, absent", pod(affinity=required([expression("gpu", "Exists")])), MISMATCH),
    ("DoesNotExist", pod(affinity=required([expression("gpu", "DoesNotExist")])), None),
    ("DoesNotExist, present",
     pod(affinity=required([expression("cores", "DoesNotExist")])), MISMATCH),
    ("Gt", pod(affinity=required([expression("cores", "Gt", "8")])), None),
    ("Gt, equal", pod(affinity=required([expression("cores", "Gt", "16")])), MISMATCH),
    ("Lt", pod(affinity=required([expression("cores", "Lt", "32")])), None),
    ("Lt on a label that is not a number",
     pod(affinity=required([expression("kubernetes.io/os", "Lt", "32")])), MISMATCH),
    ("expressions of a term are ANDed",
     pod(affinity=required([expression("cores", "Exists"), expression("gpu", "Exists")])),
     MISMATCH),
    ("terms are ORed",
     pod(affinity=required([expression("gpu", "Exists")], [expression("cores", "Exists")])),
     None),
    ("a preferred term does not constrain", pod(affinity={"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
            "matchExpressions": [expression("gpu", "Exists")]}}]}}), None),
    ("placement is checked before resources",
     pod(requests(cpu="64"), nodeSelector={"gpu": "a100"}), MISMATCH),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "reason"), [c[1:] for c in PLACEMENT], ids=[c[0] for c in PLACEMENT]
)
def test_node_selector_and_required_affinity(spec: dict[str, Any], reason: str | None) -> None:
    assert unschedulable_reason(spec, LABELS, ALLOCATABLE, []) == reason


def fit(message: str) -> str:
    return f"0/1 nodes are available: {message}."


RESOURCES = [
    # (case, pod, running pods, allocatable, reason)
    ("fits", pod(requests(cpu="1", memory="1Gi")), [], ALLOCATABLE, None),
    ("exactly what is left", pod(requests(cpu="1")), [pod(requests(cpu="1"))], ALLOCATABLE,
     None),
    ("more cpu than the node", pod(requests(cpu="3")), [], ALLOCATABLE,
     fit("1 Insufficient cpu")),
    ("more cpu than the running pods leave", pod(requests(cpu="1500m")),
     [pod(requests(cpu="1"))], ALLOCATABLE, fit("1 Insufficient cpu")),
    ("cpu and memory short, sorted", pod(requests(memory="9Gi", cpu="3")), [], ALLOCATABLE,
     fit("1 Insufficient cpu, 1 Insufficient memory")),
    ("containers' requests add up", pod(requests(cpu="1200m"), requests(cpu="1200m")), [],
     ALLOCATABLE, fit("1 Insufficient cpu")),
    ("an init container bigger than the containers counts alone",
     pod(requests(cpu="100m"), initContainers=[requests(cpu="2500m")]), [], ALLOCATABLE,
     fit("1 Insufficient cpu")),
    ("init containers run one at a time, so they do not add up",
     pod(requests(cpu="100m"), initContainers=[requests(cpu="2"), requests(cpu="2")]), [],
     ALLOCATABLE, None),
    ("limits alone do not count for cpu",
     pod({"name": "main", "resources": {"limits": {"cpu": "64"}}}), [], ALLOCATABLE, None),
    ("a GPU on a node without GPUs",
     pod({"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}), [], NO_GPU,
     fit("1 Insufficient nvidia.com/gpu")),
    ("the node's one GPU is taken",
     pod({"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}),
     [pod({"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}})], ALLOCATABLE,
     fit("1 Insufficient nvidia.com/gpu")),
    ("a GPU fits", pod({"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}), [],
     ALLOCATABLE, None),
    ("the pod count is full", pod(), [pod(), pod()], {**ALLOCATABLE, "pods": Decimal(2)},
     fit("1 Too many pods")),
    ("every shortage at once, in the scheduler's order",
     pod(requests(cpu="3", memory="9Gi", **{"nvidia.com/gpu": "1"})), [pod()],
     {**NO_GPU, "pods": Decimal(1)},
     fit("1 Insufficient cpu, 1 Insufficient memory, 1 Insufficient nvidia.com/gpu, "
         "1 Too many pods")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "running", "allocatable", "reason"),
    [c[1:] for c in RESOURCES],
    ids=[c[0] for c in RESOURCES],
)
def test_requests_against_what_the_node_has_left(
    spec: dict[str, Any], running: list[dict[str, Any]], allocatable: dict[str, Decimal],
    reason: str | None,
) -> None:  # fmt: skip
    assert unschedulable_reason(spec, LABELS, allocatable, running) == reason


def test_pod_requests_take_the_larger_of_containers_and_each_init_container() -> None:
    spec = pod(
        requests(cpu="500m", memory="1Gi"),
        requests(cpu="500m", memory="1Gi"),
        initContainers=[requests(cpu="2"), requests(memory="512Mi")],
    )
    assert pod_requests(spec) == {"cpu": Decimal(2), "memory": Decimal(2 * GIB)}
