"""`cluster up` and `cluster down`: a Kubernetes control plane and one real node, in a
network namespace of the cluster's own, as one unit a directory describes.

The control plane is etcd, kube-apiserver, kube-controller-manager and kube-scheduler;
the node is containerd with runc and the CNI reference plugins, the kubelet and kube-proxy,
with CoreDNS and a storage provisioner running on it as pods (`addons`); pods run the
project's images (`images`), imported into containerd since no registry is reachable.
Every process runs inside the cluster's network namespace (`netns`): either one made
for the cluster and kept alive by a holder process, with 127.0.0.1 ports of the caller's
namespace forwarding to the API server (`gateway`), or the caller's own, when the caller
made it for the purpose (a test worker, `kubeinfer up`), which then reaches pods and
Services directly, as a process on the node does.

The directory holds the PKI, etcd's data, each process' log, the kubeconfigs, the node's
state (kubelet, containerd, volumes) and `state.json` (what runs, for `down`). The API
server authenticates by certificate and service-account token and authorizes with the
Node authorizer and RBAC, so a Role that lacks a verb fails here as it would anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml
from kubeinfer.cluster import (
    addons,
    binaries,
    cgroups,
    components,
    container_runtime,
    files,
    images,
    kubelet,
    netns,
    processes,
    teardown,
)
from kubeinfer.cluster.certificates import ADMIN_USER, COMPONENTS, Pki, write_pki

STATE_FILE = "state.json"
AUDIT_LOG = components.AUDIT_LOG
READY_TIMEOUT_SECONDS = 120.0
GPU_RESOURCE = "nvidia.com/gpu"


class ClusterError(RuntimeError):
    """The cluster could not start (or stop); the message says which process and why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_directory() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kubeinfer" / "cluster"


@dataclass(frozen=True)
class Cluster:
    """A running cluster, as `up` left it."""

    directory: Path
    server: str
    """The API server's URL from the caller's network namespace."""
    kubeconfig: Path
    kubectl: Path
    pki: Pki
    namespace_path: str | None = None
    """/proc/PID/ns/net of the cluster's own namespace, or None when it is the caller's."""

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """An admin GET of `path` on the API server (status, body); 0 when unreachable."""
        try:
            with urllib.request.urlopen(
                self.server + path, context=self.ssl_context(), timeout=timeout
            ) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except (urllib.error.URLError, OSError):
            return 0, b""


def _key(directory: Path) -> str:
    return hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]


def cgroup_root(directory: Path) -> str:
    """The cluster's own cgroup, named after its directory (two clusters never share)."""
    return f"/kubeinfer-{_key(directory)}"


NODE_STATE_ROOT = Path("/var/lib/kubeinfer")


def node_directory(directory: Path) -> Path:
    """Where the node keeps its state (containerd's, the kubelet's): a short path named
    after the cluster's directory, since their Unix sockets must fit in 108 bytes and a
    test's temporary directory alone can take most of that. `directory/node` links to it."""
    return NODE_STATE_ROOT / _key(directory)


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)


@dataclass
class _Launcher:
    """Starts the cluster's processes in its namespace and remembers them for `down`."""

    directory: Path
    network: netns.NodeNetwork
    environment: dict[str, str]
    started: list[processes.Started] = field(default_factory=list)
    extra_state: dict[str, object] = field(default_factory=dict)

    def launch(self, name: str, argv: list[str], *, inside: bool = True) -> processes.Started:
        command = self.network.command(argv) if inside else argv
        process, _ = processes.spawn(
            name, command, self.directory / "logs" / f"{name}.log", env=self.environment
        )
        self.started.append(process)
        self.save()
        return process

    def save(self) -> None:
        processes.write_state(self.directory / STATE_FILE, self.started, **self.extra_state)

    def wait(
        self, what: str, check: Callable[[], bool], timeout: float = READY_TIMEOUT_SECONDS
    ) -> None:
        """Polls `check` until true; ClusterError naming a process that exited (with the
        end of its log) or the timeout otherwise."""
        deadline = time.monotonic() + timeout
        while not check():
            for process in self.started:
                if not processes.is_running(process):
                    tail = Path(process.log).read_text(errors="replace")[-3000:]
                    raise ClusterError(f"{process.name} exited while waiting for {what}:\n{tail}")
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.1)


