"""The shadow rollout end to end on the real cluster: the real operator (in-process,
logged in as its ServiceAccount), real build Jobs (`kubeinfer build`), real serving pods
(`kubeinfer serve`, containers of the runtime image run by the kubelet) mirroring live
traffic to a real candidate pod (CoreDNS resolves the candidate Service's name in the
serving pods' mirror-target file, and kube-proxy sends the mirrored requests to a ready
candidate pod), and the operator reading the serving pods' own /metrics and judging. Live
traffic goes to the ready pods the serving Service selects, as kube-proxy would send it.

- a new version built as int8 from the same model agrees with fp32: it is promoted, the
  serving pods roll to its engine, the candidate goes, and every live request got a 200;
- a new version that is another model (same tensor names) disagrees: it fails, the
  candidate goes, the serving pod is the same pod running the same process, and the
  failure is kept (no rebuild, no new candidate on later passes);
- the manual gate through the real `kubeinfer promote` / `abort` commands (official
  `kubernetes` client, a kubeconfig with the token of a ServiceAccount that may only get
  and patch InferenceDeployments), on pinned engines in the cache claim with no traffic
  (so a candidate stays Pending until the gate acts): a stale digest is refused and
  changes nothing, a matching one acts, a stale annotation does nothing to the next
  candidate, and neither the commands nor the operator ever write the spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from cluster_harness import file_url
from decide_scenarios import tuned
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.operator.rollout.shadow import GATE_ANNOTATION
from kubeinfer.operator.state import names
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from operator_harness import (
    FAST,
    Model,
    World,
    condition,
    eventually,
    manifest,
    start_operator,
)

pytestmark = pytest.mark.slow

SHADOW_FAST = tuned(
    FAST,
    requeue={"shadow_poll_seconds": 0.5},
    # A pod being deleted keeps serving this long before it drains: the test's clients,
    # like kube-proxy, stop sending to it once they see it terminating, so a rolled pod
    # never answers a live request with its draining 503.
    pods={"pre_stop_sleep_seconds": 3},
)
RUNTIME = names.runtime_name("resnet")
CANDIDATE = names.candidate_name("resnet")
SERVING_SERVICE = names.service_name("resnet")
CANDIDATE_SERVICE = names.candidate_name("resnet")
SERVING_PODS = names.selector_string(names.serving_selector("resnet"))
GATE_ACCOUNT = "release-engineer"
KUBEINFER = Path(sys.executable).with_name("kubeinfer")
"""The `kubeinfer` console script of this environment, as a user runs it."""
THRESHOLDS = {
    "maxAbsoluteOutputDifference": 0.5,
    "minTop1Agreement": 0.8,
    # The flow is under test here, not speed: the pods share two cores with everything.
    "maxP99LatencyRegressionPercent": 1000,
}


def digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shadow_manifest(model: Model, version: str, **engine: Any) -> dict[str, Any]:
    """`model` as `version`, rolled out under a shadow test that judges after 40 mirrored
    requests."""
    return manifest(
        model,
        version=version,
        engine=engine,
        rollout={
            "strategy": "Shadow",
            "shadow": {
                "trafficPercent": 100,
                "minSamples": 40,
                "maxDurationSeconds": 300,
                "thresholds": THRESHOLDS,
            },
        },
    )


def candidate(world: World) -> dict[str, Any]:
    return ((world.infd() or {}).get("status") or {}).get("candidate") or {}


async def verdict(world: World, wanted: str, within: float) -> dict[str, Any]:
    """Waits for the candidate's verdict to be `wanted`; a timeout says the last record."""
    last: dict[str, Any] = {}

    def reached() -> bool:
        nonlocal last
        last = candidate(world)
        return last.get("verdict") == wanted

    try:
        await eventually(reached, within, f"the verdict {wanted}")
    except AssertionError as error:
        raise AssertionError(f"{error}; the candidate's last record: {last}") from None
    return last


