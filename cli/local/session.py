"""One `kubeinfer up`: start everything, apply the manifests, show what happens, stop.

`LocalSession.start` brings up the control plane and node (`kubeinfer.cluster`), applies
the CRD (and waits until the API serves it, since the operator resolves its resources
once, at start), starts Debian's Prometheus when it is installed, installs the operator
(`install`), and applies the manifests through the cluster's own kubectl (server-side),
after saying what the machine lacks (`substitutions`). `LocalSession.watch` then prints
the API server's Table of InferenceDeployments whenever a row changes (`table`) and keeps
a local forwarding port for each one's Service (`forward`). `LocalSession.stop` stops
Prometheus and the cluster; the node stops every pod's processes with it.

The directory holds the cluster's files, the admin kubeconfig, Prometheus' data and
`session.json`, where `kubeinfer down` finds what to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubeinfer.cli.local import install, prometheus, substitutions, table
from kubeinfer.cli.local.api import ApiError, NodeApi
from kubeinfer.cli.local.forward import Forwarder
from kubeinfer.cluster import control_plane, processes
from kubeinfer.operator.crdgen.crd import build_crd
from kubeinfer.operator.state import names

SESSION_FILE = "session.json"
FIELD_MANAGER = "kubeinfer-up"
INFD = "/apis/kubeinfer.io/v1alpha1/inferencedeployments"


def default_directory() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kubeinfer" / "local"


class UpError(RuntimeError):
    """`kubeinfer up` could not bring something up; the message says what."""


@dataclass
class LocalSession:
    directory: Path
    cpu: bool = False
    say: Callable[[str], None] = print
    cluster: control_plane.Cluster | None = None
    api: NodeApi | None = None
    prometheus_process: processes.Started | None = None
    prometheus_url: str | None = None
    forwarders: dict[tuple[str, str], Forwarder] = field(default_factory=dict)
    _rows: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _header_shown: bool = False

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    # -- starting ----------------------------------------------------------------------------
    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self.cluster = await asyncio.to_thread(
            control_plane.up,
            self.directory / "cluster",
            self.kubeconfig,
            progress=lambda line: self.say(f"  {line}"),
        )
        self.api = await NodeApi.from_kubeconfig(str(self.kubeconfig))
        self.say(f"  control plane and node up in {time.monotonic() - started:.1f} s")
        await self.kubectl_apply([build_crd(), install.namespace_object()])
        await self._wait_for_crd()
        await self._start_prometheus()
        await self.kubectl_apply(install.operator_objects(self.prometheus_url))
        self.say(
            f"  operator installed: {install.NAMESPACE}/{install.OPERATOR_ACCOUNT} "
            f"({install.OPERATOR_IMAGE}, the chart's ServiceAccount and RBAC)"
        )
        self._write_state(phase="started")

    async def _wait_for_crd(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                await self._api().request("GET", INFD)
                return
            except ApiError as error:  # 404, then 429 while its storage initialises
                if time.monotonic() > deadline:
                    raise UpError(f"the API server does not serve the CRD: {error}") from None
                await asyncio.sleep(0.1)

    async def _start_prometheus(self) -> None:
        binary, why = await asyncio.to_thread(prometheus.prometheus_binary)
        if binary is None:
            self.say(f"  metrics: no Prometheus ({why}); the operator reads the pods' "
                     "/metrics directly")  # fmt: skip
            return
        await self.kubectl_apply(install.prometheus_objects())
        token = await self._token(install.PROMETHEUS_ACCOUNT, 86400)
        folder = self.directory / "prometheus"
        folder.mkdir(exist_ok=True)
        token_file = folder / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        assert self.cluster is not None
        config = prometheus.write_config(
            folder / "prometheus.yml", self.cluster.server, self.cluster.pki.ca_cert, token_file
        )
        port = control_plane.free_port()
        self.prometheus_process, _ = processes.spawn(
            "prometheus",
            prometheus.command(binary, config, folder / "data", port),
            folder / "prometheus.log",
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(control_plane._http_ok, f"{url}/-/ready"):
            if not processes.is_running(self.prometheus_process) or time.monotonic() > deadline:
                log = (folder / "prometheus.log").read_text(errors="replace")[-2000:]
                raise UpError(f"Prometheus did not start:\n{log}")
            await asyncio.sleep(0.2)
        self.prometheus_url = url
        self.say(f"  metrics: Prometheus at {url}, discovering the pods through the API server")

    async def _token(self, account: str, seconds: int) -> str:
        issued = await self._api().request(
            "POST",
            f"/api/v1/namespaces/{install.NAMESPACE}/serviceaccounts/{account}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        return str(issued["status"]["token"])

    def _api(self) -> NodeApi:
        if self.api is None:
            raise UpError("the session has not started")
        return self.api

    # -- manifests ---------------------------------------------------------------------------
    async def kubectl(self, *args: str, stdin: str | None = None) -> str:
        assert self.cluster is not None
        result = await asyncio.to_thread(
            subprocess.run,
            [str(self.cluster.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise UpError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    async def kubectl_apply(self, objects: Sequence[dict[str, Any]]) -> str:
        stream = yaml.safe_dump_all(list(objects))
        return await self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            f"--field-manager={FIELD_MANAGER}",
            "-f",
            "-",
            stdin=stream,
        )

    async def apply_files(self, files: Sequence[Path]) -> list[dict[str, Any]]:
        """Applies every document of `files` (InferenceDeployments adapted to the machine,
        see `substitutions`), saying what the machine lacks first; the applied objects."""
        documents = []
        for path in files:
            try:
                loaded = [d for d in yaml.safe_load_all(path.read_text()) if d]
            except (OSError, yaml.YAMLError) as error:
                raise UpError(f"{path}: {error}") from None
            documents += loaded
        adapted = [substitutions.adapt(d, self.cpu) for d in documents]
        if not adapted:
            self._write_state(phase="applied")
            return []
        for item in adapted:
            for note in item.notes:
                self.say(f"  note: {note}")
        output = await self.kubectl_apply([a.manifest for a in adapted])
        for line in output.splitlines():
            self.say(f"  {line}")
        for item in adapted:
            if item.changes:
                await self._event(item.manifest, "; ".join(item.changes))
        self._write_state(phase="applied")
        return [a.manifest for a in adapted]

    async def _event(self, manifest: dict[str, Any], changes: str) -> None:
        """Says on the object what `--cpu` changed (what `kubectl describe` lists)."""
        meta = manifest["metadata"]
        namespace = meta.get("namespace", "default")
        found = await self._api().get(
            f"/apis/kubeinfer.io/v1alpha1/namespaces/{namespace}/"
            f"inferencedeployments/{meta['name']}"
        )
        if found is None:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        await self._api().request(
            "POST",
            f"/api/v1/namespaces/{namespace}/events",
            body={
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
                "involvedObject": {
                    "apiVersion": "kubeinfer.io/v1alpha1",
                    "kind": "InferenceDeployment",
                    "name": meta["name"],
                    "namespace": namespace,
                    "uid": found["metadata"]["uid"],
                },
                "type": "Normal",
                "reason": "LocalSubstitution",
                "message": f"kubeinfer up --cpu ran this on CPU with ONNX Runtime and no GPU "
                f"request: {changes}",
                "source": {"component": FIELD_MANAGER},
                "reportingComponent": FIELD_MANAGER,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )

    # -- watching ----------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Prints the Table rows that changed, and opens a port for each new object."""
        listing = await self._api().request("GET", INFD, accept=table.TABLE)
        lines = table.render(listing)
        header, rows = lines[0], lines[1:]
        for row, line in zip(listing.get("rows") or [], rows, strict=True):
            key = (row.get("object") or {}).get("metadata", {})
            ident = f"{key.get('namespace')}/{key.get('name')}"
            cells = table.row_key(listing, row)
            if self._rows.get(ident) != cells:
                if not self._header_shown:
                    self.say(header)
                    self._header_shown = True
                self.say(line)
                self._rows[ident] = cells
            await self._forward(key.get("namespace", "default"), key.get("name", ""))

    async def _forward(self, namespace: str, name: str) -> None:
        if (namespace, name) in self.forwarders:
            return
        service = names.service_name(name)

        async def endpoints() -> list[str]:
            return await self.ready_endpoints(namespace, service)

        forwarder = Forwarder(endpoints)
        await forwarder.start()
        self.forwarders[(namespace, name)] = forwarder
        infd = await self._api().get(
            f"/apis/kubeinfer.io/v1alpha1/namespaces/{namespace}/inferencedeployments/{name}"
        )
        model = ((infd or {}).get("spec") or {}).get("model", {}).get("name", name)
        self.say(
            f"  endpoint {namespace}/{name}: http://127.0.0.1:{forwarder.port}"
            f"/v2/models/{model}/infer"
        )
        self._write_state(phase="applied")

    async def ready_endpoints(self, namespace: str, service: str) -> list[str]:
        """`podIP:port` of each ready pod the Service selects, at its first port's target."""
        found = await self._api().get(f"/api/v1/namespaces/{namespace}/services/{service}")
        if found is None:
            return []
        selector = (found.get("spec") or {}).get("selector")
        if not selector:
            return []
        target = found["spec"]["ports"][0].get("targetPort", found["spec"]["ports"][0]["port"])
        pods = await self._api().request(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            labelSelector=",".join(f"{k}={v}" for k, v in sorted(selector.items())),
        )
        ready = []
        for pod in pods.get("items") or []:
            status = pod.get("status") or {}
            is_ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in status.get("conditions") or []
            )
            if not is_ready or pod["metadata"].get("deletionTimestamp") or not status.get("podIP"):
                continue
            port = target
            if not str(target).isdigit():
                port = next(
                    (
                        p["containerPort"]
                        for c in pod["spec"]["containers"]
                        for p in c.get("ports") or []
                        if p.get("name") == target
                    ),
                    None,
                )
            if port is not None:
                ready.append(f"{status['podIP']}:{port}")
        return sorted(ready)

    async def watch(self, stop: asyncio.Event, interval_seconds: float = 1.0) -> None:
        while not stop.is_set():
            with contextlib.suppress(ApiError, OSError):
                await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_seconds)

    # -- stopping ----------------------------------------------------------------------------
    async def stop(self) -> None:
        for forwarder in self.forwarders.values():
            await forwarder.close()
        self.forwarders.clear()
        if self.api is not None:
            await self.api.close()
            self.api = None
        if self.prometheus_process is not None:
            await asyncio.to_thread(processes.stop, [self.prometheus_process])
        await asyncio.to_thread(control_plane.down, self.directory / "cluster")
        (self.directory / SESSION_FILE).unlink(missing_ok=True)

    def _write_state(self, phase: str) -> None:
        state = {
            "pid": os.getpid(),
            "start_ticks": processes.start_ticks(os.getpid()),
            "phase": phase,
            "kubeconfig": str(self.kubeconfig),
            "prometheus": None
            if self.prometheus_process is None
            else self.prometheus_process.__dict__,
            "endpoints": {
                f"{ns}/{name}": f"http://127.0.0.1:{f.port}"
                for (ns, name), f in self.forwarders.items()
            },
        }
        (self.directory / SESSION_FILE).write_text(json.dumps(state, indent=2) + "\n")


def stop_directory(directory: Path, grace_seconds: float = 30.0) -> bool:
    """What `kubeinfer down` does: stops the session process (which stops the rest), then
    whatever it left (Prometheus, the cluster). False when nothing ran there."""
    state_file = directory / SESSION_FILE
    ran = state_file.exists() or (directory / "cluster" / control_plane.STATE_FILE).exists()
    if state_file.exists():
        state = json.loads(state_file.read_text())
        owner = processes.Started("kubeinfer up", state["pid"], state["start_ticks"] or -1, "")
        if owner.pid != os.getpid():
            processes.stop([owner], grace_seconds)
        if state.get("prometheus"):
            processes.stop([processes.Started(**state["prometheus"])])
        state_file.unlink(missing_ok=True)
    control_plane.down(directory / "cluster")
    return ran


def python_command() -> list[str]:
    return [sys.executable, "-m", "kubeinfer.cli.main"]
