"""The demo's shadow step: live traffic mirrored to two candidates, compared request by
request, and judged by the operator's own verdict.

The serving runtime (fp32) watches a mirror target file, as a serving pod watches its
mounted ConfigMap. The demo points it at a candidate, drives load at the serving runtime
only, reads the serving runtime's shadow figures through the operator's metrics source
(the direct read of a pod's /metrics that the operator uses without Prometheus; only the
pod listing is replaced by this one local process) and judges them with
`kubeinfer.operator.rollout.verdict.judge`, as the operator would on each pass:

1. an int8 engine of the same model: small differences, top-1 mostly agreeing: Passed;
2. an fp32 engine of another model with the same tensor names: Failed at once.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from kubeinfer.cli.demo.load import drive, free_port, http_get
from kubeinfer.operator.api.v1alpha1.inference_deployment import ShadowSpec
from kubeinfer.operator.metrics.direct import DirectRead
from kubeinfer.operator.metrics.queries import Scope
from kubeinfer.operator.metrics.shadow import read_shadow_aggregates
from kubeinfer.operator.rollout.verdict import judge

MODEL_NAME = "demo"
THRESHOLDS = ShadowSpec.model_validate(
    {
        "trafficPercent": 50,
        "minSamples": 200,
        "maxDurationSeconds": 600,
        "thresholds": {
            "maxAbsoluteOutputDifference": 0.5,
            "minTop1Agreement": 0.9,
            "maxP99LatencyRegressionPercent": 50,
        },
    }
)
"""The demo's rollout.shadow. On this model's logits int8 moves single values by up to
about 0.15 and changes about one top-1 class in 40 (the build's accuracy report says so
too), another model moves them by about 2: the limits sit between. Both runtimes share
two cores with the load generator, so the latency allowance is wide."""


def _serve(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _serve_command(port: int, engine: str, cache: str, version: str) -> list[str]:
    return [
        sys.executable, "-m", "kubeinfer.cli", "serve",
        "--engine", engine, "--cache", cache, "--model-name", MODEL_NAME,
        "--model-version", version, "--host", "127.0.0.1", "--port", str(port),
        "--max-batch-size", "32", "--drain-grace-period-seconds", "5",
    ]  # fmt: skip


def _pod(port: int) -> dict[str, Any]:
    """The serving runtime as the API would list its pod."""
    return {
        "metadata": {"name": "demo-runtime-0-local"},
        "spec": {"containers": [{"name": "runtime", "ports": [{"name": "http",
                                                               "containerPort": port}]}]},
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def _figure(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else format(value, pattern)


async def _judge_candidate(
    base: str,
    port: int,
    mirror_file: Path,
    name: str,
    version: str,
    digest: str,
    candidate_port: int,
    seconds: float,
) -> tuple[bool, str]:
    """Points the mirror at one candidate, drives load, judges; returns (passed, line)."""
    target = {
        "target": {
            "url": f"http://127.0.0.1:{candidate_port}",
            "modelName": MODEL_NAME,
            "candidateVersion": version,
            "candidateDigest": digest,
            "trafficPercent": THRESHOLDS.traffic_percent,
        }
    }
    staged = mirror_file.with_suffix(".tmp")
    staged.write_text(yaml.safe_dump(target))
    staged.replace(mirror_file)  # atomically, as the kubelet updates a mounted ConfigMap
    started = datetime.now(UTC)
    deadline = time.monotonic() + 15
    while True:  # the runtime re-reads the file every mirrorPollIntervalMilliseconds
        status = json.loads(http_get(f"{base}/v2/shadow")[1] or b"{}")
        if (status.get("candidate") or {}).get("digest") == digest:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the serving runtime did not pick up the mirror target")
        await asyncio.sleep(0.2)

    rows = np.random.default_rng(11).standard_normal((256, 512)).astype(np.float32)
    tensor = {"name": "input", "shape": [1, 512], "datatype": "FP32"}
    bodies = [json.dumps({"inputs": [{**tensor, "data": row.tolist()}]}).encode() for row in rows]
    load = await drive(f"{base}/v2/models/{MODEL_NAME}/infer", bodies, 8, seconds)
    await asyncio.sleep(1.0)  # the last mirrored requests are compared

    async def list_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
        return [_pod(port)]

    source = DirectRead(list_pods, timeout_seconds=5)
    aggregates = await read_shadow_aggregates(
        source, Scope("demo", MODEL_NAME), digest, started, datetime.now(UTC)
    )
    verdict = judge(THRESHOLDS, aggregates, started, datetime.now(UTC))
    codes = ", ".join(f"{code}: {n}" for code, n in sorted(load.codes.items()))
    lost = aggregates.candidate_errors + aggregates.timeouts
    serving_p99, candidate_p99 = aggregates.primary_p99_seconds, aggregates.candidate_p99_seconds
    cells = [
        name,
        str(aggregates.compared),
        _figure(aggregates.max_abs_difference, ".4f"),
        _figure(aggregates.top1_agreement, ".3f"),
        _figure(serving_p99 and serving_p99 * 1e3, ".2f"),
        _figure(candidate_p99 and candidate_p99 * 1e3, ".2f"),
        f"{aggregates.dropped} / {lost}",
        codes,
        f"**{verdict.outcome}** {verdict.reason}",
    ]
    line = "  | " + " | ".join(cells) + " |"
    return set(load.codes) == {200}, line + f"\n{' ' * 4}{verdict.message}"


MIN_LOAD_SECONDS = 2.0
"""Load per candidate at least: minSamples compared requests take about a second here."""


def run_shadow_step(workdir: Path, cache: str, digests: dict[str, str], seconds: float) -> bool:
    """Serves `digests['fp32']`, mirrors to `digests['int8']` then `digests['other']`."""
    seconds = max(seconds, MIN_LOAD_SECONDS)
    ports = {role: free_port() for role in ("serving", "int8", "other")}
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    mirror_file = workdir / "mirror.yaml"
    mirror_file.write_text("{}\n")
    serving = _serve_command(ports["serving"], digests["fp32"], cache, "1")
    serving += ["--mirror-target-file", str(mirror_file)]
    processes = [_serve(serving, logs / "serving.log")]
    processes.append(_serve(_serve_command(ports["int8"], digests["int8"], cache, "2-int8"),
                            logs / "candidate-int8.log"))  # fmt: skip
    processes.append(_serve(_serve_command(ports["other"], digests["other"], cache, "2-other"),
                            logs / "candidate-other.log"))  # fmt: skip
    ok = True
    try:
        for port in ports.values():
            deadline = time.monotonic() + 60
            while http_get(f"http://127.0.0.1:{port}/v2/health/ready")[0] != 200:
                if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                    print(f"  a runtime did not become ready; see {logs}", file=sys.stderr)
                    return False
                time.sleep(0.1)
        base = f"http://127.0.0.1:{ports['serving']}"
        limits = THRESHOLDS.thresholds
        print(
            f"  serving: fp32 on :{ports['serving']}, mirroring {THRESHOLDS.traffic_percent}% "
            f"of its requests; thresholds: max |diff| {limits.max_absolute_output_difference}, "
            f"top-1 >= {limits.min_top1_agreement}, "
            f"p99 +{limits.max_p99_latency_regression_percent:g}%, "
            f"minSamples {THRESHOLDS.min_samples}\n"
        )
        print(
            "  | candidate | compared | max abs diff | top-1 agreement | serving p99 ms "
            "| candidate p99 ms | dropped / errors | serving answers | verdict |"
        )
        print("  |---|--:|--:|--:|--:|--:|--:|---|---|")
        for name, role, version in (
            ("int8, same model", "int8", "2-int8"),
            ("fp32, another model", "other", "2-other"),
        ):
            answered, line = asyncio.run(
                _judge_candidate(
                    base, ports["serving"], mirror_file, name, version, digests[role],
                    ports[role], seconds,
                )
            )  # fmt: skip
            print(line)
            ok = ok and answered
        mirror_file.write_text("{}\n")
        print(
            "\n  The serving runtime answered every request itself (the mirror works beside "
            "the request path);\n  the operator judges the same figures, read from the pods "
            "or from Prometheus, on every pass."
        )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    return ok