def node_images(
    found: dict[str, Path], progress: Callable[[str], None] = binaries.say
) -> list[Path]:
    """The OCI archives the node imports: the project's images and one image per static
    binary that runs as a pod (the sandbox's pause, CoreDNS, the storage provisioner)."""
    archives = list(images.ensure_project_images(progress=progress).values())
    for reference, name in (
        (container_runtime.PAUSE_IMAGE, "pause"),
        (addons.COREDNS_IMAGE, "coredns"),
        (addons.PROVISIONER_IMAGE, "local-path-provisioner"),
    ):
        archives.append(images.ensure_binary_image(reference, found[name], [f"/{name}"]))
    return archives


def _prepare(
    directory: Path, progress: Callable[[str], None]
) -> tuple[dict[str, Path], list[Path]]:
    """The binaries and image archives the cluster runs (built on first use, which needs
    the package registries: `kubeinfer cluster build` first, where the caller is in a
    namespace with no way out), and `directory` emptied."""
    found = {**binaries.ensure_binaries(), **binaries.ensure_node_binaries()}
    archives = node_images(found, progress)
    if (directory / STATE_FILE).exists():
        down(directory)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return found, archives


def _write_kubeconfigs(paths: components.Paths) -> None:
    pki = paths.pki
    identities = {name: (pki.component_cert(name), pki.component_key(name), user)
                  for name, (user, _) in COMPONENTS.items()}  # fmt: skip
    identities["admin"] = (pki.admin_cert, pki.admin_key, ADMIN_USER)
    for name, (cert, key, user) in identities.items():
        document = components.kubeconfig_document(
            components.INSIDE_SERVER, pki.ca_cert, cert, key, user
        )
        _write_private(paths.kubeconfig(name), yaml.safe_dump(document))


def _start_control_plane(
    launcher: _Launcher, paths: components.Paths, audit: bool, progress: Callable[[str], None]
) -> str:
    """etcd, the API server (and the gateway to it where the namespace is the cluster's),
    the controllers and the scheduler; the API server's URL from the caller's side."""
    t0 = time.monotonic()
    policy = None
    if audit:
        policy = paths.directory / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(components.AUDIT_POLICY))
    launcher.launch("etcd", components.etcd(paths))
    launcher.launch("kube-apiserver", components.kube_apiserver(paths, policy))
    server = components.INSIDE_SERVER
    if launcher.network.namespace_path is not None:
        port = free_port()
        forward = f"{port}=127.0.0.1:{components.API_PORT}"
        gateway = [os.environ.get("KUBEINFER_PYTHON", "") or _python(), "-m",
                   "kubeinfer.cluster.gateway", "--namespace", launcher.network.namespace_path,
                   "--forward", forward]  # fmt: skip
        launcher.launch("gateway", gateway, inside=False)
        server = f"https://127.0.0.1:{port}"
    probe = Cluster(paths.directory, server, paths.kubeconfig("admin"), Path(), paths.pki)
    launcher.wait("the API server's /readyz", lambda: probe.get("/readyz")[0] == 200)
    progress(f"API server ready ({time.monotonic() - t0:.1f} s)")
    launcher.launch("kube-controller-manager", components.kube_controller_manager(paths))
    launcher.launch("kube-scheduler", components.kube_scheduler(paths))
    path = "/api/v1/namespaces/default/serviceaccounts/default"
    launcher.wait("the controllers (the default ServiceAccount)", lambda: probe.get(path)[0] == 200)
    progress(f"controllers and scheduler running ({time.monotonic() - t0:.1f} s)")
    return server


def _python() -> str:
    import sys

    return sys.executable


