"""InferenceDeployments the real operator brings into each situation Argo CD and Flux must
tell apart, on the real control plane (`operator_harness`), and the objects as the API
server then holds them: what `health.lua` and kstatus read in a cluster.

`capture` runs them side by side in one namespace with one operator:

- progressing_noStatus: the object as created, before the operator has seen it;
- progressing_building: its build pod waits for a model claim that does not exist yet;
- healthy_ready: built, rolled out, Ready;
- progressing_newGeneration: the Ready object the moment its spec changed (the PATCH's
  own answer, so the operator cannot have acted yet);
- progressing_shadowing: a pinned second engine under shadow test (no traffic, so it
  stays Pending);
- healthy_promoted: the same, after Argo CD's promote action (run by the Lua, sent as the
  merge patch Argo CD sends) and the operator's promotion;
- degraded_shadowAborted: a third engine, aborted by the abort action;
- degraded_buildFailed: a model file that is no ONNX model;
- degraded_engineIncompatible: a pinned engine another ONNX Runtime version built, which
  the runtime pod refuses (exit 3, CrashLoopBackOff);
- degraded_qualityDrift (with `quality=True`, the capture script only: a minute or two
  of traffic): int8 watched against its fp32 reference, inputs scaled far outside the
  calibration data.

`as_testdata` turns a captured object into a testdata file's content.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import argocd_lua
from cluster_harness import file_url
from decide_scenarios import tuned
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.operator.state import names
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from operator_harness import (
    FAST,
    IDS,
    Model,
    World,
    condition,
    manifest,
    start_operator,
)
from waiting import eventually

REPO = Path(__file__).resolve().parents[2]
CUSTOMIZATION = REPO / "deploy/argocd/resource_customizations/kubeinfer.io/InferenceDeployment"
SETTINGS = tuned(
    FAST,
    requeue={"shadow_poll_seconds": 0.5},
    # A failed build stays failed while the statuses are read.
    build={"backoff_seconds": 60, "backoff_max_seconds": 60, "backoff_limit": 0},
)
OTHER_ONNXRUNTIME = "1.16.3"
KubeObject = dict[str, Any]


def infd(world: World, name: str) -> KubeObject:
    return world.kube.get(*IDS, name) or {}


def status_of(world: World, name: str, type_: str) -> str | None:
    return (condition(infd(world, name), type_) or {}).get("status")


def candidate(world: World, name: str) -> KubeObject:
    return (infd(world, name).get("status") or {}).get("candidate") or {}


async def until(world: World, name: str, check: Any, what: str, within: float = 120) -> KubeObject:
    """The object once `check(obj)` holds; a timeout names what was awaited and the
    object's last status."""
    last: KubeObject = {}

    def holds() -> bool:
        nonlocal last
        last = infd(world, name)
        return bool(last) and bool(check(last))

    try:
        await eventually(holds, within, f"{name}: {what}")
    except AssertionError as error:
        raise AssertionError(f"{error}; its status: {last.get('status')}") from None
    return last


def phase(obj: KubeObject) -> str | None:
    return (obj.get("status") or {}).get("phase")


def ready(obj: KubeObject) -> bool:
    return (condition(obj, "Ready") or {}).get("status") == "True"


def apply_action(world: World, action: str, live: KubeObject) -> KubeObject:
    """Runs Argo CD's `action` on `live` and sends what Argo CD sends: the merge patch
    from the live object to the action's result (its status part to the status
    subresource). Returns that patch."""
    patch = argocd_lua.merge_patch(live, argocd_lua.act(CUSTOMIZATION, action, live))
    name = live["metadata"]["name"]
    if "status" in patch:
        world.kube.patch(*IDS, name, {"status": patch["status"]}, subresource="status")
    rest = {key: value for key, value in patch.items() if key != "status"}
    if rest:
        world.kube.patch(*IDS, name, rest)
    return patch


def pinned(model: Model, name: str, digest: str, **spec: Any) -> KubeObject:
    return manifest(model, name=name, engine={"pin": digest}, **spec)


