"""The real kopf operator against the emulated API server, for engines that match their
image: a runtime pod whose container the kubelet reports in CrashLoopBackOff after
`kubeinfer serve` exited 3 (an engine built by another backend version) turns the object
Degraded with reason EngineIncompatible and the runtime's own message, read by the
gather step from the pods of a Deployment that is not settled; once the pod is ready and
the Deployment settled, the object is Ready and no longer Degraded."""

from __future__ import annotations

import time

from operator_harness import (
    NAMESPACE,
    World,
    condition,
    digest_of,
    eventually,
    manifest,
    start_operator,
)

REFUSAL = "error: engine sha256:... was built by onnxruntime 1.16.3, but this image has ..."


def runtime_pod(world: World, ready: bool) -> dict:
    """The serving Deployment's pod as the kubelet reports it: after `kubeinfer serve`
    exited 3, waiting to be restarted; or running and ready."""
    deployment = world.one("apps/v1", "deployments")
    assert deployment is not None
    template = deployment["spec"]["template"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated = {
        "exitCode": 3, "reason": "Error", "message": REFUSAL, "startedAt": now, "finishedAt": now,
    }  # fmt: skip
    state = (
        {"running": {"startedAt": now}}
        if ready
        else {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "resnet-runtime-7c9f5-x2k4q",
            "namespace": NAMESPACE,
            "labels": template["metadata"]["labels"],
            "annotations": template["metadata"]["annotations"],
        },
        "spec": template["spec"],
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "runtime",
                    "image": template["spec"]["containers"][0]["image"],
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 3,
                    "state": state,
                    "lastState": {"terminated": terminated},
                }
            ],
        },
    }


async def test_a_runtime_refusing_its_engine_is_reported_from_its_pod(world: World) -> None:
    pin = digest_of("built by another onnxruntime")
    async with start_operator(world):
        world.api.create(
            "inferencedeployments", manifest(engine={"pin": pin}, runtime={"replicas": 1})
        )
        await eventually(lambda: world.one("apps/v1", "deployments"), what="the Deployment")
        pod = runtime_pod(world, ready=False)
        world.api.create("pods", pod)  # the status goes through its subresource
        world.api.patch(
            "v1", "pods", NAMESPACE, pod["metadata"]["name"], {"status": pod["status"]}, "status"
        )

        def degraded() -> dict | None:
            found = condition(world.infd(), "Degraded")
            return found if found and found["status"] == "True" else None

        found = await eventually(degraded, what="Degraded=True")
        assert found["reason"] == "EngineIncompatible"
        assert f"The runtime pod {pod['metadata']['name']} (engine {pin}) cannot start" in (
            found["message"]
        )
        assert REFUSAL in found["message"]
        assert condition(world.infd(), "Ready")["reason"] == "EngineIncompatible"

        recovered = runtime_pod(world, ready=True)
        world.api.patch(
            "v1", "pods", NAMESPACE, pod["metadata"]["name"], {"status": recovered["status"]},
            "status",
        )  # fmt: skip
        world.make_deployment_ready()
        await eventually(
            lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True",
            what="Ready=True",
        )
        assert condition(world.infd(), "Degraded")["status"] == "False"
