"""Real processes standing in for a cluster's pods, under the emulated API server.

`ProcessKubelet` plays the controllers and node agents the emulator lacks, with the real
`kubeinfer` CLI doing the work a pod would do:

- the Job controller and kubelet for build Jobs: each new Job's container argv runs as a
  real `kubeinfer build` (paths substituted: the cache volume, source mounts, the
  termination log), and the Job and its pod finish with that process' exit code and
  termination message, as the kubelet reports them;
- the ReplicaSet controller and kubelet for Deployments: each replica is a real
  `kubeinfer serve` started from the ConfigMap the pod template mounts, on a loopback
  port, with a Pod object (`podIP` 127.0.0.1, the `http` container port set to the real
  port, Ready once `/v2/health/ready` answers) so the operator's direct metrics read and
  its watches see it; a changed pod template rolls the pods (new ones first, the old
  stopped once the new are ready: maxUnavailable 0); the Deployment's status follows;
- the kubelet's refresh of ConfigMap volumes, and kube-proxy with cluster DNS: a serving
  pod's mirror target file is rewritten whenever its ConfigMap changes, with the
  candidate Service's DNS name replaced by a ready candidate pod's loopback address.

Only what a node provides is substituted; everything the operator renders is used as it
is. Use it through the `process_cluster` fixture (conftest) with the `world` fixture and
`start_operator`; drive traffic at `serving_url()`. The autoscaling work reuses it: pods
come and go with the Deployment's replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubeinfer.operator.reconcile.desired import (
    CACHE_MOUNT,
    CONFIG_KEY,
    MIRROR_KEY,
    SOURCES_MOUNT,
    TERMINATION_LOG,
)
from operator_harness import NAMESPACE, World

CLI = [sys.executable, "-m", "kubeinfer.operator.cli"]
ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""Kubernetes' alphabet for generated names (no vowels): pod names look like a
ReplicaSet's, which the named queries' pod regex relies on."""
SERVICE_HOST = re.compile(r"^http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?::\d+)?$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class RunningPod:
    """One `kubeinfer serve` process and the Pod object that stands for it."""

    name: str
    deployment: str
    template_hash: str
    labels: dict[str, str]
    port: int
    process: asyncio.subprocess.Process
    directory: Path
    mirror_configmap: str | None
    ready: bool = False
    mirror_text: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class ProcessKubelet:
    """See the module docstring. `sync()` is one pass over the world; `run()` loops it."""

    world: World
    workdir: Path
    interval_seconds: float = 0.2
    pods: dict[str, RunningPod] = field(default_factory=dict)
    builds: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    """Names of the pods stopped so far (a rolled or removed Deployment's)."""

    @property
    def cache(self) -> Path:
        return self.workdir / "cache"

    # -- the loop ----------------------------------------------------------------------------
    async def run(self) -> None:
        self.cache.mkdir(parents=True, exist_ok=True)
        while True:
            await self.sync()
            await asyncio.sleep(self.interval_seconds)

    failure: BaseException | None = None
    """What stopped `run` (a pod that crashed, a world it could not play); re-raised when
    the block of `process_kubelet` ends."""

    async def sync(self) -> None:
        self._start_builds()
        for deployment in self.world.children(("apps/v1", "deployments")):
            await self._sync_deployment(deployment)
        live = {d["metadata"]["name"] for d in self.world.children(("apps/v1", "deployments"))}
        for pod in [p for p in self.pods.values() if p.deployment not in live]:
            await self._stop(pod)
        await self._sync_mirror_files()

    async def close(self) -> None:
        for task in self.builds.values():
            task.cancel()
        await asyncio.gather(*self.builds.values(), return_exceptions=True)
        for pod in list(self.pods.values()):
            await self._stop(pod, delete_object=False)

    # -- build Jobs --------------------------------------------------------------------------
    def _start_builds(self) -> None:
        for job in self.world.jobs():
            name = job["metadata"]["name"]
            if name not in self.builds and not (job.get("status") or {}).get("conditions"):
                self.builds[name] = asyncio.create_task(self._build(job))

    async def _build(self, job: dict[str, Any]) -> None:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["kubeinfer"]
        log = self.workdir / f"{job['metadata']['name']}.termination-log"
        sources = {
            m["mountPath"]: m["mountPath"]
            for m in container["volumeMounts"]
            if m["mountPath"].startswith(SOURCES_MOUNT)
        }
        assert not sources, "pvc:// sources are not played here; use file:// in the manifest"
        paths = {CACHE_MOUNT: str(self.cache), TERMINATION_LOG: str(log)}
        argv = [paths.get(arg, arg) for arg in container["args"]]
        process = await asyncio.create_subprocess_exec(
            *CLI, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output, _ = await process.communicate()
        message = log.read_text() if log.exists() else output.decode(errors="replace")[-2000:]
        self.world.finish_build(job, digest=None, exit_code=process.returncode, message=message)

    # -- Deployments -------------------------------------------------------------------------
    async def _sync_deployment(self, deployment: dict[str, Any]) -> None:
        name = deployment["metadata"]["name"]
        template = deployment["spec"]["template"]
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
        template_hash = "".join(ALPHABET[b % len(ALPHABET)] for b in digest[:10])
        replicas = int(deployment["spec"].get("replicas", 1))
        mine = [p for p in self.pods.values() if p.deployment == name]
        new = [p for p in mine if p.template_hash == template_hash]
        old = [p for p in mine if p.template_hash != template_hash]
        for pod in new:
            await self._check_ready(pod)
        if len(new) < replicas:
            await self._start(deployment, template_hash)
        for pod in new[replicas:]:
            await self._stop(pod)
        ready_new = [p for p in new if p.ready]
        if len(ready_new) >= replicas or replicas == 0:  # maxUnavailable 0: old go last
            for pod in old:
                await self._stop(pod)
        self._write_deployment_status(deployment, template_hash)

    async def _start(self, deployment: dict[str, Any], template_hash: str) -> None:
        template = deployment["spec"]["template"]
        pod_spec = template["spec"]
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        configmap = self.world.api.get(
            "v1", "configmaps", NAMESPACE, volumes["config"]["configMap"]["name"]
        )
        if configmap is None:
            return  # the kubelet waits for the volume's ConfigMap
        suffix = "".join(secrets.choice(ALPHABET) for _ in range(5))
        name = f"{deployment['metadata']['name']}-{template_hash}-{suffix}"
        directory = self.workdir / name
        directory.mkdir(parents=True)
        config = yaml.safe_load(configmap["data"][CONFIG_KEY])
        config["engine"]["cacheDirectory"] = str(self.cache)
        config.update(host="127.0.0.1", httpPort=free_port(), drainGracePeriodSeconds=2)
        mirror = volumes.get("mirror", {}).get("configMap", {}).get("name")
        if config.get("mirrorTargetFile"):
            config["mirrorTargetFile"] = str(directory / MIRROR_KEY)
        (directory / CONFIG_KEY).write_text(yaml.safe_dump(config))
        log = (directory / "serve.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            *CLI, "serve", "--config", str(directory / CONFIG_KEY), stdout=log, stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        labels = {**template["metadata"]["labels"], "pod-template-hash": template_hash}
        pod = RunningPod(
            name, deployment["metadata"]["name"], template_hash, labels, config["httpPort"],
            process, directory, mirror,
        )  # fmt: skip
        self.pods[name] = pod
        self.world.api.create("pods", self._pod_object(pod, deployment))

    def _pod_object(self, pod: RunningPod, deployment: dict[str, Any]) -> dict[str, Any]:
        spec = json.loads(json.dumps(deployment["spec"]["template"]["spec"]))
        for container in spec["containers"]:
            for port in container.get("ports") or []:
                if port.get("name") == "http":
                    port["containerPort"] = pod.port
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": NAMESPACE,
                "labels": pod.labels,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",  # a ReplicaSet's, in a real cluster
                        "name": deployment["metadata"]["name"],
                        "uid": deployment["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": spec,
        }

    async def _check_ready(self, pod: RunningPod) -> None:
        if pod.ready:
            return
        if pod.process.returncode is not None:
            raise AssertionError(
                f"{pod.name} exited with {pod.process.returncode}: "
                + (pod.directory / "serve.log").read_text()[-3000:]
            )
        try:
            timeout = aiohttp.ClientTimeout(total=1)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(f"{pod.url}/v2/health/ready") as response:
                    pod.ready = response.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return
        if pod.ready:
            await self._sync_mirror_files()  # the volume is there before the pod is ready
            condition = {"type": "Ready", "status": "True", "lastTransitionTime": now_rfc3339()}
            status = {"phase": "Running", "podIP": "127.0.0.1", "conditions": [condition]}
            self.world.api.patch("v1", "pods", NAMESPACE, pod.name, {"status": status}, "status")

    async def _stop(self, pod: RunningPod, delete_object: bool = True) -> None:
        self.pods.pop(pod.name, None)
        self.stopped.append(pod.name)
        if pod.process.returncode is None:
            pod.process.terminate()
            try:
                await asyncio.wait_for(pod.process.wait(), timeout=15)
            except TimeoutError:
                pod.process.kill()
                await pod.process.wait()
        if delete_object and self.world.api.get("v1", "pods", NAMESPACE, pod.name):
            self.world.api.delete("v1", "pods", NAMESPACE, pod.name)

    def _write_deployment_status(self, deployment: dict[str, Any], template_hash: str) -> None:
        name = deployment["metadata"]["name"]
        mine = [p for p in self.pods.values() if p.deployment == name]
        updated = [p for p in mine if p.template_hash == template_hash]
        ready = [p for p in mine if p.ready]
        replicas = int(deployment["spec"].get("replicas", 1))
        status = {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": len(mine),
            "updatedReplicas": len(updated),
            "readyReplicas": len(ready),
            "availableReplicas": len(ready),
            "conditions": [
                {
                    "type": "Available",
                    "status": "True" if len(ready) >= replicas else "False",
                    "reason": "MinimumReplicasAvailable",
                    "lastUpdateTime": now_rfc3339(),
                    "lastTransitionTime": now_rfc3339(),
                }
            ],
        }
        previous = dict(deployment.get("status") or {})
        comparable = {k: v for k, v in status.items() if k != "conditions"}
        if {k: previous.get(k) for k in comparable} == comparable and previous.get(
            "conditions", [{}]
        )[0].get("status") == status["conditions"][0]["status"]:
            return  # nothing changed: no write, no watch event
        self.world.api.patch(
            "apps/v1", "deployments", NAMESPACE, name, {"status": status}, "status"
        )

    # -- ConfigMap volumes, Services ---------------------------------------------------------
    async def _sync_mirror_files(self) -> None:
        for pod in list(self.pods.values()):
            if pod.mirror_configmap is None:
                continue
            configmap = self.world.api.get("v1", "configmaps", NAMESPACE, pod.mirror_configmap)
            text = ((configmap or {}).get("data") or {}).get(MIRROR_KEY, "")
            document = yaml.safe_load(text) or {}
            target = document.get("target")
            if target:
                target["url"] = self._resolve(target["url"])
            rendered = yaml.safe_dump(document)
            if rendered != pod.mirror_text:
                staged = pod.directory / f".{MIRROR_KEY}.tmp"
                staged.write_text(rendered)
                staged.replace(pod.directory / MIRROR_KEY)  # atomic, as the kubelet swaps
                pod.mirror_text = rendered

    def _resolve(self, url: str) -> str:
        """A Service URL as kube-proxy and DNS would route it: to a ready pod it selects
        (unchanged when none is ready: a connection then fails, as it would)."""
        match = SERVICE_HOST.match(url)
        if match is None or match.group(2) != NAMESPACE:
            return url
        service = self.world.api.get("v1", "services", NAMESPACE, match.group(1))
        selector = ((service or {}).get("spec") or {}).get("selector") or {}
        for pod in self.pods.values():
            if pod.ready and selector and selector.items() <= pod.labels.items():
                return pod.url
        return url

    # -- for the tests -----------------------------------------------------------------------
    def pods_of(self, deployment: str) -> list[RunningPod]:
        return [p for p in self.pods.values() if p.deployment == deployment]

    def serving_url(self, deployment: str) -> str | None:
        ready = self.ready_urls(deployment)
        return ready[0] if ready else None

    def ready_urls(self, deployment: str) -> list[str]:
        """The ready pods' URLs, as a Service's endpoints list them."""
        return sorted(p.url for p in self.pods_of(deployment) if p.ready)


@contextlib.asynccontextmanager
async def process_kubelet(world: World, workdir: Path):
    """A running `ProcessKubelet` for the duration of the block."""
    kubelet = ProcessKubelet(world, workdir)
    task = asyncio.create_task(kubelet.run())
    task.add_done_callback(
        lambda t: setattr(kubelet, "failure", None if t.cancelled() else t.exception())
    )
    try:
        yield kubelet
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await kubelet.close()
        if kubelet.failure is not None:  # the cause, rather than a test's timeout after it
            raise kubelet.failure
