"""prometheus-operator's own CRDs (PodMonitor, PrometheusRule, …), for the test cluster.

They come from the prometheus-operator Go module at a pinned release, fetched through the
Go module proxy by `go mod download` (cached in the module cache like any module), so the
API server validates what the operator writes against the very schema a cluster with
prometheus-operator serves. `installed_crd` applies one for the duration of a block and
removes it after, since the operator's behaviour depends on whether the API exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

MODULE = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.90.1"


@cache
def crd_directory() -> Path:
    go = shutil.which("go")
    if go is None:
        message = "needs Go to fetch prometheus-operator's CRDs from the module proxy"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if result.returncode != 0:
        pytest.fail(f"go mod download {MODULE}@{VERSION} failed: {result.stdout}{result.stderr}")
    return Path(json.loads(result.stdout)["Dir"]) / "example" / "prometheus-operator-crd"


def crd_file(plural: str) -> Path:
    return crd_directory() / f"monitoring.coreos.com_{plural}.yaml"


@contextlib.contextmanager
def installed_crd(cluster, plural: str) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """The CRD of `plural` applied to the cluster (Established) until the block ends."""
    path = crd_file(plural)
    cluster.kubectl("apply", "--server-side", "-f", str(path))
    name = f"{plural}.monitoring.coreos.com"
    from cluster_harness import established

    deadline = time.monotonic() + 60
    while not established(cluster, name):  # `kubectl wait` gives up before any condition
        assert time.monotonic() < deadline, f"{name} was not Established within 60 s"
        time.sleep(0.1)
    try:
        yield
    finally:
        cluster.kubectl("delete", f"crd/{name}", "--wait=true", "--timeout=60s")
