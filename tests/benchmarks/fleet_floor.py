"""What the control plane alone takes for a fleet's objects: the floor under bench_fleet's
time to Ready, on the same cluster and simulated nodes, with no operator.

A script, not a test; as root:

    .venv/bin/python tests/benchmarks/fleet_floor.py [--n 1000] [--nodes 500] [--json out.json]

For each of N objects it creates (16 clients) what the operator would have created for
bench_fleet's InferenceDeployment, with the same scheduling: first every build Job (one
pod, one GPU of the object's product, which KWOK completes after 2 s), and once all have
succeeded (their GPUs are the serving pods': an L4 node's four GPUs cannot hold both),
every Deployment of 2 pods (one GPU each, spread over zones and nodes as a preference),
its Service and its PodDisruptionBudget; then it waits until every Deployment has its 2
pods ready. What it leaves out is the operator's part: its passes, its status writes and
Events, and its order per object (the operator deploys an object once its own build is
done, not once all are); so the difference between the two is what the operator adds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fleet_probe as probe
from bench_fleet import PRODUCTS, Fleet
from kubeinfer.cluster import netns

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # waiting
from waiting import wait_for

KWOK = {"nodeSelector": {"type": "kwok"},
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists",
                         "effect": "NoSchedule"}]}  # fmt: skip
GPU = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}


def pod_spec(product: str, labels: dict[str, str], spread: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {**KWOK["nodeSelector"], "nvidia.com/gpu.product": product},
        "tolerations": KWOK["tolerations"],
        "containers": [{"name": "c", "image": "runtime", "resources": GPU}],
    }
    if spread:
        spec["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": labels}}
            for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
        ]  # fmt: skip
    else:
        spec["restartPolicy"] = "Never"
    return spec


def children(namespace: str, index: int) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) for one object's Job, Deployment, Service and budget."""
    name, product = f"model-{index:05d}", PRODUCTS[index % len(PRODUCTS)]
    labels = {"app": name}
    meta = {"namespace": namespace, "labels": labels}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-build", **meta},
           "spec": {"backoffLimit": 1, "template": {"metadata": {"labels": {"build": name}},
                                                    "spec": pod_spec(product, {"build": name},
                                                                     spread=False)}}}  # fmt: skip
    template = {"metadata": {"labels": labels}, "spec": pod_spec(product, labels, spread=True)}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": f"{name}-runtime", **meta},
                  "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                           "template": template}}  # fmt: skip
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, **meta},
               "spec": {"selector": labels, "ports": [{"port": 8000}]}}  # fmt: skip
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
              "metadata": {"name": f"{name}-runtime", **meta},
              "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}}  # fmt: skip
    base = f"/namespaces/{namespace}"
    return [(f"/apis/batch/v1{base}/jobs", job), (f"/apis/apps/v1{base}/deployments", deployment),
            (f"/api/v1{base}/services", service),
            (f"/apis/policy/v1{base}/poddisruptionbudgets", budget)]  # fmt: skip


def done(fleet: Fleet, namespace: str) -> tuple[int, int]:
    """(Jobs succeeded, Deployments with 2 ready pods)."""
    jobs = fleet.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs")["items"]
    deployments = fleet.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")
    built = sum((j.get("status") or {}).get("succeeded", 0) >= 1 for j in jobs)
    ready = sum((d.get("status") or {}).get("readyReplicas", 0) >= 2 for d in deployments["items"])
    return built, ready


def create(fleet: Fleet, requests: list[tuple[str, dict[str, Any]]]) -> None:
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda r: fleet.request("POST", *r), requests))


def wait(fleet: Fleet, namespace: str, n: int, deadline: float, which: int) -> int:
    """Until all n are built (`which` 0) or ready (1), or the deadline; how many are."""
    seen = [(-1, -1)]

    def all_done() -> bool:
        now = done(fleet, namespace)
        if now != seen[-1]:
            print(f"#   {now[0]} built, {now[1]} ready of {n}", flush=True)
        seen.append(now)
        return now[which] >= n

    with contextlib.suppress(AssertionError):  # the deadline: the row says how many
        wait_for(all_done, within=max(0.0, deadline - time.monotonic()), every=2)
    return seen[-1][which]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--pprof-seconds",
        type=int,
        default=0,
        help="as bench_fleet's (into the logs' directory, pprof/; with --keep)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    netns.enter_new_namespace()
    directory = Path(tempfile.mkdtemp(prefix="fleet-floor-", dir="/var/tmp"))
    print(f"# logs in {directory}", flush=True)
    fleet = Fleet(directory, args.nodes)
    try:
        namespace = "floor"
        fleet.namespace(namespace)
        objects = [children(namespace, i) for i in range(args.n)]
        processes_before = probe.cpu_by_process_name()
        if args.pprof_seconds:
            probe.start_go_profiles(fleet.cluster, args.pprof_seconds, directory / "pprof")
        start = time.monotonic()
        create(fleet, [made[0] for made in objects])  # the builds first: their GPUs are the
        built = wait(fleet, namespace, args.n, start + args.timeout, 0)  # serving pods' after
        builds_seconds = time.monotonic() - start
        create(fleet, [item for made in objects for item in made[1:]])
        ready = wait(fleet, namespace, args.n, start + args.timeout, 1)
        result = {"n": args.n, "nodes": args.nodes, "built": built, "ready": ready,
                  "seconds_to_all_built": round(builds_seconds, 1),
                  "seconds_to_all_ready": round(time.monotonic() - start, 1),
                  "cpu_seconds_to_ready_by_process": probe.cpu_spent(
                      probe.cpu_by_process_name(), processes_before)}  # fmt: skip
        print(json.dumps(result), flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        fleet.control_plane.down(fleet.cluster.directory)
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
