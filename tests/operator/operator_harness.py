"""The harness of the operator scenarios: an emulated API server on a real HTTP port and
the real kopf operator (our handlers, our client) running in-process against it.

The `world` fixture (conftest) starts `ApiServerEmulator` behind KMock's aiohttp
server; `start_operator` runs `kopf.operator` with a fresh registry, the operator's own handlers and
`OperatorSettings` whose timings are short so the scenarios run in seconds. `world`
holds the test's hands: it plays the parts of the Job controller, the kubelet and the
Deployment controller that the emulator does not have (a build finishing with a digest
in its pod's termination message, a Deployment becoming ready).

Every API call any scenario's operator made is added to `RECORDED_CALLS`, which the
RBAC test compares with `kubeinfer.operator.rbac`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import kmock
import kopf
import pytest
from emulator import ApiCall, ApiServerEmulator
from kubeinfer.operator.handlers import configure_kopf
from kubeinfer.operator.kube.leader_election import Election
from kubeinfer.operator.operator_command import run_operator
from kubeinfer.operator.settings import OperatorSettings

NAMESPACE = "ml"
IDS = ("kubeinfer.io/v1alpha1", "inferencedeployments")
RECORDED_CALLS: dict[str, set[ApiCall]] = {}
"""Every call the operator made, by scenario (test name)."""
SPEC_WRITES: dict[str, list[str]] = {}
"""The operator's requests that changed a spec, by scenario (there must be none)."""

WATCHED = {
    "inferencedeployments",
    "jobs",
    "pods",
    "deployments",
    "configmaps",
    "services",
    "persistentvolumeclaims",
}

FAST = OperatorSettings(
    resync_interval_seconds=0.5,
    build_poll_seconds=0.5,
    build_backoff_seconds=0.5,
    build_backoff_max_seconds=1,
)


POD_MONITOR_API = "monitoring.coreos.com/v1/podmonitors:PodMonitor"


def pod_monitor_api() -> dict[str, Callable[[dict[str, Any]], None]]:
    """The prometheus-operator's PodMonitor API for the emulator, with its official schema
    (skips, or fails under CI=true, where the schema cannot be had)."""
    from podmonitor_schema import validate_podmonitor

    return {POD_MONITOR_API: validate_podmonitor}


def serves_pod_monitors(test: Any) -> Any:
    """Marks a scenario whose emulated cluster serves PodMonitors (the `world` fixture and
    the RBAC replay read the mark)."""
    test.serves_pod_monitors = True
    return pytest.mark.serves_pod_monitors(test)


def digest_of(text: str) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def manifest(name: str = "resnet", version: str = "1", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {
            "name": "resnet",
            "version": version,
            "source": {"uri": f"https://models.example.com/resnet/{version}/model.onnx"},
        },
        "engine": {"backend": "onnxruntime", "precision": "fp32", "maxBatchSize": 8},
        "runtime": {"replicas": 2, "batching": {"maxBatchSize": 8}},
    }
    for key, value in spec.items():
        body[key] = {**body.get(key, {}), **value}
    return {
        "apiVersion": IDS[0],
        "kind": "InferenceDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": body,
    }


