"""prometheus-operator's own CRDs (PodMonitor, PrometheusRule, …), for the test cluster.

They come from the prometheus-operator Go module at a pinned release, which `make test`
fetches through the Go module proxy before the tests (`registry_prefetch`), so the API
server validates what the operator writes against the very schema a cluster with
prometheus-operator serves. `installed_crd` applies one for the duration of a block and
removes it after, since the operator's behaviour depends on whether the API exists.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from registry_prefetch import (
    PROMETHEUS_OPERATOR_MODULE,
    PROMETHEUS_OPERATOR_VERSION,
    MissingDownload,
    go_module_directory,
)
from waiting import wait_for


@cache
def crd_directory() -> Path:
    """The CRDs' folder in the Go module cache, where `make test`'s prefetch put the module
    (`registry_prefetch`); the test fails, naming the prefetch, when it is not there (tests
    run with GOPROXY=off)."""
    if shutil.which("go") is None:
        message = "needs Go to read prometheus-operator's CRDs from the Go module cache"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        module = go_module_directory(PROMETHEUS_OPERATOR_MODULE, PROMETHEUS_OPERATOR_VERSION)
    except MissingDownload as missing:
        pytest.fail(str(missing), pytrace=False)
    return module / "example" / "prometheus-operator-crd"


def crd_file(plural: str) -> Path:
    return crd_directory() / f"monitoring.coreos.com_{plural}.yaml"


@contextlib.contextmanager
def installed_crd(cluster, plural: str) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """The CRD of `plural` applied to the cluster (Established) until the block ends."""
    path = crd_file(plural)
    cluster.kubectl("apply", "--server-side", "-f", str(path))
    name = f"{plural}.monitoring.coreos.com"
    from cluster_harness import established

    # Not `kubectl wait`: it gives up on a CRD that has no condition yet.
    wait_for(lambda: established(cluster, name), 60, f"{name} to be Established", every=0.1)
    try:
        yield
    finally:
        cluster.kubectl("delete", f"crd/{name}", "--wait=true", "--timeout=60s")
