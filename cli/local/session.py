"""One `kubeinfer up`: start everything, apply the manifests, show what happens, stop.

`LocalSession.prepare` builds what the cluster runs in the host's network namespace and
then moves the process into one of its own (`namespace`); `LocalSession.start` brings up
the control plane and node there (`kubeinfer.cluster`), applies the CRD (and waits until
the API serves it, since the operator resolves its resources once, at start), starts
Prometheus on the node's address, and installs the operator (`install`); `apply_files`
applies manifests through the cluster's own kubectl (server-side), after saying what the
machine lacks and publishing its files to the pods (`substitutions`). `watch` then prints
the API server's Table of InferenceDeployments whenever a row changes (`table`).
`LocalSession.stop` stops Prometheus and the cluster, with every pod.

What the user is given lives in the host's namespace: 127.0.0.1 ports forwarding into
the session's (`forward`) to the API server (the `kubeconfig` it prints), Prometheus, and
each InferenceDeployment's Service. The directory holds the cluster's files, that
kubeconfig, Prometheus' data and `session.json`, where `kubeinfer down` finds what to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubeinfer.cli.local import install, namespace, prometheus, substitutions, table
from kubeinfer.cli.local.activator import NAME as ACTIVATOR_NAME
from kubeinfer.cli.local.activator import activator_objects
from kubeinfer.cli.local.api import ApiError, NodeApi
from kubeinfer.cli.local.forward import Forwarder, Target, fixed
from kubeinfer.cluster import control_plane, files, netns, processes
from kubeinfer.operator.crdgen.crd import build_crd
from kubeinfer.operator.settings import Activator
from kubeinfer.operator.state import names

SESSION_FILE = "session.json"
FIELD_MANAGER = "kubeinfer-up"
INFD = "/apis/kubeinfer.io/v1alpha1/inferencedeployments"
PROMETHEUS_PORT = 9090
PROMETHEUS_INSIDE = f"http://{netns.NODE_ADDRESS}:{PROMETHEUS_PORT}"
"""Prometheus on the node's address: where the operator's pod reaches it."""


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
    operator_settings: dict[str, str] = field(default_factory=dict)
    """Operator variables over the laptop's (`install.operator_objects`): the demo's."""
    entered: namespace.Entered | None = None
    cluster: control_plane.Cluster | None = None
    api: NodeApi | None = None
    api_forward: Forwarder | None = None
    prometheus_process: processes.Started | None = None
    prometheus_forward: Forwarder | None = None
    forwarders: dict[tuple[str, str], Forwarder] = field(default_factory=dict)
    _starting: asyncio.Future[control_plane.Cluster] | None = None
    _rows: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _header_shown: bool = False

    @property
    def kubeconfig(self) -> Path:
        """The user's kubeconfig: the API server at a port of the host's namespace."""
        return self.directory / "kubeconfig"

    @property
    def prometheus_url(self) -> str | None:
        return None if self.prometheus_forward is None else self.prometheus_forward.url

    # -- starting ----------------------------------------------------------------------------
    def prepare(self) -> None:
        """Builds in the host's namespace, then enters the session's own. Call it before
        the event loop runs: no thread may exist yet (`namespace`)."""
        refuse_a_second_session(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write_state(phase="preparing")  # `down` and a second session find it from now
        self.say("  building (or finding in the cache) the cluster's binaries and images")
        try:
            self.entered = namespace.build_then_enter(lambda line: self.say(f"  {line}"))
        except BaseException:
            (self.directory / SESSION_FILE).unlink(missing_ok=True)
            raise

    def _entered(self) -> namespace.Entered:
        if self.entered is None:
            raise UpError("the session has not entered its namespace (prepare() first)")
        return self.entered

    async def start(self) -> None:
        self._entered()
        started = time.monotonic()
        # A thread cannot be cancelled: `stop` waits for it before stopping the cluster,
        # or a start interrupted here would go on starting processes after the stop.
        self._starting = asyncio.ensure_future(
            asyncio.to_thread(
                control_plane.up,
                self.directory / "cluster",
                in_this_namespace=True,
                progress=lambda line: self.say(f"  {line}"),
            )
        )
        self.cluster = await asyncio.shield(self._starting)
        self.api = await NodeApi.from_kubeconfig(str(self.cluster.kubeconfig))
        address = urllib.parse.urlsplit(self.cluster.server)
        self.api_forward = await self._forward_to(fixed(address.hostname or "", address.port or 0))
        self._write_kubeconfig(self.api_forward.port)
        self.say(f"  control plane and node up in {time.monotonic() - started:.1f} s")
        await self.kubectl_apply([build_crd(), *install.namespace_objects()])
        await self._wait_for_crd()
        await self._start_prometheus()
        inside_url = PROMETHEUS_INSIDE if self.prometheus_forward else None
        await self.kubectl_apply(install.operator_objects(inside_url, self.operator_settings))
        self.say(
            f"  operator installed: {install.NAMESPACE}/{install.OPERATOR_ACCOUNT} "
            f"({install.OPERATOR_IMAGE}, the chart's ServiceAccount and RBAC)"
        )
        # The activator posts a wake to the operator's Service as it holds a request (the
        # operator's poll of an object at zero is the fallback, as in the chart).
        await self.kubectl_apply(activator_objects(Activator(), wake_url=install.WAKE_URL))
        self.say(f"  activator installed: {install.NAMESPACE}/{ACTIVATOR_NAME} (2 replicas)")
        self._write_state(phase="started")

    async def _forward_to(self, target: Target) -> Forwarder:
        entered = self._entered()
        forwarder = Forwarder(entered.host, entered.inside, target)
        await forwarder.start()
        return forwarder

    def _write_kubeconfig(self, port: int) -> None:
        assert self.cluster is not None
        document = yaml.safe_load(self.cluster.kubeconfig.read_text())
        for entry in document["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
        self.kubeconfig.write_text(yaml.safe_dump(document))
        self.kubeconfig.chmod(0o600)

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
        entered, cluster = self._entered(), self.cluster
        assert cluster is not None
        if entered.prometheus_binary is None:
            self.say(f"  metrics: no Prometheus ({entered.prometheus_problem}); the operator "
                     "reads the pods' /metrics directly")  # fmt: skip
            return
        await self.kubectl_apply(install.prometheus_objects())
        token = await self._token(install.PROMETHEUS_ACCOUNT, 86400)
        folder = self.directory / "prometheus"
        folder.mkdir(exist_ok=True)
        token_file = folder / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        config = prometheus.write_config(
            folder / "prometheus.yml", cluster.server, cluster.pki.ca_cert, token_file
        )
        address = f"{netns.NODE_ADDRESS}:{PROMETHEUS_PORT}"
        self.prometheus_process, _ = processes.spawn(
            "prometheus",
            prometheus.command(entered.prometheus_binary, config, folder / "data", address),
            folder / "prometheus.log",
        )
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(_answers, f"{PROMETHEUS_INSIDE}/-/ready"):
            if not processes.is_running(self.prometheus_process) or time.monotonic() > deadline:
                log = (folder / "prometheus.log").read_text(errors="replace")[-2000:]
                raise UpError(f"Prometheus did not start:\n{log}")
            await asyncio.sleep(0.2)
        self.prometheus_forward = await self._forward_to(fixed(netns.NODE_ADDRESS, PROMETHEUS_PORT))
        self.say(f"  metrics: Prometheus at {self.prometheus_url}, discovering the pods "
                 "through the API server")  # fmt: skip

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
        """The cluster's kubectl, as the admin, from inside the session's namespace."""
        assert self.cluster is not None
        result = await asyncio.to_thread(
            subprocess.run,
            [str(self.cluster.kubectl), f"--kubeconfig={self.cluster.kubeconfig}", *args],
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
        """Applies every document of `files` (`apply`); the applied objects."""
        documents = []
        for path in files:
            try:
                loaded = [d for d in yaml.safe_load_all(path.read_text()) if d]
            except (OSError, yaml.YAMLError) as error:
                raise UpError(f"{path}: {error}") from None
            documents += loaded
        applied, output = await self.apply(documents)
        for line in output.splitlines():
            self.say(f"  {line}")
        self._write_state(phase="applied")
        return applied

    async def apply(self, documents: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
        """Applies `documents` adapted to the machine (`substitutions`: --cpu, and this
        machine's files published to the pods), saying what the machine lacks first, and
        records on each object what was changed; the applied objects and kubectl's output."""
        published = await asyncio.to_thread(self._publish, documents)
        adapted = [substitutions.adapt(d, self.cpu, published) for d in documents]
        if not adapted:
            return [], ""
        for item in adapted:
            for note in item.notes:
                self.say(f"  note: {note}")
        output = await self.kubectl_apply([a.manifest for a in adapted])
        for item in adapted:
            if item.event_message():
                await self._event(item.manifest, item.event_message())
        return [a.manifest for a in adapted], output

    def _publish(self, documents: Sequence[dict[str, Any]]) -> dict[str, str]:
        """file:// URI -> the URL at which the cluster's file server gives it to the pods,
        for each that names an existing file or folder of this machine."""
        assert self.cluster is not None
        published = {}
        for document in documents:
            for uri in substitutions.local_files(document):
                path = Path(urllib.parse.unquote(uri.removeprefix("file://")))
                if path.is_absolute() and path.exists():
                    url = files.publish(self.cluster.directory, path)
                    published[uri] = url + "/" if path.is_dir() else url
        return published

    async def _event(self, manifest: dict[str, Any], message: str) -> None:
        """Says on the object what was changed for the machine (`kubectl describe` lists it)."""
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
                "message": message,
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

        async def target() -> tuple[str, int] | None:
            return await self.service_address(namespace, service)

        self.forwarders[(namespace, name)] = forwarder = await self._forward_to(target)
        infd = await self._api().get(
            f"/apis/kubeinfer.io/v1alpha1/namespaces/{namespace}/inferencedeployments/{name}"
        )
        model = ((infd or {}).get("spec") or {}).get("model", {}).get("name", name)
        self.say(f"  endpoint {namespace}/{name}: {forwarder.url}/v2/models/{model}/infer")
        self._write_state(phase="applied")

    async def service_address(self, namespace: str, service: str) -> tuple[str, int] | None:
        """The Service's ClusterIP and its `http` port (kube-proxy balances it over the
        ready pods), or None while it does not exist."""
        try:
            found = await self._api().get(f"/api/v1/namespaces/{namespace}/services/{service}")
        except ApiError:
            return None
        spec = (found or {}).get("spec") or {}
        ports = spec.get("ports") or []
        if not ports or spec.get("clusterIP") in (None, "", "None"):
            return None
        port = next((p["port"] for p in ports if p.get("name") == "http"), ports[0]["port"])
        return str(spec["clusterIP"]), int(port)

    async def watch(self, stop: asyncio.Event, interval_seconds: float = 1.0) -> None:
        while not stop.is_set():
            with contextlib.suppress(ApiError, OSError):
                await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_seconds)

    # -- stopping ----------------------------------------------------------------------------
    async def stop(self) -> None:
        if self._starting is not None and not self._starting.done():
            self.say("  (waiting for the cluster's start to finish, to stop all of it)")
            with contextlib.suppress(Exception):
                await self._starting
        forwarders = [*self.forwarders.values(), self.prometheus_forward, self.api_forward]
        for forwarder in forwarders:
            if forwarder is not None:
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
            "prometheus_url": self.prometheus_url,
            "endpoints": {f"{ns}/{name}": f.url for (ns, name), f in self.forwarders.items()},
        }
        (self.directory / SESSION_FILE).write_text(json.dumps(state, indent=2) + "\n")


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def live_session(directory: Path) -> int | None:
    """The pid of the session that runs from `directory` now, if one does (not this one)."""
    try:
        state = json.loads((directory / SESSION_FILE).read_text())
        owner = processes.Started("kubeinfer up", int(state["pid"]), state["start_ticks"], "")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if owner.pid == os.getpid() or not processes.is_running(owner):
        return None
    return owner.pid


def refuse_a_second_session(directory: Path) -> None:
    """UpError when a session already runs from `directory`: starting there would stop its
    cluster (a start clears what a crashed one left)."""
    pid = live_session(directory)
    if pid is not None:
        raise UpError(
            f"a session already runs from {directory} (pid {pid}): stop it with "
            f"`kubeinfer down --directory {directory}`, or choose another directory"
        )


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
