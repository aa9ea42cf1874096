"""Where the cluster's binaries come from (`kubeinfer.cluster.binaries`, `node_builds`,
`gobuild`): the versions pinned in the Go modules' go.mod files, the version stamped into
each binary as its upstream's release build stamps it (each binary asked with its own
`--version`), envtest's `KUBEBUILDER_ASSETS` taking precedence for the binaries it holds,
cache folders named by version and sources, one build per folder however many processes
ask at once, and our `pause` doing a pod sandbox's PID 1's work. The binaries come from
the cache, which `make test` fills first (`kubeinfer cluster build`); no test builds one
that is not there (it skips, or fails under CI=true)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kubeinfer.cluster import binaries, debian_packages, gobuild, host_packages, node_builds
from waiting import wait_for


def test_the_versions_are_go_mods() -> None:
    versions = binaries.pinned_versions()
    assert (versions.kubernetes, versions.etcd) == ("v1.36.3", "v3.6.8")
    assert versions.kubernetes_minor == "36"
    flags = binaries.ldflags(versions)
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion=v1.36.3" in flags
        assert f"-X {package}.gitMinor=36" in flags


def test_the_node_modules_pin_one_release_each() -> None:
    assert node_builds.containerd_version() == "v2.4.2"
    assert node_builds.cni_version() == "v1.10.0"
    assert node_builds.coredns_version() == "v1.15.0"
    assert node_builds.local_path_version() == "v0.0.30"
    assert node_builds.kwok_version() == "v0.8.0"
    assert "Version=v2.4.2 " in node_builds.containerd_ldflags("v2.4.2") + " "
    with pytest.raises(gobuild.BuildError, match=r"names no github\.com/containerd"):
        gobuild.required_version(node_builds.CNI_MODULE, node_builds.CONTAINERD_PATH)


def test_prometheus_release_is_read_from_its_module_number() -> None:
    assert binaries.prometheus_release() == "3.16.0"  # the module's v0.316.0
    prometheus = _cached(binaries.ensure_prometheus)
    assert isinstance(prometheus, Path)
    assert "prometheus, version 3.16.0" in _version_output(prometheus, "--version")


def test_a_cache_folder_is_named_by_version_and_sources(tmp_path: Path) -> None:
    module = tmp_path / "kwok"
    shutil.copytree(node_builds.KWOK_MODULE, module)
    before = node_builds.cache_folder("kwok", module, node_builds.kwok_version(module))
    assert before.name.startswith("v0.8.0-")
    (module / "go.mod").write_text((module / "go.mod").read_text() + "// a comment\n")
    after = node_builds.cache_folder("kwok", module, node_builds.kwok_version(module))
    assert after != before and after.parent == before.parent
    (module / "go.mod").write_text((module / "go.mod").read_text().replace("v0.8.0", "v0.7.0"))
    assert node_builds.cache_folder("kwok", module, node_builds.kwok_version(module)).name[:7] == (
        "v0.7.0-"
    )


def _blocked_on_lock(lock: Path) -> bool:
    """Whether some process waits for a flock on `lock` (a `->` line of /proc/locks)."""
    inode = f":{lock.stat().st_ino} "
    return any(
        "->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines()
    )


def test_a_folder_is_built_once_however_many_ask_at_once(tmp_path: Path) -> None:
    cache, calls, release = tmp_path / "cache", [], threading.Event()

    def build(into: Path) -> None:
        calls.append(into)
        release.wait(30)
        for name in ("one", "two"):
            (into / name).write_text("#!/bin/sh\n")
            (into / name).chmod(0o755)

    found: list[dict[str, Path]] = []
    ask = lambda: found.append(gobuild.ensure_built(cache, ("one", "two"), build))  # noqa: E731
    first = threading.Thread(target=ask)
    first.start()
    wait_for(lambda: bool(calls), what="the first build started")
    second = threading.Thread(target=ask)
    second.start()
    wait_for(lambda: _blocked_on_lock(cache / ".lock"), what="the second waited on the lock")
    release.set()
    first.join(30)
    second.join(30)
    assert len(calls) == 1
    assert found == [{"one": cache / "one", "two": cache / "two"}] * 2


def test_a_failed_build_installs_nothing_and_says_where_its_log_is(tmp_path: Path) -> None:
    staging, log = tmp_path / "staging", tmp_path / "build.log"
    staging.mkdir()
    (staging / "one").write_text("")  # "two" is missing: the build left it out
    log.write_text("compiling\nsomething broke\n")
    with pytest.raises(gobuild.BuildError, match="something broke") as raised:
        gobuild.install_built(0, staging, tmp_path, ["one", "two"], "x", log, time.monotonic())
    assert str(log) in str(raised.value)
    assert not (tmp_path / "one").exists() and not staging.exists()


def _cached(ensure: Callable[[], object]) -> object:
    """`ensure()` when the cache holds its binaries and Debian's packages are installed (it
    then only finds them); else skips the test, or fails it under CI=true, where `make
    test` has built and installed them first."""
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(gobuild, "find_go", _refuse_to_build)  # every go_build asks first
            patch.setattr(debian_packages, "install", _refuse_to_install)
            return ensure()
    except gobuild.BuildError as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{error}: CI runs `kubeinfer cluster build` first", pytrace=False)
        pytest.skip(f"{error}: run `kubeinfer cluster build` first")


def _refuse_to_build() -> str:
    raise gobuild.BuildError("not in the cache")


def _refuse_to_install(packages: list[str], *_: object) -> None:
    raise gobuild.BuildError(f"{', '.join(packages)} not installed")


def _version_output(binary: Path, *flags: str) -> str:
    result = subprocess.run([str(binary), *flags], capture_output=True, text=True, timeout=60)
    return result.stdout + result.stderr


def test_the_node_components_report_the_control_planes_release() -> None:
    found = _cached(binaries.ensure_binaries)
    assert isinstance(found, dict)
    for name in ("kubelet", "kube-scheduler", "kube-proxy"):
        assert _version_output(found[name], "--version").strip() == "Kubernetes v1.36.3", name


def test_containerd_reports_its_release_and_has_the_snapshotters_and_cri() -> None:
    found = _cached(node_builds.ensure_containerd)
    assert isinstance(found, dict)
    assert "github.com/containerd/containerd/v2 v2.4.2" in _version_output(
        found["containerd"], "--version"
    )
    assert "v2.4.2" in _version_output(found["ctr"], "--version")
    assert "Version:  v2.4.2" in _version_output(found["containerd-shim-runc-v2"], "-v")
    config = _version_output(found["containerd"], "config", "default")
    for plugin in ("io.containerd.cri.v1.runtime", "io.containerd.snapshotter.v1.overlayfs",
                   "io.containerd.snapshotter.v1.native"):  # fmt: skip
        assert f"[plugins.'{plugin}']" in config, plugin
    for plugin in ("btrfs", "devmapper", "zfs"):
        assert f"snapshotter.v1.{plugin}'" not in config, plugin


def test_the_cni_plugins_report_their_release() -> None:
    folder = _cached(node_builds.ensure_cni_plugins)
    assert isinstance(folder, Path)
    for name in node_builds.CNI_PLUGINS:
        assert f"CNI {name} plugin v1.10.0" in _version_output(folder / name), name


def test_coredns_reports_its_release_and_has_a_cluster_dns_plugins() -> None:
    coredns = _cached(node_builds.ensure_coredns)
    assert isinstance(coredns, Path)
    assert "CoreDNS-1.15.0" in _version_output(coredns, "-version")
    plugins = {line.strip() for line in _version_output(coredns, "-plugins").splitlines()}
    wanted = {"kubernetes", "forward", "cache", "errors", "health", "ready", "loop", "reload",
              "loadbalance", "log", "prometheus"}  # fmt: skip
    assert wanted <= plugins
    assert "etcd" not in plugins  # the reduced set, not core/plugin's whole list


def test_local_path_provisioner_and_kwok_report_their_releases() -> None:
    provisioner = _cached(node_builds.ensure_local_path_provisioner)
    assert isinstance(provisioner, Path)
    assert "v0.0.30" in _version_output(provisioner, "--version")
    kwok = _cached(node_builds.ensure_kwok)
    assert isinstance(kwok, Path)
    assert "v0.8.0" in _version_output(kwok, "--version")


def test_ensure_node_binaries_returns_every_key_and_runc_from_debian() -> None:
    found = _cached(binaries.ensure_node_binaries)
    assert isinstance(found, dict)
    assert tuple(found) == binaries.NODE_BINARIES
    assert found["cni-bin-dir"].is_dir()
    assert all(os.access(path, os.X_OK) for key, path in found.items() if key != "cni-bin-dir")
    assert "runc version" in _version_output(found["runc"], "--version")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_pause_as_pid_1_reaps_orphans_and_stops_on_sigterm() -> None:
    pause = _cached(node_builds.ensure_pause)
    assert isinstance(pause, Path)
    assert node_builds.sources_hash(node_builds.PAUSE_MODULE) in _version_output(pause, "-v")
    sandbox = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", str(pause)],
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: bool(_children(sandbox.pid)), what="pause started")
        (pid,) = _children(sandbox.pid)
        # a shell in pause's namespace leaves a child behind: it is reparented to pause
        subprocess.run(["nsenter", "-t", str(pid), "-p", "sh", "-c", "sleep 1 & exit 0"],
                       check=True)  # fmt: skip
        wait_for(lambda: bool(_children(pid)), what="the orphan was reparented to pause")
        wait_for(lambda: not _children(pid), what="pause reaped the orphan once it exited")
        os.kill(pid, signal.SIGTERM)
        _, stderr = sandbox.communicate(timeout=30)
        assert "Shutting down, got signal: terminated" in stderr
        assert sandbox.returncode == 0
    finally:
        sandbox.kill()
        sandbox.wait()


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, zombies included."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(child) for task in tasks for child in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


@pytest.mark.slow
def test_envtest_assets_are_used_for_the_binaries_they_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = _cached(binaries.ensure_binaries)
    assert isinstance(cached, dict)
    assets = tmp_path / "envtest"
    assets.mkdir()
    for name in ("etcd", "kube-apiserver", "kubectl"):  # what envtest ships
        (assets / name).symlink_to(cached[name])
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    found = binaries.ensure_binaries()
    assert {name: found[name].parent for name in found} == {
        "etcd": assets,
        "kube-apiserver": assets,
        "kubectl": assets,
        "kube-controller-manager": cached["kube-controller-manager"].parent,
        "kubelet": cached["kubelet"].parent,
        "kube-scheduler": cached["kube-scheduler"].parent,
        "kube-proxy": cached["kube-proxy"].parent,
    }
    stamped = subprocess.run([str(found["kubectl"]), "version", "--client"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    assert "Client Version: v1.36.3" in stamped.stdout


def test_missing_debian_programs_are_installed_by_package_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("runc", "iptables"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setattr(debian_packages, "SEARCH_PATH", str(tmp_path))
    asked: list[list[str]] = []
    monkeypatch.setattr(debian_packages, "install", lambda packages, *_: asked.append(packages))
    with pytest.raises(gobuild.BuildError, match="left conntrack, ip missing"):
        host_packages.ensure_node_packages()
    assert asked == [["conntrack", "iproute2"]]