def publish_as_built_by(world: World, owner: str, model: Model, backend_version: str) -> str:
    """An engine of `model` in `owner`'s cache claim, published as ONNX Runtime
    `backend_version` would have published it (see test_operator_engine_image)."""
    from test_operator_engine_image import publish_as_built_by as publish

    cache = world.cluster.claim_directory(world.namespace, names.cache_claim_name(owner))
    built = build_engine(str(model.path), "onnxruntime", "fp32", cache, max_batch_size=8)
    return publish(built, cache, backend_version)


def engines_in_claim(world: World, owner: str, models: list[Model]) -> list[str]:
    cache = world.cluster.claim_directory(world.namespace, names.cache_claim_name(owner))
    return [
        build_engine(str(m.path), "onnxruntime", "fp32", cache, max_batch_size=8).digest
        for m in models
    ]


async def shadow_story(
    world: World,
    tiny: Model,
    engines: list[str],
    captured: dict[str, KubeObject],
    patches: dict[str, KubeObject],
) -> None:
    old, new, newer = engines
    shadow = {"rollout": {"strategy": "Shadow"}}
    world.create(pinned(tiny, "shadow", old, **shadow))
    await until(world, "shadow", ready, "Ready on its first engine")
    second = {"model": {"version": "2"}, "engine": {"pin": new}}
    world.kube.patch(*IDS, "shadow", {"spec": second})
    captured["progressing_shadowing"] = await until(
        world,
        "shadow",
        lambda o: (
            phase(o) == "Shadowing"
            and (o["status"].get("candidate") or {}).get("engineDigest") == new
        ),
        "the second engine under shadow test",
    )
    patches["promote"] = apply_action(world, "promote", captured["progressing_shadowing"])
    captured["healthy_promoted"] = await until(
        world,
        "shadow",
        lambda o: ready(o) and (o["status"].get("candidate") or {}).get("verdict") == "Promoted",
        "promoted by the promote action and Ready",
    )
    third = {"model": {"version": "3"}, "engine": {"pin": newer}}
    world.kube.patch(*IDS, "shadow", {"spec": third})
    shadowing = await until(
        world,
        "shadow",
        lambda o: (
            phase(o) == "Shadowing"
            and (o["status"].get("candidate") or {}).get("engineDigest") == newer
        ),
        "the third engine under shadow test",
    )
    patches["abort"] = apply_action(world, "abort", shadowing)
    captured["degraded_shadowAborted"] = await until(
        world,
        "shadow",
        lambda o: (condition(o, "Degraded") or {}).get("reason") == "ShadowAborted",
        "Degraded ShadowAborted after the abort action",
    )


async def capture(
    world: World, tiny: Model, model_directory: Path, quality: bool = False
) -> tuple[dict[str, KubeObject], dict[str, KubeObject]]:
    """Every situation of the module's list by testdata name, and the merge patches the
    promote and abort actions sent."""
    captured: dict[str, KubeObject] = {}
    patches: dict[str, KubeObject] = {}
    stuck = manifest(tiny, name="building")
    stuck["spec"]["model"]["source"]["uri"] = "pvc://model-store/tiny.onnx"
    captured["progressing_noStatus"] = world.create(stuck)

    others = [
        Model(build_tiny_mlp(model_directory / f"{world.namespace}-{seed}.onnx", seed=seed))
        for seed in (2, 3)
    ]
    engines = await asyncio.to_thread(engines_in_claim, world, "shadow", [tiny, *others])
    incompatible = await asyncio.to_thread(
        publish_as_built_by, world, "incompatible", tiny, OTHER_ONNXRUNTIME
    )
    broken = Model(model_directory / f"{world.namespace}-broken.onnx")
    broken.path.write_bytes(b"not an ONNX model")

    async with start_operator(world, SETTINGS):
        world.create(manifest(tiny, name="ready"))
        world.create(manifest(broken, name="broken"))
        world.create(pinned(tiny, "incompatible", incompatible))

        async def building() -> None:
            captured["progressing_building"] = await until(
                world, "building", lambda o: phase(o) == "BuildingEngine", "building"
            )

        async def healthy() -> None:
            captured["healthy_ready"] = await until(world, "ready", ready, "Ready")

        async def failed(key: str, name: str, reason: str) -> None:
            captured[key] = await until(
                world,
                name,
                lambda o: (condition(o, "Degraded") or {}).get("reason") == reason,
                f"Degraded {reason}",
            )

        steps = [
            building(),
            healthy(),
            failed("degraded_buildFailed", "broken", "EngineBuildFailed"),
            failed("degraded_engineIncompatible", "incompatible", "EngineIncompatible"),
            shadow_story(world, tiny, engines, captured, patches),
        ]
        if quality:
            steps.append(quality_drift(world, tiny, model_directory, captured))
        await asyncio.gather(*steps)
        # The PATCH's answer is the object as stored at that instant: the new generation
        # beside the status of the previous one.
        captured["progressing_newGeneration"] = world.kube.patch(
            *IDS, "ready", {"spec": {"runtime": {"replicas": 2}}}
        )
    return captured, patches


