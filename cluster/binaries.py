"""Every binary `kubeinfer cluster` runs: found, or built from pinned Go modules and cached.

The Go module in `go-modules/control-plane/` (shipped with the package) pins one Kubernetes release
and the etcd release it is tested with; its go.mod is the single source of both versions.
`ensure_binaries` returns `etcd`, `kube-apiserver`, `kube-controller-manager`, `kubectl`,
and the node's `kubelet`, `kube-scheduler` and `kube-proxy`, each from the first of:

1. `KUBEBUILDER_ASSETS` (controller-runtime's envtest variable), where someone already has
   envtest's etcd, kube-apiserver and kubectl (envtest ships the others not, so those are
   still built unless the folder holds them too);
2. the cache, `$XDG_CACHE_HOME/kubeinfer/controlplane/<kubernetes>-etcd-<etcd>-<sources>`,
   keyed by the versions and a hash of the module's sources;
3. a build: `go build` of the missing binaries, with progress on stderr, the version
   stamped into the binaries with -ldflags as Kubernetes' own build does (so `kubectl
   version` and `/version` tell the release). See `gobuild` for the machinery.

`ensure_node_binaries` returns everything a real node runs (`NODE_BINARIES`): those three,
the programs built from modules of their own (`node_builds`: containerd, the CNI plugins,
CoreDNS, local-path-provisioner, KWOK, pause) and runc from Debian (`host_packages`).

Prometheus is built the same way (`ensure_prometheus`), from the module in `prometheus/`:
upstream's, with only Kubernetes service discovery compiled in (its own build tags), because
Debian's package leaves Kubernetes discovery out; `kubeinfer up` and the tests discover
pods through the API server as a cluster's Prometheus does.

So is `helm` (`ensure_helm`), from the Go module in `go-modules/helm-cli/`, which pins one
Helm release apart from the control plane's module, cached under `helm/<release>-<sources>`.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kubeinfer.cluster import host_packages, node_builds
from kubeinfer.cluster.gobuild import (
    BuildError,
    GoBuild,
    cache_root,
    ensure_built,
    find_go,
    go_build,
    required_version,
    say,
    sources_hash,
)

__all__ = [
    "BINARIES", "HELM_MODULE", "MODULE", "NODE_BINARIES", "BuildError", "Versions",
    "cache_directory", "cache_root", "ensure_binaries", "ensure_helm", "ensure_node_binaries",
    "ensure_prometheus", "find_go", "helm_cache_directory", "helm_version", "ldflags",
    "pinned_versions", "say", "sources_hash",
]  # fmt: skip

GO_MODULES = Path(__file__).parent / "go-modules"
"""The Go modules that pin and build every binary, one folder each. Under a folder name
Python cannot import, so setuptools ships them as package data, never as packages."""
MODULE = GO_MODULES / "control-plane"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
NODE_COMPONENTS = ("kubelet", "kube-scheduler", "kube-proxy")
BINARIES = CONTROL_PLANE + NODE_COMPONENTS
"""What `ensure_binaries` returns: everything built from the control plane's module."""


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str

    @property
    def kubernetes_minor(self) -> str:
        return self.kubernetes.lstrip("v").split(".")[1]


def pinned_versions(module: Path = MODULE) -> Versions:
    """The Kubernetes and etcd releases go.mod requires."""
    text = (module / "go.mod").read_text()
    kubernetes = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", text, re.M)
    etcd = re.search(r"^\s*go\.etcd\.io/etcd/server/v3 (v\S+)", text, re.M)
    if not kubernetes or not etcd:
        raise BuildError(f"{module / 'go.mod'} names no k8s.io/kubernetes or etcd server version")
    return Versions(kubernetes.group(1), etcd.group(1))


def cache_directory(module: Path = MODULE) -> Path:
    versions = pinned_versions(module)
    name = f"{versions.kubernetes}-etcd-{versions.etcd}-{sources_hash(module)}"
    return cache_root() / "controlplane" / name


def ldflags(versions: Versions) -> str:
    """What Kubernetes' hack/lib/version.sh stamps, for the server and the client."""
    values = {
        "gitVersion": versions.kubernetes,
        "gitMajor": "1",
        "gitMinor": versions.kubernetes_minor,
        "gitTreeState": "clean",
    }
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{key}={value}" for key, value in values.items()]
    return " ".join(flags)


def build(names: list[str], destination: Path, module: Path = MODULE) -> None:
    """Builds `names` into `destination` with go, showing progress; BuildError if it fails."""
    versions = pinned_versions(module)
    step = GoBuild([f"./cmd/{name}" for name in names], ldflags(versions))
    what = f"{', '.join(names)} (Kubernetes {versions.kubernetes}, etcd {versions.etcd})"
    go_build(module, [step], names, destination, what)