def _start_node(
    launcher: _Launcher,
    paths: components.Paths,
    archives: list[Path],
    progress: Callable[[str], None],
) -> None:
    """containerd (with the images imported), the kubelet and kube-proxy."""
    t0 = time.monotonic()
    found = paths.binaries
    node_state = node_directory(paths.directory)
    node_state.mkdir(parents=True, exist_ok=True)
    (paths.directory / "node").symlink_to(node_state, target_is_directory=True)
    runtime = container_runtime.ContainerdPaths(node_state / "containerd")
    container_runtime.write_configuration(runtime, found["runc"], found["cni-bin-dir"])
    launcher.launch("containerd", components.containerd(paths, runtime.config))
    launcher.wait("containerd's socket", runtime.socket.exists)
    container_runtime.import_images(found["ctr"], runtime, archives, launcher.network.command,
                                    progress)  # fmt: skip
    node = node_state / "kubelet"
    node.mkdir(parents=True, exist_ok=True)
    (node / "resolv.conf").write_text("")  # pods of dnsPolicy Default: no way out
    pki = paths.pki
    configuration = kubelet.kubelet_configuration(
        node, pki.ca_cert, pki.kubelet_cert, pki.kubelet_key, runtime.socket,
        cgroup_root(paths.directory),
    )  # fmt: skip
    config = node / "config.yaml"
    config.write_text(yaml.safe_dump(configuration))
    cgroups.make_cgroup(cgroup_root(paths.directory))
    argv = kubelet.kubelet_argv(found["kubelet"], node, config,
                                paths.kubeconfig("node"), {})  # fmt: skip
    launcher.launch("kubelet", argv)
    proxy_config = paths.directory / "kube-proxy.yaml"
    proxy = kubelet.kube_proxy_configuration(paths.kubeconfig("kube-proxy"))
    proxy_config.write_text(yaml.safe_dump(proxy))
    launcher.launch("kube-proxy", components.kube_proxy(paths, proxy_config))
    launcher.launch("file-server", files.server_argv(paths.directory))
    progress(f"node started ({time.monotonic() - t0:.1f} s)")


def _node_ready(cluster: Cluster) -> bool:
    status, body = cluster.get(f"/api/v1/nodes/{kubelet.NODE_NAME}")
    if status != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
    result = subprocess.run(
        [str(cluster.kubectl), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True, text=True, input=stdin, timeout=timeout, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)}: {result.stderr[-2000:]}")
    return result.stdout


def advertise_gpus(cluster: Cluster, gpus: int) -> None:
    """`nvidia.com/gpu` as an extended resource of the node (no device behind it): what
    a device plugin would advertise, so GPU manifests schedule. Allocatable too: the
    scheduler counts that, and the kubelet would copy it over only at its next report."""
    patch = json.dumps([{"op": "add", "path": f"/status/{field}/nvidia.com~1gpu",
                         "value": str(gpus)} for field in ("capacity", "allocatable")])  # fmt: skip
    kubectl(cluster, "patch", "node", kubelet.NODE_NAME, "--subresource=status",
            "--type=json", "-p", patch)  # fmt: skip


def _install_addons(cluster: Cluster, launcher: _Launcher, helper_image: str) -> None:
    objects = addons.coredns_objects() + addons.provisioner_objects(
        cluster.directory / "volumes", helper_image
    )
    (cluster.directory / "volumes").mkdir(exist_ok=True)
    kubectl(cluster, "apply", "--server-side", "--field-manager=kubeinfer-cluster", "-f", "-",
            stdin=yaml.safe_dump_all(objects))  # fmt: skip

    def available(namespace: str, name: str) -> bool:
        status, body = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
        return (
            status == 200 and (json.loads(body).get("status") or {}).get("availableReplicas", 0) > 0
        )

    launcher.wait("CoreDNS", lambda: available("kube-system", "coredns"))
    launcher.wait(
        "the storage provisioner", lambda: available("local-path-storage", "local-path-provisioner")
    )