def served_digest(world: World) -> str | None:
    """The engine the serving Deployment's pod template names."""
    deployment = world.kube.get("apps/v1", "deployments", RUNTIME)
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    return ((template.get("metadata") or {}).get("annotations") or {}).get(
        names.ANNOTATION_ENGINE_DIGEST
    )


def live_pods(world: World, selector: dict[str, str]) -> list[dict[str, Any]]:
    """The pods `selector` matches that are not being deleted."""
    return [
        pod
        for pod in world.pods(names.selector_string(selector))
        if not pod["metadata"].get("deletionTimestamp")
    ]


def serving_pods(world: World) -> list[dict[str, Any]]:
    return live_pods(world, names.serving_selector("resnet"))


def runs_engine(pod: dict[str, Any], digest: str) -> bool:
    """Whether the pod runs `digest` (its template's annotation names its engine)."""
    annotations = pod["metadata"].get("annotations") or {}
    return annotations.get(names.ANNOTATION_ENGINE_DIGEST) == digest


def candidate_pods(world: World) -> list[dict[str, Any]]:
    return live_pods(world, names.candidate_selector("resnet"))


def ready_urls(world: World, service_name: str) -> list[str]:
    """`http://<podIP>:<port>` of each ready pod the Service selects and that is not
    terminating: where kube-proxy sends the Service's connections."""
    service = world.kube.get("v1", "services", service_name)
    if service is None:
        return []
    target = next(p["targetPort"] for p in service["spec"]["ports"] if p["name"] == "http")
    urls = []
    for pod in live_pods(world, service["spec"]["selector"]):
        status = pod.get("status") or {}
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in status.get("conditions") or [])  # fmt: skip
        if not ready or not status.get("podIP"):
            continue
        port = next(
            p["containerPort"]
            for c in pod["spec"]["containers"]
            for p in c.get("ports") or []
            if p.get("name") == target or p["containerPort"] == target
        )
        urls.append(f"http://{status['podIP']}:{port}")
    return sorted(urls)


def runtime_process(pod: dict[str, Any]) -> tuple[str, str, int]:
    """What identifies the process a pod runs: the pod's uid, its runtime container's id
    (containerd's, new each time the kubelet starts the container) and the container's
    restarts."""
    (container,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "runtime"]
    return pod["metadata"]["uid"], container["containerID"], container["restartCount"]


@contextlib.asynccontextmanager
async def traffic_to(
    world: World, service: str, body_for: Callable[[int, int], dict[str, Any]]
) -> AsyncIterator[Counter[int | str]]:
    """Two clients sending `body_for(client, count)` (a JSON inference request) to the
    ready pods of `service` until the block ends; yields the status codes they got (an
    error's name where there was no answer). The endpoints are re-read every 0.2 s, as
    kube-proxy follows the Service's: only pods not terminating, which keep serving for
    their preStop, so a request lost is a failed request too."""
    codes: Counter[int | str] = Counter()
    endpoints: list[str] = []

    async def follow_endpoints() -> None:
        while True:
            # A failed read keeps the last endpoints, as kube-proxy keeps its rules.
            with contextlib.suppress(Exception):
                endpoints[:] = await asyncio.to_thread(ready_urls, world, service)
            # not a wait: the endpoints are re-read every 0.2 s, as kube-proxy would
            await asyncio.sleep(0.2)

    async def client(index: int) -> None:
        async with aiohttp.ClientSession() as session:
            for count in itertools.count():
                if not endpoints:
                    await asyncio.sleep(0.05)  # not a wait: paces a client with nowhere to send yet
                    continue
                url = endpoints[(index + count) % len(endpoints)]
                try:
                    body = body_for(index, count)
                    async with session.post(f"{url}/v2/models/resnet/infer", json=body) as answer:
                        await answer.read()
                        codes[answer.status] += 1
                except (aiohttp.ClientError, OSError) as error:
                    codes[type(error).__name__] += 1
                    await asyncio.sleep(0.05)  # not a wait: a client's pause after a failed request
                await asyncio.sleep(0.01)  # not a wait: paces the load

    tasks = [asyncio.create_task(follow_endpoints())]
    tasks += [asyncio.create_task(client(i)) for i in range(2)]
    try:
        yield codes
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def live_traffic(world: World) -> contextlib.AbstractAsyncContextManager[Counter[int | str]]:
    """One-row requests to the serving Service (`traffic_to`)."""
    rows = np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)

    def one_row(index: int, count: int) -> dict[str, Any]:
        row = rows[(index + count) % len(rows)]
        return {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                            "data": row.tolist()}]}  # fmt: skip

    return traffic_to(world, SERVING_SERVICE, one_row)


