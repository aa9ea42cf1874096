"""The shadow rollout end to end: the real operator (in-process, against the emulated API
server) with real processes standing in for its pods (`process_kubelet`): real builds, a
real serving runtime mirroring live traffic to a real candidate, the operator reading the
serving pods' own /metrics and judging.

- a new version built as int8 from the same model agrees with fp32: it is promoted, the
  serving pods roll to its engine, the candidate goes, and every live request got a 200;
- a new version that is another model (same tensor names) disagrees: it fails, the
  candidate goes, the serving pod is the same process it was, and the failure is kept;
- the manual gate through the real `kubeinfer promote` / `abort` commands (official
  `kubernetes` client, kubeconfig pointing at the emulator): a stale digest is refused
  and changes nothing; a matching one acts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from kubeinfer.operator.reconcile import names
from kubeinfer.operator.rollout.shadow import GATE_ANNOTATION
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.demo_models import build_tiny_mlp
from operator_harness import (
    FAST,
    IDS,
    NAMESPACE,
    World,
    condition,
    digest_of,
    eventually,
    manifest,
    start_operator,
)
from process_kubelet import ProcessKubelet, process_kubelet
from test_operator_command import kubeconfig

pytestmark = pytest.mark.slow

SHADOW_FAST = OperatorSettings(**{**FAST.model_dump(), "shadow_poll_seconds": 0.5})
RUNTIME = names.runtime_name("resnet")
CANDIDATE = names.candidate_name("resnet")


def shadow_manifest(model: Path, version: str, **engine: Any) -> dict[str, Any]:
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    return manifest(
        version=version,
        model={"source": {"uri": f"file://{model}", "sha256": sha}},
        engine={"maxBatchSize": 8, **engine},
        runtime={"replicas": 1, "batching": {"maxBatchSize": 8}},
        rollout={
            "strategy": "Shadow",
            "shadow": {
                "trafficPercent": 100,
                "minSamples": 40,
                "maxDurationSeconds": 300,
                # The flow is under test here, not speed: two processes share two cores.
                "thresholds": {
                    "maxAbsoluteOutputDifference": 0.5,
                    "minTop1Agreement": 0.8,
                    "maxP99LatencyRegressionPercent": 1000,
                },
            },
        },
    )


def candidate(world: World) -> dict[str, Any]:
    return ((world.infd() or {}).get("status") or {}).get("candidate") or {}


def served_digest(world: World) -> str | None:
    deployment = world.api.get("apps/v1", "deployments", NAMESPACE, RUNTIME)
    annotations = (deployment or {}).get("spec", {}).get("template", {}).get("metadata", {})
    return (annotations.get("annotations") or {}).get(names.ANNOTATION_ENGINE_DIGEST)


@contextlib.asynccontextmanager
async def live_traffic(kubelet: ProcessKubelet):
    """Clients sending one-row requests to whichever serving pod is ready (the Service, in
    a cluster), until the block ends; yields the status codes seen."""
    codes: Counter[int] = Counter()
    rows = np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)

    async def client(index: int) -> None:
        async with aiohttp.ClientSession() as session:
            for count in range(10**9):
                url = kubelet.serving_url(RUNTIME)
                if url is None:
                    await asyncio.sleep(0.05)
                    continue
                row = rows[(index + count) % len(rows)]
                body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                    "data": row.tolist()}]}  # fmt: skip
                try:
                    async with session.post(f"{url}/v2/models/resnet/infer", json=body) as answer:
                        await answer.read()
                        codes[answer.status] += 1
                except (aiohttp.ClientError, OSError):
                    await asyncio.sleep(0.05)  # the pod was rolled: the Service moves on
                await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(client(i)) for i in range(2)]
    try:
        yield codes
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def serve_version_1(world: World, kubelet: ProcessKubelet, model: Path) -> str:
    world.api.create("inferencedeployments", shadow_manifest(model, "1"))
    await eventually(
        lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True",
        within=60,
        what="version 1 built and Ready",
    )
    await eventually(lambda: kubelet.serving_url(RUNTIME), within=30, what="a serving pod")
    digest = served_digest(world)
    assert digest
    return digest


async def test_an_int8_candidate_that_agrees_is_promoted(world: World, tmp_path: Path) -> None:
    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    calibration = write_demo_samples(model, tmp_path / "calibration.npz")
    async with (
        start_operator(world, SHADOW_FAST),
        process_kubelet(world, tmp_path / "node") as kubelet,
    ):
        fp32 = await serve_version_1(world, kubelet, model)
        serving_pod = kubelet.pods_of(RUNTIME)[0].name
        update = shadow_manifest(
            model, "2", precision="int8", calibration={"uri": f"file://{calibration}"}
        )
        world.api.patch(*IDS, NAMESPACE, "resnet", {"spec": update["spec"]})
        await eventually(
            lambda: candidate(world).get("verdict") == "Pending" and kubelet.serving_url(CANDIDATE),
            within=60,
            what="the int8 candidate running",
        )
        assert served_digest(world) == fp32, "serving is untouched while the candidate is tested"
        assert kubelet.pods_of(RUNTIME)[0].name == serving_pod
        assert (world.infd()["status"]["phase"]) == "Shadowing"
        async with live_traffic(kubelet) as codes:
            await eventually(
                lambda: candidate(world).get("verdict") == "Promoted",
                within=90,
                what=f"the candidate promoted (last: {candidate(world)})",
            )
        record = candidate(world)
        assert record["version"] == "2" and record["samples"] >= 40
        assert record["top1Agreement"] >= 0.8
        assert 0 < record["maxAbsoluteDifference"] <= 0.5, "int8 differs from fp32, a little"
        assert record["servingP99Milliseconds"] > 0 and record["candidateP99Milliseconds"] > 0
        assert served_digest(world) == record["engineDigest"] != fp32
        await eventually(lambda: not kubelet.pods_of(CANDIDATE), what="the candidate removed")
        assert world.api.get("apps/v1", "deployments", NAMESPACE, CANDIDATE) is None
        assert set(codes) == {200}, codes
        await eventually(
            lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True",
            within=30,
            what="Ready on the promoted engine",
        )
        assert (condition(world.infd(), "ShadowPassed") or {}).get("status") == "True"


async def test_a_candidate_of_another_model_fails_and_serving_is_untouched(
    world: World, tmp_path: Path
) -> None:
    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    other = build_tiny_mlp(tmp_path / "other.onnx", seed=7)  # same tensor names and shapes
    async with (
        start_operator(world, SHADOW_FAST),
        process_kubelet(world, tmp_path / "node") as kubelet,
    ):
        digest = await serve_version_1(world, kubelet, model)
        serving_pod = kubelet.pods_of(RUNTIME)[0].name
        world.api.patch(*IDS, NAMESPACE, "resnet", {"spec": shadow_manifest(other, "2")["spec"]})
        await eventually(lambda: kubelet.serving_url(CANDIDATE), within=60, what="the candidate")
        async with live_traffic(kubelet) as codes:
            await eventually(
                lambda: candidate(world).get("verdict") == "Failed",
                within=60,
                what=f"the candidate failed (last: {candidate(world)})",
            )
        record = candidate(world)
        assert record["reason"] == "DifferenceTooLarge", record
        assert record["maxAbsoluteDifference"] > 0.5
        await eventually(lambda: not kubelet.pods_of(CANDIDATE), what="the candidate removed")
        assert served_digest(world) == digest
        assert [p.name for p in kubelet.pods_of(RUNTIME)] == [serving_pod], "not restarted"
        assert serving_pod not in kubelet.stopped
        assert set(codes) == {200}, codes
        infd = world.infd()
        assert infd["status"]["phase"] == "Degraded"
        assert condition(infd, "Degraded")["reason"] == "ShadowFailed"
        # Remembered: later passes neither rebuild nor retry it.
        jobs = len(world.jobs())
        await asyncio.sleep(3 * SHADOW_FAST.resync_interval_seconds)
        assert len(world.jobs()) == jobs and not kubelet.pods_of(CANDIDATE)
        assert candidate(world)["verdict"] == "Failed"


async def gate(kubeconfig_path: Path, *argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kubeinfer.operator.cli", *argv,
        "--kubeconfig", str(kubeconfig_path), "-n", NAMESPACE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    return process.returncode or 0, output.decode()


async def pinned_shadow(world: World, pin: str) -> None:
    """A pinned version serving, and a new pin under shadow test (no pods report
    metrics here, so the candidate stays Pending until the gate acts)."""
    body = manifest(engine={"pin": pin}, rollout={"strategy": "Shadow"})
    if world.infd() is None:
        world.api.create("inferencedeployments", body)
    else:
        world.api.patch(*IDS, NAMESPACE, "resnet", {"spec": body["spec"]})


async def test_the_manual_gate_acts_only_on_the_digest_it_names(
    world: World, tmp_path: Path
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", world.url)
    old, new, newer = digest_of("old"), digest_of("new"), digest_of("newer")
    async with start_operator(world, SHADOW_FAST):
        await pinned_shadow(world, old)
        await eventually(lambda: world.one("apps/v1", "deployments"), what="serving")
        world.make_deployment_ready()
        await eventually(lambda: served_digest(world) == old)
        # No candidate yet: nothing to promote.
        code, output = await gate(config, "promote", "resnet")
        assert code == 1 and "no candidate under shadow test" in output, output

        await pinned_shadow(world, new)
        await eventually(lambda: candidate(world).get("engineDigest") == new, what="candidate")
        code, output = await gate(config, "abort", "resnet", "--digest", newer)
        assert code == 1 and f"now engine {new}" in output, output
        assert GATE_ANNOTATION not in (world.infd()["metadata"].get("annotations") or {})

        code, output = await gate(config, "promote", "resnet", "--digest", new)
        assert code == 0, output
        await eventually(lambda: served_digest(world) == new, what="serving rolled to the pin")
        await eventually(lambda: candidate(world)["verdict"] == "Passed", what="Passed")
        assert candidate(world)["reason"] == "ManualPromotion"

        # A stale annotation (it names `new`) does nothing to the next candidate...
        await pinned_shadow(world, newer)
        await eventually(lambda: candidate(world).get("engineDigest") == newer)
        await asyncio.sleep(3 * SHADOW_FAST.shadow_poll_seconds)
        assert candidate(world)["verdict"] == "Pending" and served_digest(world) == new
        # ... and abort of the current one removes it, leaving serving as it is.
        code, output = await gate(config, "abort", "resnet")
        assert code == 0, output
        await eventually(lambda: candidate(world).get("verdict") == "Aborted")
        await eventually(
            lambda: world.api.get("apps/v1", "deployments", NAMESPACE, CANDIDATE) is None
        )
        assert served_digest(world) == new
    assert not world.api.spec_writes, "the commands and the operator never write the spec"
