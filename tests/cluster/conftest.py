"""Fixtures of the control plane's and the real node's tests: `kube`, a namespace of its
own on the session's real cluster (deleted after the test: the namespace controller
deletes its pods, and the kubelet stops their containers)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from cluster_harness import Kube, LocalCluster


@pytest.fixture
def kube(local_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Kube]:
    prefix = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().removeprefix("test_"))
    namespace = local_cluster.new_namespace(prefix)
    yield local_cluster.admin(namespace)
    local_cluster.admin().delete("v1", "namespaces", namespace, namespace=None)
