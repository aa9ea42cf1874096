"""The cost's view of nodes and pods (`kubeinfer.operator.state.cost_readings`): a node's
price (its GPU product's, else `cpu`'s), a serving pod's run on it (its share: GPUs of a
GPU pod, CPU of the others; from its start, while not finished), the window's memory of
pods across passes (a pod gone counts until its last sight, then is forgotten once out of
the window), and the seconds each ran inside the window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.contract.cost import PodUsage
from kubeinfer.operator.state.cost_readings import (
    PodRun,
    cpu_cores,
    pod_run,
    pod_runs,
    priced_node,
    remember_runs,
    running_seconds,
    usages,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"
PRICES = {A100: 32.0, "cpu": 0.8}


def node(name: str, gpus: int = 0, cpu: str = "8", product: str | None = None) -> dict:
    labels = {"kubernetes.io/hostname": name}
    if product:
        labels["nvidia.com/gpu.product"] = product
    allocatable = {"cpu": cpu, "memory": "64Gi"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


NODES = {
    n.name: n for n in map(priced_node, [node("gpu-1", 8, "96", A100), node("cpu-1", cpu="7910m")])
}


def pod(
    name: str,
    on: str | None = "gpu-1",
    gpus: str | None = "1",
    cpu: str | None = "4",
    started: datetime | None = NOW - timedelta(minutes=10),
    phase: str = "Running",
    limits_only: bool = False,
) -> dict:
    amounts = {k: v for k, v in (("cpu", cpu), ("nvidia.com/gpu", gpus)) if v is not None}
    resources = {"limits": amounts} if limits_only else {"requests": amounts, "limits": amounts}
    status: dict = {"phase": phase}
    if started is not None:
        status["startTime"] = started.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {"name": name},
        "spec": {**({"nodeName": on} if on else {}),
                 "containers": [{"name": "runtime", "resources": resources}]},
        "status": status,
    }  # fmt: skip


def test_a_nodes_price_is_its_gpu_products_else_cpus() -> None:
    gpu, cpu = NODES["gpu-1"], NODES["cpu-1"]
    assert (gpu.gpu_product, gpu.gpus, gpu.cpu_cores) == (A100, 8, 96)
    assert (cpu.gpu_product, cpu.gpus, cpu.cpu_cores) == (None, 0, pytest.approx(7.91))
    assert gpu.price_per_hour(PRICES) == 32.0 and cpu.price_per_hour(PRICES) == 0.8
    assert gpu.price_per_hour({"cpu": 0.8}) is None, "a GPU node is not priced as a CPU one"
    assert cpu.price_per_hour({A100: 32.0}) is None


@pytest.mark.parametrize(
    ("quantity", "cores"),
    [("500m", 0.5), ("2", 2.0), ("1.5", 1.5), ("7910m", 7.91), (4, 4.0), ("lots", None),
     ("-1", None), (None, None)],
)  # fmt: skip
def test_cpu_quantities(quantity, cores) -> None:
    assert cpu_cores(quantity) == (pytest.approx(cores) if cores is not None else None)


def test_a_gpu_pod_holds_its_gpus_of_its_node_a_cpu_pod_its_cpu() -> None:
    gpu = pod_run(pod("a"), NODES, PRICES, NOW)
    assert gpu is not None and gpu.node_share == 1 / 8 and gpu.price_per_hour == 4.0
    assert gpu.started == NOW - timedelta(minutes=10) and gpu.running and gpu.last_seen == NOW
    cpu = pod_run(pod("b", on="cpu-1", gpus=None, cpu="3955m"), NODES, PRICES, NOW)
    assert cpu is not None and cpu.node_share == pytest.approx(0.5)
    assert cpu.price_per_hour == pytest.approx(0.4)
    limits = pod_run(pod("c", gpus="2", limits_only=True), NODES, PRICES, NOW)
    assert limits is not None and limits.node_share == 2 / 8, "a limit alone is its request"


def test_a_pod_not_yet_on_a_node_not_started_or_finished_does_not_run() -> None:
    assert pod_run(pod("a", on=None), NODES, PRICES, NOW) is None
    assert pod_run(pod("a", started=None), NODES, PRICES, NOW) is None
    for phase in ("Succeeded", "Failed"):
        assert pod_run(pod("a", phase=phase), NODES, PRICES, NOW) is None
    pending = pod_run(pod("a", phase="Pending"), NODES, PRICES, NOW)
    assert pending is not None and pending.running, "pulling its image, it holds the node"


def test_a_pod_without_a_price_or_a_share_runs_unpriced() -> None:
    unknown_node = pod_run(pod("a", on="gone-node"), NODES, PRICES, NOW)
    unpriced = pod_run(pod("b"), NODES, {"cpu": 0.8}, NOW)
    no_request = pod_run(pod("c", on="cpu-1", gpus=None, cpu=None), NODES, PRICES, NOW)
    for run in (unknown_node, unpriced, no_request):
        assert run is not None and not run.priced and run.price_per_hour is None
    assert usages([r for r in (unknown_node, unpriced, no_request) if r], NOW, 3600) == {}


def run(name: str, minutes_ago: float, seen_minutes_ago: float = 0, running: bool = True):
    return PodRun(name, "gpu-1", NOW - timedelta(minutes=minutes_ago),
                  NOW - timedelta(minutes=seen_minutes_ago), 1 / 8, 32.0, running)  # fmt: skip


def test_the_window_remembers_a_pod_gone_until_its_last_sight_then_forgets_it() -> None:
    earlier = NOW - timedelta(minutes=5)
    first = pod_runs([pod("a"), pod("b")], NODES, PRICES, earlier)
    kept = remember_runs((), first, earlier, 3600)
    assert [(r.pod, r.running) for r in kept] == [("a", True), ("b", True)]
    # b is gone at the next pass: it ran until it was last seen, five minutes ago.
    now = remember_runs(kept, pod_runs([pod("a")], NODES, PRICES, NOW), NOW, 3600)
    (a, b) = now
    assert (a.pod, a.running, a.last_seen) == ("a", True, NOW)
    assert (b.pod, b.running, b.last_seen) == ("b", False, earlier)
    assert running_seconds(b, NOW, 3600) == 5 * 60
    # An hour and a little later b's last sight is out of the window: forgotten.
    later = NOW + timedelta(minutes=56)
    (only,) = remember_runs(now, pod_runs([pod("a")], NODES, PRICES, later), later, 3600)
    assert only.pod == "a"


def test_the_seconds_a_pod_ran_are_those_inside_the_window() -> None:
    assert running_seconds(run("old", 120), NOW, 3600) == 3600, "started before the window"
    assert running_seconds(run("new", 10), NOW, 3600) == 600
    assert running_seconds(run("gone", 30, 20, running=False), NOW, 3600) == 600
    assert running_seconds(run("long-gone", 200, 100, running=False), NOW, 3600) == 0
    assert usages([run("new", 10)], NOW, 3600) == {"new": PodUsage(1 / 8, 32.0, 600)}