def ensure_binaries(module: Path = MODULE) -> dict[str, Path]:
    """Each of `BINARIES`' paths: from KUBEBUILDER_ASSETS, the cache, or a build (see above)."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    cache = cache_directory(module)
    found: dict[str, Path] = {}
    for name in BINARIES:
        for folder in ([Path(assets)] if assets else []) + [cache]:
            if os.access(folder / name, os.X_OK):
                found[name] = folder / name
                break
    missing = [name for name in BINARIES if name not in found]
    if missing:
        found.update(ensure_built(cache, missing, functools.partial(build, missing, module=module)))
    return {name: found[name] for name in BINARIES}


PROMETHEUS_MODULE = GO_MODULES / "prometheus"
PROMETHEUS_PATH = "github.com/prometheus/prometheus"
PROMETHEUS_BUILD_TAGS = ("remove_all_sd", "enable_kubernetes_sd")
"""Prometheus' own build tags (`plugins/`) for a binary with no discovery but Kubernetes'
(and the static and file kinds, always in): a third of the full build's packages."""


def prometheus_release(module: Path = PROMETHEUS_MODULE) -> str:
    """The release go.mod pins: the Go module numbers Prometheus 3.N.P as v0.3NN.P."""
    version = required_version(module, PROMETHEUS_PATH)
    minor, patch = version.removeprefix("v0.").split(".", 1)
    return f"{int(minor) // 100}.{int(minor) % 100}.{patch}"


def ensure_prometheus(module: Path = PROMETHEUS_MODULE) -> Path:
    """Upstream's prometheus with Kubernetes service discovery only, from the cache or built
    into it from the module in `prometheus/` (once per machine; builds side by side wait
    for one another), stamped as its release build stamps the version."""
    release = prometheus_release(module)
    stamp = f"-s -w -X github.com/prometheus/common/version.Version={release}"
    step = GoBuild([f"{PROMETHEUS_PATH}/cmd/prometheus"], stamp, PROMETHEUS_BUILD_TAGS)
    what = f"Prometheus {release} with Kubernetes service discovery (Debian's has none)"
    build = functools.partial(go_build, module, [step], ["prometheus"], what=what)
    cache = cache_root() / "prometheus" / f"{release}-{sources_hash(module)}"
    return ensure_built(cache, ["prometheus"], build)["prometheus"]


HELM_MODULE = GO_MODULES / "helm-cli"
HELM_PACKAGE = "helm.sh/helm/v4/cmd/helm"
"""Helm's own main package, named by go.mod's `tool` directive: built as it is, nothing
of ours compiled in."""


def helm_version(module: Path = HELM_MODULE) -> str:
    """The Helm release go.mod requires."""
    return required_version(module, "helm.sh/helm/v4")


def helm_ldflags(version: str) -> str:
    """What Helm's Makefile stamps, so `helm version` tells the release (and charts'
    `kubeVersion`/`.Capabilities.HelmVersion` see it)."""
    package = "helm.sh/helm/v4/internal/version"
    return f"-s -w -X {package}.version={version} -X {package}.gitTreeState=clean"


def helm_cache_directory(module: Path = HELM_MODULE) -> Path:
    return cache_root() / "helm" / f"{helm_version(module)}-{sources_hash(module)}"


def ensure_helm(module: Path = HELM_MODULE) -> Path:
    """`helm`, from the cache or built into it from its Go module (once per machine;
    builds side by side wait for one another). Its own module: Helm requires newer
    k8s.io modules than the control plane's release, which must keep its pins."""
    version = helm_version(module)
    step = GoBuild([HELM_PACKAGE], helm_ldflags(version))
    build = functools.partial(go_build, module, [step], ["helm"], what=f"Helm {version}")
    return ensure_built(helm_cache_directory(module), ["helm"], build)["helm"]


NODE_BINARIES = (
    *NODE_COMPONENTS,
    *node_builds.CONTAINERD,
    "runc",
    "coredns",
    "local-path-provisioner",
    "pause",
    "cni-bin-dir",
)
"""The keys of `ensure_node_binaries`: each an executable, except `cni-bin-dir`, the folder
holding the CNI plugins (bridge, host-local, loopback, portmap) as containerd's CRI plugin
wants its `bin_dir`."""


def ensure_node_binaries() -> dict[str, Path]:
    """What a real node runs, keyed as `NODE_BINARIES`: kubelet, kube-scheduler and
    kube-proxy from the control plane's module (`ensure_binaries`), the others from their
    own modules (`node_builds`), runc and the node's userland from Debian
    (`host_packages.ensure_node_packages`); each from the cache or built into it."""
    control_plane = ensure_binaries()
    found: dict[str, Path] = {name: control_plane[name] for name in NODE_COMPONENTS}
    found["runc"] = host_packages.ensure_node_packages()["runc"]
    found.update(node_builds.ensure_containerd())
    found["cni-bin-dir"] = node_builds.ensure_cni_plugins()
    found["coredns"] = node_builds.ensure_coredns()
    found["local-path-provisioner"] = node_builds.ensure_local_path_provisioner()
    found["pause"] = node_builds.ensure_pause()
    return {name: found[name] for name in NODE_BINARIES}