async def serve_version_1(world: World, model: Model) -> str:
    """Version 1 built, served directly (nothing to compare it with) and Ready; its
    engine digest."""
    world.create(shadow_manifest(model, "1"))
    await eventually(
        lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True",
        within=120,
        what="version 1 built and Ready",
    )
    await eventually(lambda: ready_urls(world, SERVING_SERVICE), 60, "a ready serving pod")
    digest = served_digest(world)
    assert digest
    return digest


async def test_an_int8_candidate_that_agrees_is_promoted(
    world: World, tiny: Model, model_directory: Path
) -> None:
    calibration = write_demo_samples(
        tiny.path, model_directory / f"{world.namespace}-calibration.npz"
    )
    async with start_operator(world, SHADOW_FAST):
        fp32 = await serve_version_1(world, tiny)
        (serving_pod,) = serving_pods(world)
        update = shadow_manifest(
            tiny, "2", precision="int8",
            calibration={"uri": file_url(calibration), "sha256": digest_of(calibration)},
        )  # fmt: skip
        world.patch_spec(update["spec"])
        await eventually(
            lambda: (
                candidate(world).get("verdict") == "Pending"
                and ready_urls(world, CANDIDATE_SERVICE)
            ),
            within=120,
            what="the int8 candidate built and running",
        )
        assert served_digest(world) == fp32, "serving is untouched while the candidate is tested"
        assert [p["metadata"]["uid"] for p in serving_pods(world)] == [
            serving_pod["metadata"]["uid"]
        ]
        assert world.infd()["status"]["phase"] == "Shadowing"
        async with live_traffic(world) as codes:
            await verdict(world, "Promoted", within=180)
            # The traffic goes on until the last fp32 pod has finished its drain.
            await eventually(
                lambda: not any(runs_engine(p, fp32) for p in world.pods(SERVING_PODS)),
                within=60,
                what="the fp32 serving pod gone",
            )
        record = candidate(world)
        assert record["version"] == "2" and record["samples"] >= 40
        assert record["top1Agreement"] >= 0.8
        assert 0 < record["maxAbsoluteDifference"] <= 0.5, "int8 differs from fp32, a little"
        assert record["servingP99Milliseconds"] > 0 and record["candidateP99Milliseconds"] > 0
        assert served_digest(world) == record["engineDigest"] != fp32
        assert all(runs_engine(p, record["engineDigest"]) for p in serving_pods(world))
        await eventually(lambda: not candidate_pods(world), 60, "the candidate's pods removed")
        assert world.kube.get("apps/v1", "deployments", CANDIDATE) is None
        assert world.kube.get("v1", "services", CANDIDATE_SERVICE) is None
        assert set(codes) == {200}, codes
        print(f"\nLive requests during the shadow test and the promotion: {codes}")
        await eventually(
            lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True",
            within=60,
            what="Ready on the promoted engine",
        )
        assert (condition(world.infd(), "ShadowPassed") or {}).get("status") == "True"


