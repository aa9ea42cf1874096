"""What kopf's diff base costs per child event, side by side in one run: kopf's own
`AnnotationsDiffBaseStorage` (a deep copy of the object, built on every event of every
kind kopf watches) and the operator's `OwnerEssenceStorage` (the same for
InferenceDeployments, nothing for any other kind), on a runtime pod's body as the API
serves it (labels, annotations, managed fields, a container, status).

    .venv/bin/python tests/benchmarks/bench_kopf_essence.py
"""

from __future__ import annotations

import timeit

import kopf
from kubeinfer.operator.handlers import ANNOTATION_PREFIX, OwnerEssenceStorage

EVENTS = 5000
KEY = "last-handled-configuration"


def pod() -> dict[str, object]:
    managed = {f"f:field{i}": {"f:x": {}} for i in range(40)}
    container = {
        "name": "runtime", "image": "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0",
        "args": ["serve", "--config", "/etc/kubeinfer/runtime.json"],
        "env": [{"name": f"ENV_{i}", "value": "v" * 30} for i in range(12)],
        "ports": [{"name": "http", "containerPort": 8000}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "volumeMounts": [{"name": f"v{i}", "mountPath": f"/m{i}"} for i in range(4)],
    }  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "model-00001-runtime-7d9f8c6b5-x2x4z", "namespace": "fleet",
            "labels": {f"label{i}": "v" * 20 for i in range(8)},
            "annotations": {f"annotation{i}": "v" * 40 for i in range(6)},
            "managedFields": [{"manager": m, "operation": "Update", "fieldsV1": managed}
                              for m in ("kube-controller-manager", "kube-scheduler", "kwok")],
        },
        "spec": {"containers": [container],
                 "volumes": [{"name": f"v{i}", "configMap": {"name": "c"}} for i in range(4)]},
        "status": {"phase": "Running", "podIP": "10.128.0.5", "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]},
    }  # fmt: skip


def main() -> None:
    body = kopf.Body(pod())
    storages = {
        "kopf's AnnotationsDiffBaseStorage": kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key=KEY
        ),
        "OwnerEssenceStorage": OwnerEssenceStorage(prefix=ANNOTATION_PREFIX, key=KEY),
    }
    seconds = {}
    for name, storage in storages.items():
        run = lambda s=storage: (s.fetch(body=body), s.build(body=body))  # noqa: E731
        seconds[name] = min(timeit.repeat(run, number=EVENTS, repeat=5)) / EVENTS
        print(f"{name}: {seconds[name] * 1e6:.1f} µs per child event (fetch + build)")
    stock, mine = seconds.values()
    print(f"ratio: {stock / mine:.0f}x less per child event")


if __name__ == "__main__":
    main()