def up(
    directory: Path,
    kubeconfig: Path | None = None,
    *,
    gpus: int = 0,
    audit: bool = False,
    in_this_namespace: bool = False,
    progress: Callable[[str], None] = binaries.say,
) -> Cluster:
    """Starts the cluster in `directory` (emptied first) and returns once the node is
    Ready with CoreDNS and the storage provisioner running; ClusterError otherwise, after
    stopping whatever had started. `in_this_namespace`: in the caller's own network
    namespace, which it must have made (`netns.enter_new_namespace`); otherwise in one of
    the cluster's own. With `audit`, the API server logs every request's metadata (who,
    verb, resource, response code) to `directory/audit.log`."""
    found, archives = _prepare(directory, progress)
    pki = write_pki(directory / "pki")
    paths = components.Paths(directory, found, pki)
    _write_kubeconfigs(paths)
    environment = components.environment(found, dict(os.environ))
    launcher = _Launcher(directory, netns.NodeNetwork(None), environment)
    socket_path = container_runtime.ContainerdPaths(node_directory(directory) / "containerd").socket
    launcher.extra_state.update(
        cgroup_root=cgroup_root(directory), containerd_socket=str(socket_path)
    )
    try:
        if in_this_namespace:
            netns.check_made_here()
        else:
            holder = launcher.launch(
                "namespace-holder", netns.holder_argv(found["pause"]), inside=False
            )
            launcher.network = netns.NodeNetwork(netns.wait_for_own_namespace(holder.pid))
        netns.set_up_node_network(launcher.network)
        server = _start_control_plane(launcher, paths, audit, progress)
        _start_node(launcher, paths, archives, progress)
        admin = components.kubeconfig_document(
            server, pki.ca_cert, pki.admin_cert, pki.admin_key, ADMIN_USER
        )
        admin_path = directory / "admin.kubeconfig"
        _write_private(admin_path, yaml.safe_dump(admin))
        # Our own kubectl calls read the copy in the directory: the caller's `kubeconfig`
        # is written only once the cluster is up, so a failed `up` leaves none behind.
        cluster = Cluster(directory, server, admin_path, found["kubectl"], pki,
                          launcher.network.namespace_path)  # fmt: skip
        launcher.wait("the node to be Ready", lambda: _node_ready(cluster))
        if gpus:
            advertise_gpus(cluster, gpus)
        _install_addons(cluster, launcher, images.RUNTIME_IMAGE)
        progress("node Ready, CoreDNS and storage running")
        if kubeconfig is not None:
            _write_private(kubeconfig, yaml.safe_dump(admin))
            cluster = replace(cluster, kubeconfig=kubeconfig)
        launcher.extra_state.update(server=server, kubeconfig=str(cluster.kubeconfig))
        launcher.save()
        return cluster
    except BaseException:
        down(directory)
        raise


def down(directory: Path, grace_seconds: float = 15.0) -> list[str]:
    """Stops what `up` started in `directory`: the node's containers and shims first (see
    `teardown`), then the processes in reverse order of start, then the mounts and the
    cgroup; returns what needed SIGKILL or could not be removed."""
    state = directory / STATE_FILE
    if not state.exists():
        return []
    started, extra = processes.read_state(state)
    root = str(extra.get("cgroup_root") or cgroup_root(directory))
    node_state = node_directory(directory)
    socket_path = container_runtime.ContainerdPaths(node_state / "containerd").socket
    kubelet_first = [p for p in started if p.name == "kubelet"]
    problems = processes.stop(kubelet_first, grace_seconds)
    folders = [directory, node_state]
    problems += teardown.tear_down_node(folders, root, socket_path, grace_seconds)
    problems += processes.stop([p for p in started if p.name != "kubelet"], grace_seconds)
    problems += [f"mount {p}" for folder in folders for p in teardown.unmount_all(folder)]
    if not teardown.mounts_under(node_state):
        shutil.rmtree(node_state, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        state.unlink()
    return problems
