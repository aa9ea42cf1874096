"""What parsing kopf's watch events costs with the standard library's json and with orjson
(`kubeinfer.operator.kube.kopf_json`), on the events a fleet's watches carry: a serving
pod as the API server sends it, and an InferenceDeployment with a status, each one line
of a watch stream. A script, not a test:

    .venv/bin/python tests/benchmarks/bench_kopf_watch_json.py [--rounds 5] [--lines 20000]

The two parsers take turns, `--rounds` times each, over the same lines (decoded from
bytes first, as kopf does); the report is each one's median microseconds per line and
their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

REPO = Path(__file__).resolve().parents[2]


def pod(index: int) -> dict[str, Any]:
    name = f"model-{index:05d}-runtime-7d9f8c6b5-x{index:04x}"
    labels = {"app.kubernetes.io/instance": f"model-{index:05d}",
              "pod-template-hash": "7d9f8c6b5", "app.kubernetes.io/managed-by": "kubeinfer",
              "kubeinfer.io/role": "serving"}  # fmt: skip
    container = {
        "name": "runtime", "image": "ghcr.io/kubeinfer/kubeinfer-runtime-gpu:0.1.0",
        "args": ["serve", "--config", "/etc/kubeinfer/runtime.yaml"],
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"},
                  {"name": "grpc", "containerPort": 8001, "protocol": "TCP"}],
        "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "8Gi"},
                      "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}},
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
                           "periodSeconds": 2, "failureThreshold": 3},
        "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/kubeinfer", "readOnly": True},
                         {"name": "engines", "mountPath": "/var/cache/kubeinfer",
                          "readOnly": True}, {"name": "tmp", "mountPath": "/tmp"}],
    }  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "fleet", "uid": f"4f1c{index:08x}-1b2c-4d5e-9f00",
                     "resourceVersion": str(100000 + index), "labels": labels,
                     "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": f"model-{index:05d}-runtime-7d9f8c6b5",
                                          "uid": "9a8b7c6d", "controller": True}],
                     "creationTimestamp": "2026-11-27T14:00:00Z"},
        "spec": {"containers": [container], "nodeName": f"kwok-node-{index % 500}",
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                  "effect": "NoSchedule"}],
                 "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"phase": "Running", "podIP": f"10.244.{index // 250}.{index % 250}",
                   "conditions": [{"type": t, "status": "True",
                                   "lastTransitionTime": "2026-11-27T14:00:03Z"}
                                  for t in ("PodScheduled", "Initialized", "ContainersReady",
                                            "Ready")],
                   "containerStatuses": [{"name": "runtime", "ready": True, "restartCount": 0,
                                          "image": container["image"], "started": True,
                                          "state": {"running": {
                                              "startedAt": "2026-11-27T14:00:02Z"}}}]},
    }  # fmt: skip


def inference_deployment(index: int) -> dict[str, Any]:
    manifest = yaml.safe_load((REPO / "examples" / "gpu-int8-shadow-autoscale.yaml").read_text())
    manifest["metadata"].update(name=f"model-{index:05d}", resourceVersion=str(200000 + index),
                                generation=2, uid=f"7e2d{index:08x}")  # fmt: skip
    manifest["status"] = {
        "observedGeneration": 2, "phase": "Ready", "replicas": 2, "readyReplicas": 2,
        "engine": {"digest": "sha256:" + "ab" * 32, "builtAt": "2026-11-27T14:00:00Z"},
        "conditions": [{"type": t, "status": "True", "reason": "Serving", "message": "m",
                        "observedGeneration": 2, "lastTransitionTime": "2026-11-27T14:00:00Z"}
                       for t in ("Ready", "EngineReady", "Available", "Progressing")],
    }  # fmt: skip
    return manifest


def lines(count: int) -> list[bytes]:
    """Watch-stream lines, half pods, half InferenceDeployments, as bytes."""
    make = (pod, inference_deployment)
    return [
        json.dumps({"type": "MODIFIED", "object": make[i % 2](i)}).encode() for i in range(count)
    ]


def seconds(parse: Any, data: list[bytes]) -> float:
    start = time.perf_counter()
    for line in data:
        parse(line.decode("utf-8"))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args()
    data = lines(args.lines)
    assert all(json.loads(line) == orjson.loads(line.decode()) for line in data[:200])
    times: dict[str, list[float]] = {"json": [], "orjson": []}
    for _ in range(args.rounds):
        times["json"].append(seconds(json.loads, data))
        times["orjson"].append(seconds(orjson.loads, data))
    per_line = {k: statistics.median(v) / len(data) * 1e6 for k, v in times.items()}
    size = sum(map(len, data)) / len(data)
    print(f"{len(data)} watch lines, {size:,.0f} bytes each on average, {args.rounds} rounds "
          f"in turns (median):")  # fmt: skip
    for name, micros in per_line.items():
        print(f"  {name:7s} {micros:7.1f} us a line")
    print(f"  json / orjson: {per_line['json'] / per_line['orjson']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
