"""Fixtures of the operator scenarios: `world`, a namespace of the session's real cluster
with the operator's ServiceAccount and Role in it (see `operator_harness`), `tiny`, a real
ONNX model pods can read, and kopf's logs kept to warnings."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import LocalCluster
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from operator_harness import SCENARIOS_RUN, Model, World, grant_operator_role, revoke_node_role


@pytest.fixture
def world(local_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[World]:
    prefix = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().removeprefix("test_"))
    namespace = local_cluster.new_namespace(prefix)
    world = World(local_cluster, local_cluster.admin(namespace))
    grant_operator_role(world)
    SCENARIOS_RUN[request.node.name] = namespace
    yield world
    # The namespace controller deletes what is left; the node stops its pods meanwhile.
    local_cluster.admin().delete("v1", "namespaces", namespace, namespace=None)
    revoke_node_role(world)


@pytest.fixture(scope="session")
def tiny(model_directory: Path) -> Model:
    """A small fp32 MLP ([batch,16] → [batch,10]), built once per session."""
    return Model(build_tiny_mlp(model_directory / "tiny.onnx"))


@pytest.fixture(autouse=True)
def _quiet_kopf(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kopf")