async def quality_drift(
    world: World, tiny: Model, model_directory: Path, captured: dict[str, KubeObject]
) -> None:
    """int8 watched against fp32 (test_operator_quality_watch's scenario), inputs scaled
    far outside the calibration data until the watch finds drift."""
    from test_operator_quality_watch import OWNER, REFERENCE, SHIFT, digest_of, traffic
    from test_operator_shadow_rollout import ready_urls

    calibration = write_demo_samples(
        tiny.path, model_directory / f"{world.namespace}-calibration.npz", count=64
    )
    world.create(
        manifest(
            tiny,
            name=OWNER,
            engine={
                "precision": "int8",
                "calibration": {"uri": file_url(calibration), "sha256": digest_of(calibration)},
            },
            qualityWatch={
                "enabled": True,
                "samplePercent": 100,
                "windowSeconds": 30,
                "minSamples": 40,
                "minTop1Agreement": 0.85,
                "minClassAgreement": 0.0,
            },
        )
    )
    await until(world, OWNER, ready, "the int8 engine Ready", within=180)
    await eventually(lambda: ready_urls(world, REFERENCE), 120, "the fp32 reference running")
    async with traffic(world, [SHIFT]):
        captured["degraded_qualityDrift"] = await until(
            world,
            OWNER,
            lambda o: (condition(o, "Degraded") or {}).get("reason") == "QualityDrift",
            "Degraded QualityDrift",
            within=180,
        )


def as_testdata(obj: KubeObject) -> KubeObject:
    """What a testdata file keeps of a captured object: its kind, name, generation, the
    gate annotation if any, its spec and the whole status the operator wrote; the
    namespace is `ml` whatever the test's namespace was."""
    metadata = obj["metadata"]
    kept: KubeObject = {
        "name": metadata["name"],
        "namespace": "ml",
        "generation": metadata["generation"],
    }
    gate = (metadata.get("annotations") or {}).get("kubeinfer.io/shadow-gate")
    if gate:
        kept["annotations"] = {"kubeinfer.io/shadow-gate": gate}
    data = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": kept}
    data["spec"] = copy.deepcopy(obj["spec"])
    if obj.get("status"):
        data["status"] = copy.deepcopy(obj["status"])
    return data


def projection(obj: KubeObject) -> KubeObject:
    """What a health check reads of a status, without the figures and sentences that
    differ from run to run: the phase, whether each generation is observed, and each
    condition's status and reason."""
    status = obj.get("status") or {}
    generation = obj["metadata"]["generation"]
    return {
        "phase": status.get("phase"),
        "observed": status.get("observedGeneration") == generation,
        "conditions": {
            c["type"]: (c["status"], c["reason"], c.get("observedGeneration") == generation)
            for c in status.get("conditions") or []
        },
        "candidate": (status.get("candidate") or {}).get("verdict"),
        "qualityWatch": (status.get("qualityWatch") or {}).get("state"),
    }
