"""The node's programs that come from Go modules of their own (the kubelet, kube-scheduler
and kube-proxy come from the control plane's; see `binaries`): containerd with its runc
shim and ctr, the CNI reference plugins, CoreDNS, local-path-provisioner, KWOK's
controller, and our `pause`. Each module folder beside this file pins one upstream release
in its go.mod (the single source of that version), so that each program's dependencies
stay those it is released with. Each is cached under `$XDG_CACHE_HOME/kubeinfer/<name>/
<release>-<sources hash>` and stamped with -ldflags as its upstream's release build stamps
it, so `--version` tells the release (see `gobuild` for the rest).
"""

from __future__ import annotations

import functools
from pathlib import Path

from kubeinfer.cluster.gobuild import (
    GoBuild,
    cache_root,
    ensure_built,
    go_build,
    required_version,
    sources_hash,
)

HERE = Path(__file__).parent / "go-modules"
CONTAINERD_MODULE = HERE / "containerd"
CNI_MODULE = HERE / "cni-plugins"
COREDNS_MODULE = HERE / "coredns"
LOCAL_PATH_MODULE = HERE / "local-path-provisioner"
KWOK_MODULE = HERE / "kwok"
PAUSE_MODULE = HERE / "pause"

CONTAINERD = ("containerd", "containerd-shim-runc-v2", "ctr")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")

CONTAINERD_PATH = "github.com/containerd/containerd/v2"
CONTAINERD_TAGS = ("urfave_cli_no_docs", "no_btrfs", "no_devmapper", "no_zfs")
"""Containerd's Makefile tags, less the snapshotters that need cgo or a kernel setup the
node lacks; overlayfs and native stay, and the CRI plugin (tag `no_cri` absent) is in."""
CNI_PATH = "github.com/containernetworking/plugins"
COREDNS_PATH = "github.com/coredns/coredns"
LOCAL_PATH_PATH = "github.com/rancher/local-path-provisioner"
KWOK_PATH = "sigs.k8s.io/kwok"


def cache_folder(name: str, module: Path, version: str) -> Path:
    return cache_root() / name / f"{version}-{sources_hash(module)}"


def _ensure(name: str, module: Path, version: str, steps: list[GoBuild],
            names: tuple[str, ...], what: str) -> dict[str, Path]:  # fmt: skip
    build = functools.partial(go_build, module, steps, names, what=what)
    return ensure_built(cache_folder(name, module, version), names, build)


def containerd_version(module: Path = CONTAINERD_MODULE) -> str:
    return required_version(module, CONTAINERD_PATH)


def containerd_ldflags(version: str) -> str:
    """containerd's Makefile's GO_LDFLAGS (no git here to name the revision)."""
    package = f"{CONTAINERD_PATH}/version"
    return f"-s -w -X {package}.Version={version} -X {package}.Package={CONTAINERD_PATH}"


def ensure_containerd(module: Path = CONTAINERD_MODULE) -> dict[str, Path]:
    """containerd, containerd-shim-runc-v2 and ctr, keyed by name. The shim is built
    apart, as containerd's Makefile builds it, with `no_grpc` (it speaks only ttrpc)."""
    version = containerd_version(module)
    flags = containerd_ldflags(version)
    steps = [
        GoBuild([f"{CONTAINERD_PATH}/cmd/containerd", f"{CONTAINERD_PATH}/cmd/ctr"],
                flags, CONTAINERD_TAGS),
        GoBuild([f"{CONTAINERD_PATH}/cmd/containerd-shim-runc-v2"], flags,
                (*CONTAINERD_TAGS, "no_grpc")),
    ]  # fmt: skip
    return _ensure("containerd", module, version, steps, CONTAINERD, f"containerd {version}")


def cni_version(module: Path = CNI_MODULE) -> str:
    return required_version(module, CNI_PATH)


def ensure_cni_plugins(module: Path = CNI_MODULE) -> Path:
    """The folder holding the CNI plugins `CNI_PLUGINS` (the CNI bin dir)."""
    version = cni_version(module)
    stamp = f"-s -w -X {CNI_PATH}/pkg/utils/buildversion.BuildVersion={version}"
    folders = ("ipam/host-local", "main/bridge", "main/loopback", "meta/portmap")
    packages = [f"{CNI_PATH}/plugins/{folder}" for folder in folders]
    found = _ensure("cni-plugins", module, version, [GoBuild(packages, stamp)], CNI_PLUGINS,
                    f"the CNI plugins {version}")  # fmt: skip
    return found["bridge"].parent


def coredns_version(module: Path = COREDNS_MODULE) -> str:
    return required_version(module, COREDNS_PATH)


def ensure_coredns(module: Path = COREDNS_MODULE) -> Path:
    """CoreDNS with a cluster DNS's plugins (`coredns/cmd/coredns/main.go` says which).
    Its release is a constant in its sources; the Makefile stamps only the commit, which
    is the release here."""
    version = coredns_version(module)
    stamp = f"-s -w -X {COREDNS_PATH}/coremain.GitCommit={version}"
    steps = [GoBuild(["./cmd/coredns"], stamp)]
    return _ensure("coredns", module, version, steps, ("coredns",), f"CoreDNS {version}")["coredns"]


def local_path_version(module: Path = LOCAL_PATH_MODULE) -> str:
    return required_version(module, LOCAL_PATH_PATH)


def ensure_local_path_provisioner(module: Path = LOCAL_PATH_MODULE) -> Path:
    """local-path-provisioner, stamped as its scripts/build stamps it."""
    version = local_path_version(module)
    steps = [GoBuild([LOCAL_PATH_PATH], f"-s -w -X main.VERSION={version}")]
    name = "local-path-provisioner"
    return _ensure(name, module, version, steps, (name,), f"{name} {version}")[name]


def kwok_version(module: Path = KWOK_MODULE) -> str:
    return required_version(module, KWOK_PATH)


def ensure_kwok(module: Path = KWOK_MODULE) -> Path:
    """KWOK's controller, stamped as its hack/releases.sh stamps it."""
    version = kwok_version(module)
    steps = [
        GoBuild([f"{KWOK_PATH}/cmd/kwok"], f"-s -w -X {KWOK_PATH}/pkg/consts.Version={version}")
    ]
    return _ensure("kwok", module, version, steps, ("kwok",), f"KWOK {version}")["kwok"]


def ensure_pause(module: Path = PAUSE_MODULE) -> Path:
    """Our pause (`pause/main.go`), its version the hash of its sources."""
    version = sources_hash(module)
    steps = [GoBuild(["."], f"-s -w -X main.version={version}")]
    folder = cache_root() / "pause" / version
    build = functools.partial(go_build, module, steps, ("pause",), what="pause")
    return ensure_built(folder, ("pause",), build)["pause"]