async def eventually(check: Callable[[], Any], within: float = 10.0, what: str = "") -> Any:
    """Polls `check` (every 10 ms) until it returns something truthy; fails after
    `within` seconds saying what was awaited."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"Timed out after {within} s waiting for {what or check}")
        await asyncio.sleep(0.01)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item["type"] == type_:
            return item
    return None


@dataclass
class World:
    """The emulated cluster and the controllers it lacks."""

    api: ApiServerEmulator
    url: str

    def infd(self, name: str = "resnet") -> dict[str, Any] | None:
        return self.api.get(*IDS, NAMESPACE, name)

    def children(self, kind_plural: tuple[str, str]) -> list[dict[str, Any]]:
        return self.api.list(*kind_plural, NAMESPACE)

    def watched(self, since: int = 0) -> set[str]:
        """Resources watched by the calls from the `since`-th on."""
        return {call.resource for call in self.api.calls[since:] if call.verb == "watch"}

    def jobs(self) -> list[dict[str, Any]]:
        return self.children(("batch/v1", "jobs"))

    def one(self, api_version: str, plural: str) -> dict[str, Any] | None:
        found = self.children((api_version, plural))
        return found[0] if len(found) == 1 else None

    def finish_build(
        self,
        job: dict[str, Any],
        *,
        digest: str | None,
        exit_code: int = 0,
        message: str | None = None,
    ) -> None:
        """Plays the Job controller and the kubelet: the Job's pod terminates with a
        termination message, then the Job is marked Complete (or Failed)."""
        name = job["metadata"]["name"]
        template = job["spec"]["template"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-x1",
                "namespace": NAMESPACE,
                "labels": {
                    **template["metadata"]["labels"],
                    "batch.kubernetes.io/job-name": name,
                    "job-name": name,
                },
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": template["spec"],
        }
        self.api.create("pods", pod)
        text = message if message is not None else json.dumps({"digest": digest, "target": "cpu"})
        container = template["spec"]["containers"][0]["name"]
        self.api.patch(
            "v1",
            "pods",
            NAMESPACE,
            pod["metadata"]["name"],
            {
                "status": {
                    "phase": "Succeeded" if exit_code == 0 else "Failed",
                    "containerStatuses": [
                        {
                            "name": container,
                            "image": "kubeinfer",
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {
                                "terminated": {
                                    "exitCode": exit_code,
                                    "message": text,
                                    "reason": "Completed" if exit_code == 0 else "Error",
                                    "startedAt": now,
                                    "finishedAt": now,
                                }
                            },
                        }
                    ],
                }
            },
            subresource="status",
        )
        if exit_code == 0:
            conditions = [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                {"type": "Complete", "status": "True", "lastTransitionTime": now},
            ]
            status = {"succeeded": 1, "completionTime": now}
        else:
            conditions = [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                    "lastTransitionTime": now,
                }
            ]
            status = {"failed": 1}
        self.api.patch(
            "batch/v1",
            "jobs",
            NAMESPACE,
            name,
            {"status": {**status, "startTime": now, "conditions": conditions}},
            subresource="status",
        )

    def make_deployment_ready(self) -> None:
        """Plays the Deployment controller: every desired pod updated, ready, available."""
        deployment = self.one("apps/v1", "deployments")
        assert deployment is not None
        replicas = deployment["spec"].get("replicas", 1)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.api.patch(
            "apps/v1",
            "deployments",
            NAMESPACE,
            deployment["metadata"]["name"],
            {
                "status": {
                    "observedGeneration": deployment["metadata"]["generation"],
                    "replicas": replicas,
                    "updatedReplicas": replicas,
                    "readyReplicas": replicas,
                    "availableReplicas": replicas,
                    "conditions": [
                        {
                            "type": "Available",
                            "status": "True",
                            "reason": "MinimumReplicasAvailable",
                            "lastUpdateTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                }
            },
            subresource="status",
        )


@contextlib.asynccontextmanager
async def emulated_world(
    validate_extra: dict[str, Callable[[dict[str, Any]], None]] | None = None,
) -> AsyncIterator[World]:
    """An emulated API server listening on a loopback port; `validate_extra` adds API
    groups it serves (see `ApiServerEmulator.validate_extra`)."""
    async with ApiServerEmulator(validate_extra=validate_extra or {}) as api, kmock.Server(
        api
    ) as server:
        yield World(api, str(server.url).rstrip("/"))


def kopf_settings() -> kopf.OperatorSettings:
    """The operator's kopf settings, tuned for tests: quick retries and exits."""
    settings = configure_kopf(kopf.OperatorSettings())
    settings.networking.error_backoffs = [0.1, 0.2]
    settings.watching.reconnect_backoff = 0.05
    settings.queueing.idle_timeout = 1.0
    settings.queueing.exit_timeout = 1.0
    settings.background.cancellation_polling = 0.1
    settings.process.ultimate_exiting_timeout = 2.0
    return settings


@contextlib.asynccontextmanager
async def start_operator(
    world: World,
    settings: OperatorSettings = FAST,
    *,
    election: Election | None = None,
    tokens: Callable[[], str | None] = lambda: None,
) -> AsyncIterator[asyncio.Task[None]]:
    """Runs the operator as `kubeinfer operator` does (`run_operator`) until the block
    ends, logged in to the emulator with the bearer token `tokens()` returns at each
    login; with `election`, as a replica that must win the Lease first. Yields the
    operator's task (done early when, say, the Lease was lost)."""

    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=world.url, default_namespace=NAMESPACE, token=tokens())

    stop, ready = asyncio.Event(), asyncio.Event()
    since = len(world.api.calls)
    task = asyncio.create_task(
        run_operator(
            settings,
            clusterwide=False,
            namespaces=[NAMESPACE],
            election=election,
            login=login,
            kopf_settings=kopf_settings(),
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), timeout=10)
        # kopf is ready before its watches are: wait for them, so that what a scenario
        # does next is seen through them, and timings do not include kopf's start.
        await eventually(lambda: WATCHED <= world.watched(since), what="kopf's watches")
        yield task
    finally:
        stop.set()
        if not task.done():
            await asyncio.wait_for(task, timeout=10)
