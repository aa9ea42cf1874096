"""The `helm` the chart's tests run: Helm's own main package at the release its Go module
pins (`cluster/go-modules/helm-cli/go.mod`), built by `kubeinfer cluster build` beside the control
plane and stamped with that release as Helm's own build stamps it. Its module is apart
from the control plane's, whose Kubernetes pins it must not move."""

from __future__ import annotations

import re

from helm_harness import Helm
from kubeinfer.cluster import binaries


def test_helm_is_the_release_its_module_pins(helm: Helm) -> None:
    assert binaries.helm_version() == "v4.3.1"
    shown = helm.run("version", "--template", "{{ .Version }} {{ .GitTreeState }}").stdout
    assert shown == "v4.3.1 clean"
    assert helm.binary.parent == binaries.helm_cache_directory()


def test_helms_module_leaves_the_control_planes_pins_alone() -> None:
    control_plane = (binaries.MODULE / "go.mod").read_text()
    assert "helm.sh" not in control_plane
    assert re.search(r"^\s*k8s\.io/client-go v0\.36\.3$", control_plane, re.M)
    helm_module = (binaries.HELM_MODULE / "go.mod").read_text()
    assert re.search(r"^tool helm\.sh/helm/v4/cmd/helm$", helm_module, re.M)
