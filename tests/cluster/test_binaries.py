"""Where the control plane's binaries come from (`kubeinfer.cluster.binaries`): the
versions pinned in the Go module's go.mod, the version stamped into the binaries as
Kubernetes' own build stamps it, and envtest's `KUBEBUILDER_ASSETS` taking precedence for
the binaries it holds, the others coming from the cache (envtest ships no controller
manager). The binaries already in the cache stand in for an envtest folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from kubeinfer.cluster import binaries


def test_the_versions_are_go_mods() -> None:
    versions = binaries.pinned_versions()
    assert (versions.kubernetes, versions.etcd) == ("v1.36.3", "v3.6.8")
    assert versions.kubernetes_minor == "36"
    flags = binaries.ldflags(versions)
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion=v1.36.3" in flags
        assert f"-X {package}.gitMinor=36" in flags


@pytest.mark.slow
def test_envtest_assets_are_used_for_the_binaries_they_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = binaries.ensure_binaries()  # built once per machine (make test does it first)
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
    }
    stamped = subprocess.run([str(found["kubectl"]), "version", "--client"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    assert "Client Version: v1.36.3" in stamped.stdout
