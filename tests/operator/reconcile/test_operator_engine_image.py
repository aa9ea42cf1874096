"""Engines that match their image, on the real control plane: the operator reports a
runtime pod that cannot load its engine with the runtime's own words.

The engine cache claim holds a real engine entry as another ONNX Runtime (1.16.3) would
have written it: an engine built here, its manifest's key naming that version (and so
its own digest). Pinned, it reaches a real runtime pod whose `kubeinfer serve` refuses it
and exits 3, its words in /dev/termination-log; the kubelet reports the exit code and
that termination message in the pod's container status, and restarts the container
(CrashLoopBackOff). From that pod the operator turns the object Degraded and not Ready
with reason EngineIncompatible and a message that names the pod, the engine and what the
runtime said. Pinning an engine built by this image (what the message advises) brings the
object to Ready, no longer Degraded.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator.state import names
from kubeinfer.runtime.building.engine_build import BuildResult, build_engine
from kubeinfer.runtime.engine_cache import EXIT_ENGINE_INCOMPATIBLE
from kubeinfer.runtime.engine_manifest import EngineManifest, sha256_file
from kubeinfer.runtime.engines.loader import installed_backend_version
from operator_harness import Model, World, condition, eventually, manifest, start_operator

pytestmark = pytest.mark.slow

OTHER_ONNXRUNTIME = "1.16.3"


def publish_as_built_by(built: BuildResult, cache: Path, backend_version: str) -> str:
    """Publishes `built`'s engine in `cache` as ONNX Runtime `backend_version` would have
    (the key names that version, so the entry has its own digest, and the engine file's
    real sha256 is in the manifest, and the entry's other files are copied, so the entry
    resolves); returns its digest."""
    key = built.manifest.key.model_copy(update={"backend_version": backend_version})
    entry = cache / "engines" / key.digest().removeprefix("sha256:")
    entry.mkdir(parents=True)
    shutil.copyfile(built.engine_path, entry / built.manifest.engine_file)
    for name in built.manifest.entry_files:  # the known answers and the like, as built
        shutil.copyfile(built.engine_path.parent / name, entry / name)
    relabelled = built.manifest.model_copy(
        update={
            "key": key,
            "digest": key.digest(),
            "engine_sha256": sha256_file(entry / built.manifest.engine_file),
        }
    )
    EngineManifest.model_validate_json(relabelled.to_json())  # one a build could write
    (entry / "manifest.json").write_text(relabelled.to_json())
    return key.digest()


def degraded(world: World) -> dict[str, Any] | None:
    found = condition(world.infd(), "Degraded")
    return found if found and found["status"] == "True" else None


def runtime_container(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next(s for s in statuses if s["name"] == "runtime")


def last_termination(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The runtime container's latest termination: the current one, else the last."""
    container = runtime_container(pod)
    return (container.get("state") or {}).get("terminated") or (
        container.get("lastState") or {}
    ).get("terminated")


async def test_a_runtime_refusing_its_engine_is_reported_from_its_pod(
    world: World, tiny: Model
) -> None:
    cache = world.cluster.claim_directory(world.namespace, names.cache_claim_name("resnet"))
    compatible = await asyncio.to_thread(
        build_engine, str(tiny.path), "onnxruntime", "fp32", cache, max_batch_size=8
    )
    incompatible = publish_as_built_by(compatible, cache, OTHER_ONNXRUNTIME)
    async with start_operator(world):
        world.create(manifest(tiny, engine={"pin": incompatible}))
        found = await eventually(lambda: degraded(world), 120, "Degraded=True")
        (pod,) = [p for p in world.pods() if not p["metadata"].get("deletionTimestamp")]
        terminated = last_termination(pod)
        infd = world.infd()

        # What the kubelet reported of the real container: exit 3 and the runtime's own words.
        assert terminated is not None and terminated["exitCode"] == EXIT_ENGINE_INCOMPATIBLE
        said = (
            f"engine {incompatible} was built by onnxruntime {OTHER_ONNXRUNTIME}, but this "
            f"image has onnxruntime {installed_backend_version('onnxruntime')}"
        )
        assert said in terminated["message"], terminated
        assert found["reason"] == "EngineIncompatible"
        name = pod["metadata"]["name"]
        assert f"The runtime pod {name} (engine {incompatible}) cannot start" in found["message"]
        assert " ".join(terminated["message"].split()) in found["message"]
        assert "a pinned engine must be one built by this image" in found["message"]
        ready = condition(infd, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "EngineIncompatible")

        # The fix the message names: pin an engine this image built.
        world.patch_spec({"engine": {"pin": compatible.digest}})
        await eventually(
            lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True",
            120,
            "Ready=True on the engine this image built",
        )
    infd = world.infd()
    assert condition(infd, "Degraded")["status"] == "False"
    assert infd["status"]["serving"]["engineDigest"] == compatible.digest
