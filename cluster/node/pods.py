"""One pod on the node: its volumes, its containers as local processes, their probes and
restarts, its status, and its graceful end.

`PodWorker.run` does what the kubelet's pod worker does, in order: set up the volumes
(the pod waits in ContainerCreating while an object they need is missing), run the init
containers one after the other, start the containers, then keep them as the pod's
restartPolicy says (a container that exits is restarted after the kubelet's back-off,
10 s doubling to 5 min, reset after 10 min of running) while the probes decide when a
container has started, is ready, or must be restarted. The status is written whenever
what `pod_status` computes changes. When the pod is deleted gracefully, each container's
preStop hook runs, then SIGTERM, then SIGKILL at the end of the grace period, and the
node deletes the pod object for good.

A container's process runs in a session of its own, so a signal reaches whatever it
started, and dies with the node agent (PR_SET_PDEATHSIG): no pod process outlives the
node. Its output goes to `logs/<container>-<restart>.log` in the pod's directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubeinfer.cluster.node import containers, images
from kubeinfer.cluster.node.api import STRATEGIC, ApiError, KubeObject, NodeApi
from kubeinfer.cluster.node.containers import ConfigError
from kubeinfer.cluster.node.paths import PathMap
from kubeinfer.cluster.node.pod_status import ContainerView, pod_status
from kubeinfer.cluster.node.probes import probe_loop, probe_once
from kubeinfer.cluster.node.volumes import (
    Endpoints,
    PodVolumes,
    VolumeNotReady,
)

log = logging.getLogger(__name__)
BACKOFF_INITIAL_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0
BACKOFF_RESET_SECONDS = 600.0
VOLUME_REFRESH_SECONDS = 1.0


def rfc3339(epoch: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@dataclass
class NodeContext:
    """What every pod worker of the node shares."""

    api: NodeApi
    node_name: str
    host_ip: str
    directory: Path
    server: str
    ca_file: Path
    endpoints: Endpoints
    extra_images: Mapping[str, images.ImageConfig]
    backoff_initial_seconds: float = BACKOFF_INITIAL_SECONDS
    record_event: Callable[..., Any] = lambda *a, **k: None


@dataclass
class Container:
    spec: dict[str, Any]
    view: ContainerView
    init: bool = False
    process: asyncio.subprocess.Process | None = None
    started_monotonic: float = 0.0
    backoff_seconds: float = 0.0
    restart_at: float | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stopping: bool = False
    exit_reason: str | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])


class PodWorker:
    """See the module docstring. `update` hands it the newest pod object; `gone` says the
    object was removed (force deletion); `run` returns once the pod is finished."""

    def __init__(self, node: NodeContext, pod: KubeObject, pod_ip: str) -> None:
        self.node, self.pod, self.ip = node, pod, pod_ip
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.directory = node.directory / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.volumes = PodVolumes(
            node.api, self._with_ip(pod), self.directory, node.directory, node.server,
            node.ca_file, node.endpoints,
        )  # fmt: skip
        spec = pod["spec"]
        self.restart_policy = spec.get("restartPolicy") or "Always"
        self.init = [
            Container(c, self._view(c), init=True) for c in spec.get("initContainers") or []
        ]
        self.containers = [Container(c, self._view(c)) for c in spec.get("containers") or []]
        self.wake = asyncio.Event()
        self.deleting = False
        self.is_gone = False
        self.volumes_ready = False
        self.start_time = rfc3339()
        self.published: dict[str, Any] | None = None
        self.finished = False
        self._stopping: set[asyncio.Task[None]] = set()

    def _with_ip(self, pod: KubeObject) -> KubeObject:
        status = {**(pod.get("status") or {}), "podIP": self.ip, "hostIP": self.node.host_ip,
                  "podIPs": [{"ip": self.ip}], "hostIPs": [{"ip": self.node.host_ip}]}  # fmt: skip
        return {**pod, "status": status}

    @staticmethod
    def _view(spec: Mapping[str, Any]) -> ContainerView:
        waiting = {"waiting": {"reason": "ContainerCreating"}}
        return ContainerView(name=spec["name"], image=spec.get("image", ""), state=waiting)

    # -- from the agent ----------------------------------------------------------------------
    def update(self, pod: KubeObject) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp") and not self.deleting:
            self.deleting = True
            self.wake.set()

    def gone(self) -> None:
        self.is_gone = self.deleting = True
        self.wake.set()

    # -- the life of the pod -----------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._publish()
            if await self._set_up_volumes() and await self._run_init_containers():
                await self._run_containers()
        finally:
            await self._stop_all(self._grace_seconds())
            self.finished = True
            if not self.is_gone:
                with contextlib.suppress(ApiError):
                    await self._publish()
                if self.deleting:
                    await self._delete_for_good()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=seconds)
        self.wake.clear()

    async def _set_up_volumes(self) -> bool:
        reported = None
        while not self.deleting:
            try:
                await self.volumes.prepare()
                self.volumes_ready = True
                return True
            except VolumeNotReady as error:
                if str(error) != reported:
                    reported = str(error)
                    self.node.record_event(self.pod, "Warning", "FailedMount",
                                           f"MountVolume.SetUp failed: {error}")  # fmt: skip
            await self._sleep(1.0)
        return False

    async def _run_init_containers(self) -> bool:
        for container in self.init:
            while not self.deleting:
                if container.process is None and container.view.terminated is None:
                    await self._start_when_due(container)
                await self._reap()
                await self._publish()
                terminated = container.view.terminated
                if terminated is not None and terminated.get("exitCode") == 0:
                    break
                if terminated is not None:
                    return False  # failed, and the restart policy says not again
                await self._sleep(0.5)
        return not self.deleting

    async def _run_containers(self) -> None:
        while not self.deleting:
            for container in self.containers:
                if container.process is None and container.view.terminated is None:
                    await self._start_when_due(container)  # first start, or a restart due
            await self._reap()
            with contextlib.suppress(VolumeNotReady, ApiError):
                await self.volumes.refresh()
            await self._publish()
            if self._phase() in ("Succeeded", "Failed"):
                return
            await self._sleep(VOLUME_REFRESH_SECONDS)

    def _phase(self) -> str:
        return str((self.published or {}).get("phase", "Pending"))

    # -- containers --------------------------------------------------------------------------
    async def _start_when_due(self, container: Container) -> bool:
        if container.restart_at is not None and time.monotonic() < container.restart_at:
            return False
        try:
            await self._start(container)
            return True
        except images.UnknownImage as error:
            self._waiting(container, "ErrImagePull", str(error))
            container.restart_at = time.monotonic() + self.node.backoff_initial_seconds
            self.node.record_event(self.pod, "Warning", "Failed", str(error))
        except ConfigError as error:
            self._waiting(container, "CreateContainerConfigError", str(error))
            container.restart_at = time.monotonic() + 1.0
        except OSError as error:
            self._waiting(container, "RunContainerError", str(error))
            container.restart_at = time.monotonic() + self.node.backoff_initial_seconds
        return False

    def _waiting(self, container: Container, reason: str, message: str) -> None:
        if reason == "ErrImagePull" and container.view.state.get("waiting", {}).get("reason") in (
            "ErrImagePull", "ImagePullBackOff"
        ):  # fmt: skip
            reason = "ImagePullBackOff"
        container.view.state = {"waiting": {"reason": reason, "message": message}}

    async def _environment(self, spec: Mapping[str, Any], paths: PathMap) -> dict[str, str]:
        return await containers.environment(
            spec, self._with_ip(self.pod), paths, self.node.extra_images,
            self.volumes.kubeconfig, self.node.api,
        )  # fmt: skip

    def _argv(self, spec: Mapping[str, Any], env: Mapping[str, str], paths: PathMap) -> list[str]:
        return containers.process_argv(spec, env, paths, self.ip, self.node.extra_images)

    async def _start(self, container: Container) -> None:
        spec = container.spec
        paths = self.volumes.path_map(spec)
        env = await self._environment(spec, paths)
        argv = self._argv(spec, env, paths)
        message_file = self.volumes.termination_file(container.name)
        message_file.unlink(missing_ok=True)
        logs = self.directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{container.name}-{container.view.restart_count}.log"
        working = Path(paths.host_path(spec.get("workingDir") or "") or self.directory)
        await asyncio.to_thread(working.mkdir, parents=True, exist_ok=True)
        with log_path.open("ab") as output:
            container.process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=output,
                stderr=asyncio.subprocess.STDOUT, env=env, cwd=working,
                start_new_session=True, preexec_fn=containers.die_with_parent,
            )  # fmt: skip
        container.started_monotonic = time.monotonic()
        container.restart_at = None
        container.stopping = False
        container.exit_reason = None
        container.view.container_id = f"kubeinfer-local://{container.process.pid}"
        container.view.state = {"running": {"startedAt": rfc3339()}}
        container.view.will_restart = False
        container.view.ready = False
        container.view.started = "startupProbe" not in spec
        self.node.record_event(self.pod, "Normal", "Started",
                               f"Started container {container.name}")  # fmt: skip
        container.tasks = [asyncio.create_task(self._watch_exit(container))]
        if not container.init:
            container.tasks += self._probe_tasks(container)
        if not container.init and "readinessProbe" not in spec and container.view.started:
            container.view.ready = True

    async def _watch_exit(self, container: Container) -> None:
        assert container.process is not None
        await container.process.wait()
        self.wake.set()

    def _probe_tasks(self, container: Container) -> list[asyncio.Task[None]]:
        spec = container.spec
        tasks = []

        async def attempt_of(probe: Mapping[str, Any]) -> tuple[bool, str]:
            return await probe_once(probe, self.ip, spec, self._exec_in(container))

        def on_startup(ok: bool, message: str) -> None:
            if ok and not container.view.started:
                container.view.started = True
                if "readinessProbe" not in spec:
                    container.view.ready = True
                self.wake.set()
            elif not ok:
                self._unhealthy(container, "Startup", message, kill=True)

        readiness_failing = False

        def on_readiness(ok: bool, message: str) -> None:
            nonlocal readiness_failing
            # One Unhealthy event per run of failures, the first included (a container
            # that was never ready says why too), not one per period.
            if not ok and not readiness_failing:
                self._unhealthy(container, "Readiness", message, kill=False)
            readiness_failing = not ok
            if container.view.ready != ok:
                container.view.ready = ok
                self.wake.set()

        def on_liveness(ok: bool, message: str) -> None:
            if not ok:
                self._unhealthy(container, "Liveness", message, kill=True)

        async def after_start(
            probe: Mapping[str, Any], report: Callable[[bool, str], None]
        ) -> None:
            while not container.view.started:  # noqa: ASYNC110 (set by the startup probe)
                await asyncio.sleep(0.1)
            await probe_loop(probe, lambda: attempt_of(probe), report)

        if "startupProbe" in spec:
            probe = spec["startupProbe"]
            tasks.append(
                asyncio.create_task(probe_loop(probe, lambda: attempt_of(probe), on_startup))
            )
        for key, report in (("readinessProbe", on_readiness), ("livenessProbe", on_liveness)):
            if key in spec:
                tasks.append(asyncio.create_task(after_start(spec[key], report)))
        return tasks

    def _unhealthy(self, container: Container, kind: str, message: str, kill: bool) -> None:
        self.node.record_event(self.pod, "Warning", "Unhealthy", f"{kind} probe failed: {message}")
        if kill and not container.stopping:
            container.exit_reason = "Error"
            self.node.record_event(
                self.pod, "Normal", "Killing",
                f"Container {container.name} failed {kind.lower()} probe, will be restarted",
            )  # fmt: skip
            stopping = asyncio.create_task(self._stop(container, self._grace_seconds()))
            self._stopping.add(stopping)  # held until done
            stopping.add_done_callback(self._stopping.discard)

    def _exec_in(self, container: Container) -> Callable[[Sequence[str], float], Any]:
        async def run(command: Sequence[str], timeout_seconds: float) -> int:
            paths = self.volumes.path_map(container.spec)
            env = await self._environment(container.spec, paths)
            spec = {**container.spec, "command": list(command), "args": []}
            process = await asyncio.create_subprocess_exec(
                *self._argv(spec, env, paths), env=env, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            try:
                return await asyncio.wait_for(process.wait(), timeout_seconds)
            except TimeoutError:
                process.kill()
                await process.wait()
                return 1

        return run

    async def _reap(self) -> None:
        """Records the containers whose process exited, and plans their restarts."""
        for container in self.init + self.containers:
            process = container.process
            if process is None or process.returncode is None:
                continue
            for task in container.tasks:
                task.cancel()
            container.tasks = []
            container.process = None
            code = process.returncode
            exit_code = code if code >= 0 else 128 - code
            message = containers.termination_message(
                self.volumes.termination_file(container.name),
                self.directory / "logs" / f"{container.name}-{container.view.restart_count}.log",
                container.spec.get("terminationMessagePolicy") or "File",
                exit_code,
            )
            terminated = {
                "exitCode": exit_code,
                "reason": container.exit_reason or ("Completed" if exit_code == 0 else "Error"),
                "startedAt": container.view.state.get("running", {}).get("startedAt", rfc3339()),
                "finishedAt": rfc3339(),
                "containerID": container.view.container_id,
            }
            if code < 0:
                terminated["signal"] = -code
            if message:
                terminated["message"] = message
            container.view.state = {"terminated": terminated}
            container.view.ready = False
            if container.init:
                # An init container that succeeded is done, whatever the policy; a failed
                # one is run again unless the policy is Never (then the pod fails).
                restart = not self.deleting and exit_code != 0 and self.restart_policy != "Never"
            else:
                restart = not self.deleting and (
                    self.restart_policy == "Always"
                    or (self.restart_policy == "OnFailure" and exit_code != 0)
                )
            container.view.will_restart = restart
            if restart:
                self._plan_restart(container)

    def _plan_restart(self, container: Container) -> None:
        ran = time.monotonic() - container.started_monotonic
        if ran > BACKOFF_RESET_SECONDS or container.backoff_seconds == 0:
            container.backoff_seconds = self.node.backoff_initial_seconds
        else:
            container.backoff_seconds = min(container.backoff_seconds * 2, BACKOFF_MAX_SECONDS)
        container.restart_at = time.monotonic() + container.backoff_seconds
        container.view.last_state = container.view.state
        container.view.restart_count += 1
        container.view.state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {container.backoff_seconds:g}s restarting failed "
                f"container={container.name} pod={self.name}_{self.namespace}({self.uid})",
            }
        }
        self.node.record_event(self.pod, "Warning", "BackOff",
                               "Back-off restarting failed container "
                               f"{container.name} in pod {self.name}")  # fmt: skip

    # -- ending ------------------------------------------------------------------------------
    def _grace_seconds(self) -> float:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        if meta.get("deletionGracePeriodSeconds") is not None:
            return float(meta["deletionGracePeriodSeconds"])
        return float(spec.get("terminationGracePeriodSeconds", 30))

    async def _stop(self, container: Container, grace_seconds: float) -> None:
        process = container.process
        if process is None or process.returncode is not None or container.stopping:
            return
        container.stopping = True
        deadline = time.monotonic() + grace_seconds
        hook = ((container.spec.get("lifecycle") or {}).get("preStop") or {}).get("sleep")
        if hook and not self.is_gone:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), min(float(hook["seconds"]), grace_seconds))
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), max(0.0, deadline - time.monotonic()))
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything it left in its session
        self.wake.set()

    async def _stop_all(self, grace_seconds: float) -> None:
        running = [c for c in self.init + self.containers if c.process is not None]
        for container in running:
            self.node.record_event(self.pod, "Normal", "Killing",
                                   f"Stopping container {container.name}")  # fmt: skip
        await asyncio.gather(*(self._stop(c, grace_seconds) for c in running))
        await self._reap()
        for container in self.init + self.containers:
            for task in container.tasks:
                task.cancel()
            container.view.will_restart = False

    async def _delete_for_good(self) -> None:
        with contextlib.suppress(ApiError):
            await self.node.api.request(
                "DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{self.name}",
                body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                      "preconditions": {"uid": self.uid}},
            )  # fmt: skip

    # -- status ------------------------------------------------------------------------------
    async def _publish(self) -> None:
        status = pod_status(
            init=[c.view for c in self.init],
            containers=[c.view for c in self.containers],
            restart_policy=self.restart_policy,
            volumes_ready=self.volumes_ready,
            pod_ip=self.ip,
            host_ip=self.node.host_ip,
            start_time=self.start_time,
            now=rfc3339(),
            previous_conditions=(self.published or {}).get("conditions"),
        )
        if status == self.published:
            return
        self.published = status
        try:
            await self.node.api.request(
                "PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
                body={"status": status}, content_type=STRATEGIC,
            )  # fmt: skip
        except ApiError as error:
            if error.status == 404:
                self.is_gone = self.deleting = True
                return
            self.published = None  # write it again next time
            log.warning("Pod status write failed: pod=%s/%s error=%s", self.namespace,
                        self.name, error)  # fmt: skip