async def test_a_candidate_of_another_model_fails_and_serving_is_untouched(
    world: World, tiny: Model, model_directory: Path
) -> None:
    # Another model behind the same tensor names and shapes: every answer differs.
    other = Model(build_tiny_mlp(model_directory / f"{world.namespace}-other.onnx", seed=7))
    async with start_operator(world, SHADOW_FAST):
        digest = await serve_version_1(world, tiny)
        (serving_pod,) = serving_pods(world)
        process = runtime_process(serving_pod)
        world.patch_spec(shadow_manifest(other, "2")["spec"])
        await eventually(
            lambda: ready_urls(world, CANDIDATE_SERVICE), 120, "the candidate built and running"
        )
        async with live_traffic(world) as codes:
            await verdict(world, "Failed", within=120)
        record = candidate(world)
        assert record["reason"] == "DifferenceTooLarge", record
        assert record["maxAbsoluteDifference"] > 0.5
        await eventually(lambda: not candidate_pods(world), 60, "the candidate's pods removed")
        assert served_digest(world) == digest
        assert [runtime_process(p) for p in serving_pods(world)] == [process], (
            "the serving pod is the same pod running the same process, never restarted"
        )
        assert set(codes) == {200}, codes
        infd = world.infd()
        assert infd["status"]["phase"] == "Degraded"
        assert condition(infd, "Degraded")["reason"] == "ShadowFailed"
        # Remembered: later passes neither rebuild nor retry it.
        jobs, before = len(world.jobs()), world.passes_done()
        await eventually(lambda: world.passes_done() >= before + 3, 60, "three more passes")
        assert len(world.jobs()) == jobs and not candidate_pods(world)
        assert world.kube.get("apps/v1", "deployments", CANDIDATE) is None
        assert candidate(world)["verdict"] == "Failed"
        assert [runtime_process(p) for p in serving_pods(world)] == [process]


# -- the manual gate ------------------------------------------------------------------------


def grant_gate_account(world: World, tmp_path: Path) -> Path:
    """A ServiceAccount that may get and patch InferenceDeployments, what the gate commands
    need, and a kubeconfig with its token."""
    kube = world.kube
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": GATE_ACCOUNT}})  # fmt: skip
    kube.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": GATE_ACCOUNT},
        "rules": [{"apiGroups": ["kubeinfer.io"], "resources": ["inferencedeployments"],
                   "verbs": ["get", "patch"]}],
    })  # fmt: skip
    kube.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": GATE_ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": GATE_ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": GATE_ACCOUNT,
                      "namespace": world.namespace}],
    })  # fmt: skip
    token = world.cluster.service_account_token(world.namespace, GATE_ACCOUNT)
    return world.cluster.kubeconfig_for(tmp_path / "kubeconfig", token, world.namespace)


async def gate(kubeconfig: Path, *argv: str) -> tuple[int, str]:
    """Runs `kubeinfer promote|abort ...` with that kubeconfig; its exit code and output."""
    process = await asyncio.create_subprocess_exec(
        str(KUBEINFER), *argv, "--kubeconfig", str(kubeconfig),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    return process.returncode or 0, output.decode()


def pinned(model: Model, pin: str) -> dict[str, Any]:
    """`model`'s engine `pin` (in the cache claim), rolled out under the default shadow
    settings: 1000 samples before a verdict, which no traffic here ever provides."""
    return manifest(model, engine={"pin": pin}, rollout={"strategy": "Shadow"})


def pin(world: World, model: Model, digest: str) -> None:
    if world.infd() is None:
        world.create(pinned(model, digest))
    else:
        world.patch_spec(pinned(model, digest)["spec"])


def spec_writes(world: World, users: set[str]) -> list[str]:
    """Writes by `users` to an InferenceDeployment that touched its spec (the audit log
    records the body of every write to the object itself)."""
    found = []
    for call in world.kube.calls():
        if call.user not in users or call.resource != "inferencedeployments":
            continue
        if call.verb in ("patch", "update") and isinstance(call.body, dict | list):
            body = call.body
            touched = (
                any(str(op.get("path", "")).startswith("/spec") for op in body)
                if isinstance(body, list)
                else "spec" in body
            )
            if touched:
                found.append(f"{call.user} {call.verb} {call.code}")
    return found


async def test_the_manual_gate_acts_only_on_the_digest_it_names(
    world: World, tiny: Model, model_directory: Path, tmp_path: Path
) -> None:
    # Three engines in the cache claim, each of another retraining of the model.
    cache = world.cluster.claim_directory(world.namespace, names.cache_claim_name("resnet"))
    models = [tiny] + [
        Model(build_tiny_mlp(model_directory / f"{world.namespace}-{seed}.onnx", seed=seed))
        for seed in (2, 3)
    ]
    old, new, newer = [
        (await asyncio.to_thread(
            build_engine, str(m.path), "onnxruntime", "fp32", cache, max_batch_size=8
        )).digest
        for m in models
    ]  # fmt: skip
    config = grant_gate_account(world, tmp_path)
    gate_user = f"system:serviceaccount:{world.namespace}:{GATE_ACCOUNT}"
    async with start_operator(world, SHADOW_FAST):
        pin(world, tiny, old)
        await eventually(
            lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True",
            120,
            "the first engine serving (nothing to compare it with)",
        )
        assert served_digest(world) == old
        # No candidate yet: nothing to promote.
        code, output = await gate(config, "promote", "resnet")
        assert code == 1 and "no candidate under shadow test" in output, output

        pin(world, tiny, new)
        await eventually(
            lambda: (
                candidate(world).get("engineDigest") == new and ready_urls(world, CANDIDATE_SERVICE)
            ),
            120,
            "the candidate running",
        )
        code, output = await gate(config, "abort", "resnet", "--digest", newer)
        assert code == 1 and f"now engine {new}" in output, output
        assert GATE_ANNOTATION not in (world.infd()["metadata"].get("annotations") or {})
        assert candidate(world)["verdict"] == "Pending"

        code, output = await gate(config, "promote", "resnet", "--digest", new)
        assert code == 0, output
        await eventually(lambda: served_digest(world) == new, 60, "serving rolled to the pin")
        await verdict(world, "Promoted", within=120)  # once the roll is complete
        # Promoted on no samples at all: only the gate could have passed it.
        record = candidate(world)
        assert record.get("samples", 0) == 0, record
        assert "Promoted by `kubeinfer promote`." in record["message"], record
        await eventually(lambda: not candidate_pods(world), 60, "the candidate's pods removed")
        (serving,) = serving_pods(world)
        assert runs_engine(serving, new)

        # A stale annotation (it names `new`) does nothing to the next candidate...
        pin(world, tiny, newer)
        await eventually(
            lambda: (
                candidate(world).get("engineDigest") == newer
                and ready_urls(world, CANDIDATE_SERVICE)
            ),
            120,
            "the next candidate running",
        )
        annotations = world.infd()["metadata"].get("annotations") or {}
        assert annotations.get(GATE_ANNOTATION) == f"promote {new}"
        before = world.passes_done()
        await eventually(lambda: world.passes_done() >= before + 3, 60, "three more passes")
        assert candidate(world)["verdict"] == "Pending" and served_digest(world) == new
        # ... and abort of the current one removes it, leaving serving as it is.
        code, output = await gate(config, "abort", "resnet")
        assert code == 0, output
        await verdict(world, "Aborted", within=60)
        await eventually(
            lambda: (
                world.kube.get("apps/v1", "deployments", CANDIDATE) is None
                and not candidate_pods(world)
            ),
            60,
            "the candidate removed",
        )
        assert served_digest(world) == new
        assert [runtime_process(p) for p in serving_pods(world)] == [runtime_process(serving)]
    patches = [c.code for c in world.kube.calls() if c.user == gate_user and c.verb == "patch"]
    assert patches == [200, 200], "one annotation per command that acted, none otherwise"
    assert spec_writes(world, {gate_user, world.operator_user}) == [], (
        "the commands and the operator never write the spec"
    )
